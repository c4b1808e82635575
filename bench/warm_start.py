"""Warm start across generations: does seeding a GB200 search with an H100 study's best points find a better
layout within a small budget? Optuna TPE, with and without ``--warm-start``, several seeds, against the
GB200 grid optimum, on the simulated backend (its exact truth: a figure for the seeding, not for the model).

    python bench/warm_start.py [--space conf/spaces/llama3_70b_generations_space.toml] [--trials 20] [--seeds 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from dse.rules.space import load_space
from dse.study.generations import space_for, warm_start_points
from dse.study.loop import Request, run_study


def best(records) -> float:
    return max((r.reward for r in records if r.ok), default=float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="conf/spaces/llama3_70b_generations_space.toml")
    ap.add_argument("--source", default="h100")
    ap.add_argument("--target", default="gb200")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    space = load_space(args.space)
    tmp = Path(tempfile.mkdtemp(prefix="dse-bench-warm-"))
    try:
        src, dst = space_for(space, args.source), space_for(space, args.target)
        run_study(src, Request(out_dir=tmp / "src", agent="grid"))
        optimum = best(run_study(dst, Request(out_dir=tmp / "grid", agent="grid")).records)
        seeds = warm_start_points(dst, tmp / "src")
        rows = {"cold": [], "warm": []}
        for s in range(args.seeds):
            for kind in rows:
                out = tmp / f"{kind}{s}"
                res = run_study(
                    dst,
                    Request(
                        out_dir=out, agent="optuna", trials=args.trials, seed=s, seeds=seeds if kind == "warm" else ()
                    ),
                )
                rows[kind].append(best(res.records) / optimum)
        print(
            f"{args.source} -> {args.target}, optuna tpe, {args.trials} trials, {args.seeds} seeds, "
            f"{len(seeds)} warm-start points; best found as a fraction of the {args.target} grid optimum "
            f"({optimum:.4g} TFLOP/s/GPU):"
        )
        for kind, vals in rows.items():
            print(f"  {kind}: mean {statistics.mean(vals):.3f}, min {min(vals):.3f}, max {max(vals):.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
