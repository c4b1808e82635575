"""Wall time of a 2-node-reproducer grid on the local Slurm cluster at ``--parallel 1`` and ``--parallel 2``.

The reproducer (``conf/spaces/llama3_70b_2node_space.toml`` by default; ``--space`` for another) runs as
written but for three things: its system becomes the local cluster of ``.ci/slurm/up.sh`` (two Slurm nodes of
one "GPU" each, a GB300's memory so that the 70B slice fits), the backend is Slurm with the simulated
payload (each trial is a real ``sbatch`` job of two tasks, one per node, printing the model's figures), and
``max_steps`` is ``--steps`` at ``--step-s`` seconds a step. On two nodes of one GPU the grid's valid points
are those of tp * pp * cp = 2. The cluster shares its nodes between jobs (``OverSubscribe=FORCE``), so two
2-node jobs can run side by side. Each setting is one ``dse run`` process, timed from start to end.

    bash .ci/slurm/up.sh /tmp/dse-bench; . /tmp/dse-bench/slurm/env.sh   # as root, once (SLURM_CONF)
    python bench/parallel_speed.py  # prints the two wall times and their ratio
    bash .ci/slurm/down.sh /tmp/dse-bench
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL = (
    'system = { gpu = "gb300", gpus_per_node = 1, nvlink_domain = 72, slurm = { partition = "debug", '
    'time_limit = "00:10:00", use_container = false, gpus_per_node_flag = false, exclusive = false } }'
)


def local_space(text: str, steps: int, step_s: float) -> str:
    """The reproducer's space file, moved onto the local cluster (see the module docstring)."""
    text = re.sub(r"^system = .*$", LOCAL, text, count=1, flags=re.M)
    text = re.sub(
        r"^max_steps = .*$", f'max_steps = {steps}\n"env.DSE_SIM_STEP_S" = "{step_s}"', text, count=1, flags=re.M
    )
    text = re.sub(r'^kind = "sim"$', 'kind = "slurm"', text, count=1, flags=re.M)
    return re.sub(r"^payload = .*$", 'payload = "sim"', text, count=1, flags=re.M)


def run(space: Path, out: Path, parallel: int) -> tuple[float, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "dse", "run", "--space", str(space), "--out", str(out), "--parallel", str(parallel)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"dse run --parallel {parallel} failed ({r.returncode}): {r.stderr[-2000:]}")
    return wall, r.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", type=Path, default=ROOT / "conf" / "spaces" / "llama3_70b_2node_space.toml")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-s", type=float, default=0.5)
    args = ap.parse_args()
    if shutil.which("sbatch") is None:
        sys.exit("no sbatch on PATH: start the local cluster with `bash .ci/slurm/up.sh ROOT` (as root)")
    with tempfile.TemporaryDirectory() as tmp:
        space = Path(tmp) / args.space.name
        space.write_text(local_space(args.space.read_text(), args.steps, args.step_s))
        walls = {}
        for parallel in (1, 2):
            walls[parallel], summary = run(space, Path(tmp) / f"p{parallel}", parallel)
            print(f"--parallel {parallel}: {walls[parallel]:6.1f} s  ({summary})")
        print(
            f"{args.space.name} on the local Slurm ({args.steps} steps x {args.step_s} s): "
            f"--parallel 2 takes {walls[2] / walls[1]:.2f}x the wall time of --parallel 1 "
            f"({walls[1] / walls[2]:.2f}x faster)"
        )


if __name__ == "__main__":
    main()
