"""Fit the NVFP4 GEMM efficiency (``timing.Params.gemm_eff_nvfp4``) alone, every other parameter at its shipped
value, on the NVFP4 rows of ``bench/data/published_perf_heldout.tsv`` listed in :data:`FIT_ROWS`; prints the
value and the error of every NVFP4 row under it (the rows not in :data:`FIT_ROWS` are held out). Asserts nothing.

    PYTHONPATH=. python bench/fit_nvfp4.py

One parameter fitted alone, the check that the one GEMM-bound row says what the joint refit says; the shipped value
comes from the joint refit (``bench/model_accuracy.py --fit``), whose rows include every NVFP4 row of containers 26.02
and 26.04 (its FIT_CONTAINERS).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import model_accuracy, model_heldout  # noqa: E402
from dse.perfmodel import DEFAULT_PARAMS, predict  # noqa: E402
from dse.perfmodel.fit import fit  # noqa: E402

# Megatron-Bridge 26.04, GB300, Llama 3 70B (7,397 tokens/s/GPU): its layers (tp 1) are long enough for the GEMMs to
# set its time. Every other NVFP4 row (other containers, the 405B rows, all GB200 rows) is held out: at tp 4 on a Grace
# host without CUDA graphs the model's host time per layer (Params.host_layer_s_grace) sets the 405B rows' time, so
# they could not inform a GEMM rate.
FIT_ROWS = ("mb2604_gb300_llama3_70b_nvfp4",)


def main() -> None:
    rows = [r for r in model_heldout.load_rows() if r["precision"] == "nvfp4"]
    train = [(model_heldout.row_trial(r), float(r["tokens_per_s_per_gpu"])) for r in rows if r["id"] in FIT_ROWS]
    params = fit(model_accuracy.tokens, train, names=("gemm_eff_nvfp4",))
    print(f"gemm_eff_nvfp4 = {params.gemm_eff_nvfp4:.4g}  (shipped {DEFAULT_PARAMS.gemm_eff_nvfp4})")
    for name, p in (("shipped", DEFAULT_PARAMS), ("fitted", params)):
        errs, held = [], []
        for r in rows:
            e = (
                predict(model_heldout.row_trial(r), params=p).tokens_per_s_per_gpu / float(r["tokens_per_s_per_gpu"])
                - 1
            )
            errs.append(e)
            if r["id"] not in FIT_ROWS:
                held.append(e)
        print(
            f"{name:8s} NVFP4 MAPE {model_heldout.mape(errs):.1f}% ({len(errs)} rows), held out "
            f"{model_heldout.mape(held):.1f}% ({len(held)} rows), mean signed {100 * sum(errs) / len(errs):+.1f}%"
        )


if __name__ == "__main__":
    main()
