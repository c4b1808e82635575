"""How well ``dse calibrate`` learns a stack from a few runs (issue 10). Prints figures; asserts nothing.

    python bench/calibration.py                 # all three measurements, 50 random splits per k
    python bench/calibration.py --splits 10     # quicker

1. The 13 real H200 runs (bench/data/h200_real_runs.tsv, megatron-core local spec): calibrate on k of them
   (k = 3, 5; ``--splits`` random splits, seed 0) with the default parameter choice of ``dse calibrate``,
   predict the others; step-time MAPE, peak-memory MAPE and Spearman of the step-time ranking of the
   held-out runs, averaged over the splits (the shipped model's figures on the same held-out runs beside).
2. The published calibration table (bench/data/published_perf_calibration.tsv): calibrate on its H100 rows,
   predict its B200 / GB200 rows; tokens/s/GPU MAPE against the shipped model's (the priors must hold).
3. ``dse calibrate`` on the six-trial local H200 study (bench/data/h200_local_study/), end to end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dse.perfmodel import DEFAULT_PARAMS, predict  # noqa: E402
from dse.perfmodel.calibrate import Run, choose_params, fit_runs, load_runs  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from model_accuracy import load_rows, row_trial  # noqa: E402


def held_out_figures(test: list[Run], P) -> tuple[float, float, float]:
    pred = [predict(r.trial, params=P) for r in test]
    st = statistics.fmean(abs(p.step_time_s - r.step_time_s) / r.step_time_s for p, r in zip(pred, test))
    mm = [
        abs(p.peak_memory_gib - r.peak_memory_gib) / r.peak_memory_gib for p, r in zip(pred, test) if r.peak_memory_gib
    ]
    # Spearman = Pearson of the ranks (pandas' method="spearman" needs SciPy, not a dependency)
    rho = pd.Series([r.step_time_s for r in test]).rank().corr(pd.Series([p.step_time_s for p in pred]).rank())
    return 100 * st, 100 * statistics.fmean(mm), float(rho)


def real_runs(splits: int) -> tuple[int, dict[int, tuple[list[float], list[float]]]]:
    """Prints the table; returns the number of runs and k -> (calibrated, shipped) held-out figures: step MAPE %,
    memory MAPE %, Spearman."""
    figures = {}
    runs, _ = load_runs([ROOT / "bench" / "data" / "h200_real_runs.tsv"], gpu="h200")
    print(
        f"1. {len(runs)} real H200 runs: calibrate on k, predict the other {len(runs)} - k "
        f"({splits} random splits, seed 0)"
    )
    print(
        f"   {'k':>2} {'step MAPE':>10} {'shipped':>8} {'mem MAPE':>9} {'shipped':>8} {'Spearman':>9} "
        f"{'shipped':>8}  params fitted (most common)"
    )
    rng = random.Random(0)
    for k in (3, 5):
        cal, ship, chosen = [], [], {}
        for _ in range(splits):
            idx = rng.sample(range(len(runs)), k)
            train = [runs[i] for i in idx]
            test = [r for i, r in enumerate(runs) if i not in idx]
            t_names, m_names = choose_params(train, None)
            key = ",".join(t_names + m_names)
            chosen[key] = chosen.get(key, 0) + 1
            cal.append(held_out_figures(test, fit_runs(train, t_names, m_names)))
            ship.append(held_out_figures(test, DEFAULT_PARAMS))
        c = [statistics.fmean(x[i] for x in cal) for i in range(3)]
        s = [statistics.fmean(x[i] for x in ship) for i in range(3)]
        print(
            f"   {k:>2} {c[0]:9.1f}% {s[0]:7.1f}% {c[1]:8.1f}% {s[1]:7.1f}% {c[2]:9.2f} {s[2]:8.2f}  "
            f"{max(chosen, key=chosen.get)}"
        )
        figures[k] = (c, s)
    return len(runs), figures


def published() -> dict:
    """Prints the figures; returns them: the rows fitted and predicted, the B200/GB200 MAPE % shipped and
    calibrated, and the moved parameters."""
    rows = load_rows()

    def as_run(r) -> Run:
        t = row_trial(r)
        step = int(r["gbs"]) * int(r["seq_length"]) / (float(r["tokens_per_s_per_gpu"]) * int(r["num_gpus"]))
        return Run(r["id"], t, step, None)

    train = [as_run(r) for r in rows if r["gpu"] == "h100"]
    test = [as_run(r) for r in rows if r["gpu"] in ("b200", "gb200")]
    t_names, m_names = choose_params(train, None)
    P = fit_runs(train, t_names, m_names)

    def mape(params) -> float:
        return 100 * statistics.fmean(
            abs(predict(r.trial, params=params).step_time_s - r.step_time_s) / r.step_time_s for r in test
        )

    print(
        f"2. published table: calibrate on the {len(train)} H100 rows ({', '.join(t_names)}), predict the "
        f"{len(test)} B200/GB200 rows"
    )
    shipped, calibrated = mape(DEFAULT_PARAMS), mape(P)
    moved = ", ".join(f"{n} {getattr(DEFAULT_PARAMS, n):.4g} -> {getattr(P, n):.4g}" for n in t_names)
    print(f"   tokens/s/GPU MAPE on B200/GB200: shipped {shipped:.1f}% -> calibrated {calibrated:.1f}%")
    print("   moved: " + moved)
    return {"fitted": len(train), "predicted": len(test), "shipped": shipped, "calibrated": calibrated, "moved": moved}


def local_study() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "calibration.toml"
        cmd = [sys.executable, "-m", "dse", "calibrate", "bench/data/h200_local_study", "--out", str(out)]
        print("3. " + " ".join(["dse", *cmd[3:-1], "calibration.toml"]))
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        print("   exit code", res.returncode)
        for line in res.stdout.splitlines()[-3:]:
            print("   " + line)
        if res.returncode:
            print(res.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--splits", type=int, default=50)
    args = ap.parse_args(argv)
    real_runs(args.splits)
    published()
    local_study()
    return 0


if __name__ == "__main__":
    sys.exit(main())
