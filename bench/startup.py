"""How long a command takes to start: ``import dse.cli``, ``dse validate`` on a shipped space, and nemo-run's own
import (which only rendering a Slurm script or a local launch through nemo-run pays). Each in a fresh interpreter,
the median of ``--repeat`` runs (wall time). Not run in CI.

    python bench/startup.py [--space conf/spaces/llama3_70b_space.toml] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(argv: list[str], repeat: int) -> float:
    """Median wall seconds of ``argv`` (run from the repository, output discarded; a failure stops the bench)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="conf/spaces/llama3_70b_space.toml")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    py = sys.executable
    rows = [
        ("python -c pass (the interpreter alone)", [py, "-c", "pass"]),
        ("import dse.cli", [py, "-c", "import dse.cli"]),
        (f"dse validate {args.space}", [py, "-m", "dse", "validate", args.space]),
        ("import nemo_run (rendering a Slurm script, a local launch)", [py, "-W", "ignore", "-c", "import nemo_run"]),
    ]
    check = "import dse.cli, sys; print('nemo_run' in sys.modules)"
    loaded = subprocess.run([py, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    print(f"measured, median wall time of {args.repeat} fresh processes each:")
    for label, argv in rows:
        print(f"  {label:62s} {wall(argv, args.repeat):6.2f} s")
    print(f"nemo_run imported by `import dse.cli`: {loaded}")


if __name__ == "__main__":
    main()
