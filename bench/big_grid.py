"""A 200k-trial study end to end: every valid point of a 921,600-point space on the simulated backend, then
``dse leaderboard`` and ``dse report`` on it. Prints trials/s, peak RSS and wall time of each command, and the
output directory's size (on disk, as ``du`` counts it, and apparent: the files' bytes).

Each phase is its own ``dse`` process (as a user runs it), so its peak RSS is its own (``os.wait4``). The space
(bench/data/big_grid_space.toml) is walked by the ``random`` agent: a seeded permutation of all its raw points
(a grid refuses more than 100,000), so every valid point runs once. Goals (issue 20): >= 300 trials/s, < 500
MiB peak; leaderboard and report < 30 s and < 1 GiB each; the output < 500 MB.

    python bench/big_grid.py [--trials N] [--keep DIR] [--quick-start]

``--trials N``: a budget instead of every valid point (a shorter run); ``--quick-start``: also time the README's
quick start (150 optuna trials on conf/spaces/llama3_405b_space.toml), the "no slower than today" check.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "bench" / "data" / "big_grid_space.toml"


def run(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one ``dse`` command, its own peak (``os.wait4``); exits on failure.
    Prints the command's CPU seconds (user + system), which a loaded machine changes less than wall time."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "dse", *argv], stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, error = out.read(), err.read()
    if p.returncode != 0:
        sys.exit(f"dse {' '.join(argv)} failed ({p.returncode}): {error.strip()[-2000:]}")
    print(f"  (dse {argv[0]}: CPU {usage.ru_utime + usage.ru_stime:.1f} s)")
    return wall, usage.ru_maxrss / 1024, text


def sizes(d: Path) -> tuple[float, float, int]:
    """(MB on disk, MB apparent, files) under ``d``."""
    disk = apparent = files = 0
    for root, dirs, names in os.walk(d):
        for n in dirs + names:
            st = os.lstat(os.path.join(root, n))
            disk += st.st_blocks * 512
            apparent += st.st_size
            files += n in names
    return disk / 1e6, apparent / 1e6, files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=None, help="budget (default: every valid point)")
    ap.add_argument("--keep", type=Path, default=None, help="write the study here and keep it")
    ap.add_argument("--quick-start", action="store_true", help="also time the README's quick start")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dse-big-"))
    out = args.keep or tmp / "study"
    try:
        argv = ["run", "--space", str(SPACE), "--out", str(out)] + (
            ["--trials", str(args.trials)] if args.trials else []
        )
        wall, rss, text = run(argv)
        n = int(next(line for line in text.splitlines() if "in the study" in line).split()[0])
        print(f"run: {n:,} trials in {wall:.1f} s = {n / wall:.0f} trials/s end to end, peak RSS {rss:.0f} MiB")
        wall, rss, _ = run(["leaderboard", str(out)])
        print(f"dse leaderboard: {wall:.1f} s, peak RSS {rss:.0f} MiB")
        wall, rss, _ = run(["leaderboard", str(out), "--csv", str(tmp / "lb.csv")])
        print(f"dse leaderboard --csv: {wall:.1f} s, peak RSS {rss:.0f} MiB")
        wall, rss, _ = run(["report", str(out), "--html", str(tmp / "report.html")])
        print(f"dse report: {wall:.1f} s, peak RSS {rss:.0f} MiB, {(tmp / 'report.html').stat().st_size / 1e6:.1f} MB")
        disk, apparent, files = sizes(out)
        db = (out / "study.db").stat().st_size / 1e6
        print(
            f"output: {disk:,.0f} MB on disk, {apparent:,.0f} MB apparent, {files:,} files; study.db {db:,.0f} MB; "
            f"{disk * 1e6 / max(n, 1) / 1024:.1f} KiB on disk per trial"
        )
        packs = list((out / "trials").glob("logs-*.tar.xz"))
        dirs = [p for p in (out / "trials").iterdir() if p.is_dir()] if (out / "trials").is_dir() else []
        print(
            f"  leaderboard.csv {(out / 'leaderboard.csv').stat().st_size / 1e6:,.0f} MB; {len(packs):,} packs of "
            f"simulated logs {sum(p.stat().st_size for p in packs) / 1e6:,.1f} MB; {len(dirs):,} run directories "
            f"left unpacked {sum(sizes(d)[0] for d in dirs):,.1f} MB"
        )
        if args.quick_start:
            qs = tmp / "qs"
            wall, rss, _ = run(["run", "--space", str(ROOT / "conf/spaces/llama3_405b_space.toml"), "--out", str(qs)])
            print(f"quick start (150 optuna trials): {wall:.1f} s, peak RSS {rss:.0f} MiB")
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
