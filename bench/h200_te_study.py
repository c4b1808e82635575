"""The first H200 studies on the Transformer Engine stack, against the performance model.

    python bench/h200_te_study.py

Reads the two studies `dse run --backend local` wrote on the device machine (bench/h200_te_study.sh;
bench/data/h200_te_8b_4l_study: llama3_8b_4l, mbs x recompute x precision x attention backend, 24 points;
bench/data/h200_te_70b_4l_study: llama3_70b_4l at sequence 8192, mbs x recompute, 6 points at the memory
border) and predicts each point with dse.perfmodel.predict for the same space point (the space file's own
settings). Prints per point measured vs predicted step time, TFLOP/s/GPU and peak memory (peak allocated,
what Megatron's memory line reports), the MAPEs, Spearman, the out-of-memory classification, and what the
pairs imply: FP8 vs bf16 (the FP8 GEMM efficiency check) and fused vs unfused attention. Needs no torch.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STUDIES = {  # study directory -> its space file
    "h200_te_8b_4l_study": "conf/spaces/llama3_8b_4l_h200_te_space.toml",
    "h200_te_70b_4l_study": "conf/spaces/llama3_70b_4l_h200_te_space.toml",
}
# The spaces' payload is recipes.mcore, and the model knows what its code does beyond the knobs
# (dse.perfmodel.stack: Megatron's native loss, bf16 weights with TE's FP8 weight cache, fp32 gradients). The
# measured figure is PyTorch's peak allocation, which leaves out what the model counts outside PyTorch's allocator
# (its memory_reserve_gib and recipes.mcore's measured extra: CUDA context, NCCL): both comparisons are printed.
RESERVE = 8.9  # GiB: dse.perfmodel.stack.MCORE_OUTSIDE_ALLOCATOR_GIB (checked in compare)
BF16_CEILING = 790.0  # TFLOP/s: an 8192^3 bf16 matmul through PyTorch on this H200 (device KINDS.md)


def rows(study: str) -> list[dict]:
    with open(ROOT / "bench" / "data" / study / "leaderboard.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def point(space, row: dict) -> dict:
    """The space point of a leaderboard row (its varied knobs, typed as the space lists them)."""
    out = {}
    for name, values in space.knobs.items():
        out[name] = next(v for v in values if str(v) == row[name])
    return out


def compare(study: str) -> list[dict]:
    from dse.perfmodel import predict
    from dse.perfmodel.model import prepare
    from dse.perfmodel.stack import MCORE_OUTSIDE_ALLOCATOR_GIB
    from dse.perfmodel.timing import DEFAULT_PARAMS
    from dse.rules.space import load_space
    from dse.rules.trial import resolve

    space = load_space(ROOT / STUDIES[study])
    assert MCORE_OUTSIDE_ALLOCATOR_GIB == RESERVE
    out = []
    for row in rows(study):
        p = point(space, row)
        trial = resolve(space, p)
        pred = predict(trial)
        ok = row["status"] == "ok"
        out.append(
            {
                "trial": int(row["trial"]),
                "point": p,
                "status": row["status"],
                "step_ms": float(row["step_time_s"]) * 1e3 if ok else None,
                "tflops": float(row["tflops_per_gpu"]) if ok else None,
                "mem": float(row["peak_memory_gib"]) if ok else None,
                "pred_step_ms": pred.step_time_s * 1e3,
                "pred_tflops": pred.tflops_per_gpu,
                "pred_mem": pred.peak_memory_gib,
                "pred_oom": not pred.fits,
                "hbm": pred.gpu_memory_gib,
                "alloc": pred.peak_memory_gib - prepare(trial).memory.outside_gib(DEFAULT_PARAMS),
            }
        )
    return out


def _err(pred, meas):
    return f"{(pred - meas) / meas * 100:+6.1f}%" if meas else "      -"


def show(study: str, out: list[dict]) -> None:
    import pandas as pd  # Spearman's rank correlation (pandas is a dependency; scipy is not)

    print(f"\n{study} ({STUDIES[study]})")
    keys = list(out[0]["point"])
    head = (
        f"{'trial':>5} {' '.join(f'{k[:10]:>10}' for k in keys)} {'status':>6} | {'step ms':>7} {'model':>7} "
        f"{'err':>7} | {'TF/s':>6} {'model':>6} | {'mem GiB':>7} {'model':>6} {'err':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in sorted(out, key=lambda r: r["trial"]):
        vals = " ".join(f"{str(r['point'][k])[:10]:>10}" for k in keys)
        if r["status"] == "ok":
            print(
                f"{r['trial']:5d} {vals} {r['status']:>6} | {r['step_ms']:7.1f} {r['pred_step_ms']:7.1f} "
                f"{_err(r['pred_step_ms'], r['step_ms'])} | {r['tflops']:6.1f} {r['pred_tflops']:6.1f} | "
                f"{r['mem']:7.2f} {r['pred_mem']:6.2f} {_err(r['pred_mem'], r['mem'])}"
            )
        else:
            print(
                f"{r['trial']:5d} {vals} {r['status']:>6} | {'-':>7} {r['pred_step_ms']:7.1f} {'':7} | {'-':>6} "
                f"{r['pred_tflops']:6.1f} | {'-':>7} {r['pred_mem']:6.2f} (of {r['hbm']:.0f}: "
                f"{'OOM' if r['pred_oom'] else 'fits'})"
            )
    ok = [r for r in out if r["status"] == "ok"]
    st = statistics.fmean(abs(r["pred_step_ms"] - r["step_ms"]) / r["step_ms"] for r in ok)
    mem = statistics.fmean(abs(r["pred_mem"] - r["mem"]) / r["mem"] for r in ok)
    df = pd.DataFrame(ok)
    print(
        f"MAPE step time {100 * st:.1f}% · peak memory {100 * mem:.1f}% over {len(ok)} runs · Spearman step time "
        f"{df.step_ms.corr(df.pred_step_ms, method='spearman'):.2f}, peak memory "
        f"{df.mem.corr(df.pred_mem, method='spearman'):.2f}"
    )
    oom = [r for r in out if r["status"] == "oom"]
    hit, false_pos = sum(r["pred_oom"] for r in oom), sum(r["pred_oom"] for r in ok)
    print(
        f"out of memory: {len(oom)} measured, {hit} predicted (recall {hit}/{len(oom)}), {false_pos} of {len(ok)} "
        f"runs that fit predicted OOM"
    )
    diff = [r["alloc"] - r["mem"] for r in ok]
    mape = statistics.fmean(abs(r["alloc"] - r["mem"]) / r["mem"] for r in ok)
    print(
        f"the model less the {RESERVE:g} GiB it counts outside PyTorch's allocator against the peak allocation: MAPE {100 * mape:.1f}%, "
        f"difference {min(diff):+.2f} to {max(diff):+.2f} GiB"
    )
    best = max(ok, key=lambda r: r["tflops"])
    print(
        f"best point {best['point']}: {best['tflops']:.1f} TFLOP/s/GPU, MFU {best['tflops'] / BF16_CEILING:.2f} "
        f"of the {BF16_CEILING:.0f} TFLOP/s bf16 matmul ceiling"
    )


def pairs(out: list[dict], knob: str, a, b) -> None:
    """Measured vs modelled step-time ratio b/a for every pair of ok points that differ only in ``knob``."""
    ok = {tuple(sorted(r["point"].items())): r for r in out if r["status"] == "ok"}
    seen = []
    for key, r in ok.items():
        p = dict(key)
        if p.get(knob) != a or (knob == "precision" and p.get("fp8_recipe") != r["point"].get("fp8_recipe")):
            continue
        for key2, r2 in ok.items():
            q = dict(key2)
            same = all(q[k] == v for k, v in p.items() if k not in (knob, "fp8_recipe"))
            if q.get(knob) == b and same:
                label = ", ".join(f"{k}={v}" for k, v in q.items() if k != knob)
                seen.append((label, r2["step_ms"] / r["step_ms"], r2["pred_step_ms"] / r["pred_step_ms"]))
    if not seen:
        return
    print(f"\n{knob}={b} vs {knob}={a}: step-time ratio measured / model")
    for label, m, p in sorted(seen):
        print(f"  {label:70} {m:.3f} / {p:.3f}")
    print(
        f"  mean measured {statistics.fmean(s[1] for s in seen):.3f}, model {statistics.fmean(s[2] for s in seen):.3f}"
    )


def implied_fp8_efficiency(study: str) -> None:
    """The FP8 GEMM efficiency (share of the FP8 peak) at which the model's mean fp8/bf16 step-time ratio over the
    study's fused-attention pairs equals the measured one (bisection; the bf16 efficiency stays as fitted)."""
    from dse.perfmodel import predict
    from dse.perfmodel.timing import DEFAULT_PARAMS
    from dse.rules.space import load_space
    from dse.rules.trial import resolve

    space = load_space(ROOT / STUDIES[study])
    by = {tuple(sorted(point(space, r).items())): float(r["step_time_s"]) for r in rows(study) if r["status"] == "ok"}
    pairs_ = [
        (dict(k), dict(k) | {"precision": "bf16", "fp8_recipe": "delayed"})
        for k in by
        if dict(k)["precision"] == "fp8" and dict(k)["attention_backend"] == "fused"
    ]
    measured = statistics.fmean(by[tuple(sorted(f.items()))] / by[tuple(sorted(b.items()))] for f, b in pairs_)

    def model_ratio(eff: float) -> float:
        params = DEFAULT_PARAMS.with_values(gemm_eff_fp8=eff)
        return statistics.fmean(
            predict(resolve(space, f), params=params).step_time_s
            / predict(resolve(space, b), params=params).step_time_s
            for f, b in pairs_
        )

    lo, hi = 0.2, 1.0  # the ratio falls as the efficiency rises
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_ratio(mid) > measured else (lo, mid)
    print(
        f"\nFP8 GEMM efficiency implied by the {len(pairs_)} fused fp8/bf16 pairs (measured mean ratio "
        f"{measured:.3f}): {lo:.3f} of the FP8 peak, against the fitted {DEFAULT_PARAMS.gemm_eff_fp8:.3f}"
    )


def main() -> int:
    for study in STUDIES:
        out = compare(study)
        show(study, out)
        if study == "h200_te_8b_4l_study":
            pairs(out, "precision", "bf16", "fp8")
            pairs(out, "attention_backend", "fused", "unfused")
            implied_fp8_efficiency(study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
