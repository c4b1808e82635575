"""End-to-end trials per second: the grid over the whole 405B space on the simulated backend, store included.

Each trial resolves the point, checks constraints, predicts, writes the simulated log into its run
directory, parses it, computes the reward and records it in the SQLite store; the leaderboard CSV is
written at the end. Goal: >= 100 trials/s on a 2-core machine.

    python bench/grid_speed.py [--space conf/spaces/llama3_405b_space.toml] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from dse.rules.space import load_space
from dse.study.loop import Request, run_study


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="conf/spaces/llama3_405b_space.toml")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    space = load_space(args.space)
    rates = []
    for i in range(args.repeat):
        out = Path(tempfile.mkdtemp(prefix="dse-bench-"))
        try:
            t0 = time.perf_counter()
            res = run_study(space, Request(out_dir=out / "study", agent="grid"))
            dt = time.perf_counter() - t0
            n = len(res.records)  # read from the study directory (StudyResult.records is lazy): before it goes
        finally:
            shutil.rmtree(out, ignore_errors=True)
        rates.append(n / dt)
        print(f"run {i + 1}: {n} trials (every valid point of {space.size}) in {dt:.2f} s = {n / dt:.0f} trials/s")
    print(
        f"best {max(rates):.0f} trials/s, median {sorted(rates)[len(rates) // 2]:.0f} trials/s "
        f"(grid over {args.space}, sim backend, SQLite store)"
    )


if __name__ == "__main__":
    main()
