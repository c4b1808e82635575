"""Accuracy of the performance model on NVIDIA's published mixture-of-experts rows; prints figures, asserts nothing.

    PYTHONPATH=. python bench/model_moe.py          # every row, fitted and held out: error, fit in memory, MAPE,
                                                   # Spearman per (model, GPU) group of 3+ layouts
    PYTHONPATH=. python bench/model_moe.py --fit    # refit the MoE parameters (dse.perfmodel.timing MOE_FITTED) on
                                                   # the rows marked ``fit`` and print them

Data: ``bench/data/published_moe.tsv``: Megatron-Bridge's performance summaries (docs/performance-summary-archive.md)
for DeepSeek-V3, GPT-OSS 120B, Qwen3 30B-A3B and 235B-A22B, containers 26.02, 26.02.01 and 26.04 (one software
generation: 26.06 brought fused CuTe DSL expert MLPs and full-iteration CUDA graphs, which the model does not
price), each with its preset's recompute modules and CUDA graphs; and NeMo 2's Mixtral 8x7B and 8x22B rows on
B200 and GB200 (NeMo framework performance summary, containers 25.02 and 25.04), all held out. The 26.04 rows are
fitted (``split`` = fit), the 26.02 and 26.02.01 rows held out; a held-out row whose
layout is also a fitted row's (another container's measurement of it) is marked ``=fit`` and left out of one MAPE
figure, since it tests container drift rather than generalisation. NVIDIA force-balances the router in these
runs and drops no token, so ``Params.moe_imbalance`` stays 1. Tokens/s/GPU is compared (convention-free).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dse.constraints import check  # noqa: E402
from dse.perfmodel import DEFAULT_PARAMS, predict  # noqa: E402
from dse.perfmodel.stack import published_stack_name  # noqa: E402
from dse.perfmodel.timing import MOE_FITTED, Params  # noqa: E402
from dse.perfmodel.trials import make_trial  # noqa: E402
from dse.recipes.models import RECIPES  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "published_moe.tsv"
LAYOUT = ("model", "gpu", "num_gpus", "precision", "fp8_recipe", "gbs", "mbs", "tp", "pp", "vp", "ep")
# priors of the fitted MoE parameters: (low, high)
BOUNDS = {
    "moe_gemm_m_half": (16.0, 2048.0),
    "moe_a2a_eff": (0.2, 1.0),
    "moe_a2a_nic_eff": (0.3, 1.0),
    "moe_flex_speedup": (0.5, 3.0),
    "moe_a2a_overlap": (0.0, 0.95),
    "moe_layer_overhead_s": (0.0, 5e-3),
}


def load_rows(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def row_trial(row: dict):
    """The trial of one published row: its layout, NVIDIA's MoE options, TE's loss, and its preset's recompute
    modules and CUDA graphs (the ``recompute``, ``recompute_modules``, ``cuda_graph`` and ``cuda_graph_scope``
    columns; the older ``cuda_graphs`` flag is no longer read)."""
    tp = int(row["tp"])
    knobs = dict(
        tp=tp,
        pp=int(row["pp"]),
        cp=int(row["cp"]),
        vp=int(row["vp"]),
        mbs=int(row["mbs"]),
        gbs=int(row["gbs"]),
        seq_length=int(row["seq_length"]),
        precision=row["precision"],
        tp_comm_overlap=tp > 1,
        ep=int(row["ep"]),
        etp=int(row["etp"]),
        # the row's container preset's dispatcher and overlap where one matches its layout, else the older columns
        moe_dispatcher=row.get("moe_dispatcher_preset") or row["moe_dispatcher"],
        moe_a2a_overlap=(row.get("moe_a2a_overlap_preset") or row["moe_a2a_overlap"]) == "1",
        moe_permute_fusion=True,
        moe_grouped_gemm=True,
        pp_first_layers=int(row["pp_first_layers"]),
        pp_last_layers=int(row["pp_last_layers"]),
        recompute=row["recompute"],
        cuda_graph=row["cuda_graph"],
        cuda_graph_scope=row["cuda_graph_scope"],
    )
    if row["recompute_modules"]:
        knobs["recompute_modules"] = row["recompute_modules"]
    if row["fp8_recipe"]:
        knobs["fp8_recipe"] = row["fp8_recipe"]
    payload = published_stack_name(row.get("cross_entropy") or "te")
    trial = make_trial(RECIPES[row["model"]], row["gpu"], int(row["num_gpus"]), payload=payload, **knobs)
    broken = check(trial)
    if broken and broken.rule == "tp_comm_overlap_supported":
        # no userbuffer config ships for this (GPU, hidden, tp, precision): the script ran without TP overlap
        knobs["tp_comm_overlap"] = False
        trial = make_trial(RECIPES[row["model"]], row["gpu"], int(row["num_gpus"]), payload=payload, **knobs)
    return trial


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (no ties expected among published throughputs)."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    return 1.0 - 6.0 * sum((a - b) ** 2 for a, b in zip(rx, ry)) / (n * (n * n - 1))


def fit(rows: list[dict], params: Params = DEFAULT_PARAMS) -> Params:
    """Least squares in log tokens/s over the ``fit`` rows, within :data:`BOUNDS` (SciPy)."""
    from scipy.optimize import least_squares

    trials = [(row_trial(r), float(r["tokens_per_s_per_gpu"])) for r in rows if r["split"] == "fit"]
    names = list(MOE_FITTED)
    lo = [BOUNDS[n][0] for n in names]
    hi = [BOUNDS[n][1] for n in names]
    scale = [max(abs(getattr(params, n)), 1e-4) for n in names]

    def residuals(x):
        p = params.with_values(**{n: v * s for n, v, s in zip(names, x, scale)})
        return [math.log(predict(t, params=p).tokens_per_s_per_gpu / y) for t, y in trials]

    x0 = [getattr(params, n) / s for n, s in zip(names, scale)]
    res = least_squares(residuals, x0, bounds=([a / s for a, s in zip(lo, scale)], [b / s for b, s in zip(hi, scale)]))
    return params.with_values(**{n: v * s for n, v, s in zip(names, res.x, scale)})


def report(rows: list[dict], params: Params) -> None:
    fitted_layouts = {tuple(r[k] for k in LAYOUT) for r in rows if r["split"] == "fit"}
    errs: dict[str, list[float]] = defaultdict(list)
    groups: dict[tuple[str, str], dict[tuple, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    held: list[tuple[float, float]] = []
    print(f"{'row':58s} {'split':9s} {'published':>9s} {'model':>8s} {'error':>7s} {'peak GiB':>8s} fits")
    for r in rows:
        trial = row_trial(r)
        pred = predict(trial, params=params)
        pub = float(r["tokens_per_s_per_gpu"])
        err = pred.tokens_per_s_per_gpu / pub - 1.0
        same = r["split"] == "heldout" and tuple(r[k] for k in LAYOUT) in fitted_layouts
        split = r["split"] + ("=fit" if same else "")
        broken = check(trial)
        note = f"  rejected: {broken.reason}" if broken else ""
        print(
            f"{r['id']:58s} {split:9s} {pub:9.0f} {pred.tokens_per_s_per_gpu:8.0f} {100 * err:+6.1f}% "
            f"{pred.peak_memory_gib:8.1f} {'yes' if pred.fits else 'NO'}{note}"
        )
        errs[r["split"]].append(abs(err))
        if r["split"] == "heldout" and not same:
            errs["heldout, new layouts"].append(abs(err))
        if r["split"] == "heldout":
            bridge = not r["container"].startswith("nemo")
            errs["heldout, Megatron-Bridge rows" if bridge else "heldout, NeMo 2 Mixtral rows"].append(abs(err))
        errs["fits"].append(1.0 if pred.fits else 0.0)
        groups[(r["model"], r["gpu"])][tuple(r[k] for k in LAYOUT)].append((pub, pred.tokens_per_s_per_gpu))
        if r["split"] == "heldout":
            held.append((pub, pred.tokens_per_s_per_gpu))
    print()
    for name in (
        "fit",
        "heldout",
        "heldout, new layouts",
        "heldout, Megatron-Bridge rows",
        "heldout, NeMo 2 Mixtral rows",
    ):
        e = errs[name]
        if e:
            print(f"MAPE {name}: {100 * sum(e) / len(e):.1f}% over {len(e)} rows (max {100 * max(e):.1f}%)")
    print(f"published layouts predicted to fit: {int(sum(errs['fits']))} of {len(errs['fits'])}")
    # a layout measured in several containers counts once, at its mean published figure
    print("Spearman within (model, GPU) groups of 3+ distinct layouts:")
    shown = 0
    for key, layouts in sorted(groups.items()):
        if len(layouts) >= 3:
            pts = [(sum(p for p, _ in v) / len(v), v[0][1]) for v in layouts.values()]
            print(f"  {key[0]:16s} {key[1]:6s} n={len(pts):2d}  rho={spearman(*map(list, zip(*pts))):+.2f}")
            shown += 1
    sizes = sorted(len(v) for v in groups.values())
    if not shown:
        print(f"  none: the {len(groups)} (model, GPU) groups hold {min(sizes)}-{max(sizes)} distinct layouts")
    print(f"Spearman over all held-out rows: {spearman(*map(list, zip(*held))):+.2f} ({len(held)} rows)")


def memory_report(rows: list[dict], params: Params) -> None:
    """Memory per GPU of the rows' distinct layouts against Megatron-Bridge's theoretical memory estimator, the one
    that shards the experts over expert parallelism (bench/moe_memory.py, which prints the same with the shipped
    spaces' defaults and ``--terms``). Megatron-LM's ``report_theoretical_memory`` divides nothing by expert
    parallelism (Megatron-LM issue 1784), so it is no reference for a MoE layout and is no longer printed here."""
    from bench.moe_memory import compare, layouts

    print("\nmemory per GPU: dse vs Megatron-Bridge's theoretical memory estimator (bench/moe_memory.py):")
    compare(layouts(rows, spaces=False), params)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the MoE parameters on the fit rows and print them")
    args = ap.parse_args(argv)
    rows = load_rows()
    params = DEFAULT_PARAMS
    if args.fit:
        params = fit(rows)
        for n in MOE_FITTED:
            print(f"{n} = {getattr(params, n):.4g}")
        print()
    report(rows, params)
    memory_report(rows, params)


if __name__ == "__main__":
    main()
