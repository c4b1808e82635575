"""Several ``dse run --worker`` processes on one PostgreSQL study: trials/s with 1, 2 and 4 workers, and that
the result stays the one-worker result.

A simulated grid (``conf/spaces/llama3_70b_2node_space.toml`` by default) is run by N worker processes, each
with its own output directory (as on N machines), all given the same ``--storage postgresql+psycopg://...``
(a fresh database per N on the server of ``.ci/postgres/up.sh``). Timed from the first start to the last end;
trials/s counts every trial in the study. Checked each time: no point twice, every valid point once, and the
leaderboard (without trial numbers and run directories; with ``--trial-s`` without the GPU-hours too, which
come from each run's measured wall time) identical to the one-worker run's.

With ``--trial-s S`` the trials take time, as real ones do: a 12-point grid of one-node Llama 3 8B layouts
on the local backend with the simulated payload (a real subprocess per trial, 10 steps of S/10 seconds).

    bash .ci/postgres/up.sh /tmp/dse-bench; . /tmp/dse-bench/postgres/env.sh   # as root, once (DSE_PG_URL)
    python bench/workers_speed.py       # --space FILE, --workers 1,2,4, --url URL of the server's admin db
    bash .ci/postgres/down.sh /tmp/dse-bench
    python bench/workers_speed.py --trial-s 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dse.rules.space import load_space  # noqa: E402
from dse.study.leaderboard import frame  # noqa: E402
from dse.study.store import Store  # noqa: E402

TIMED = """
name = "workers_timed"
recipe = "llama3_8b"
system = {{ gpu = "h100", gpus_per_node = 2, slurm = {{ use_container = false }} }}
num_nodes = 1

[settings]
seq_length = 1024
gbs = 8
max_steps = 10
cp = 1
vp = 1
pp = 1
"env.DSE_SIM_STEP_S" = "{step_s}"

[knobs]
tp = [1, 2]
mbs = [1, 2]
recompute = ["none", "selective", "full"]

[backend]
kind = "local"
payload = "sim"

[search]
agent = "grid"
"""


def fresh_db(admin_url: str) -> tuple[str, str]:
    import psycopg

    name = f"dse_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, admin_url.rsplit("/", 1)[0] + "/" + name


def drop_db(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_workers(space_file: Path, url: str, n: int, tmp: Path) -> float:
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dse",
                "run",
                "--space",
                str(space_file),
                "--out",
                str(tmp / f"n{n}-w{i}"),
                "--storage",
                url,
                "--worker",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    errs = [p.communicate()[1] for p in procs]
    wall = time.monotonic() - t0
    for p, err in zip(procs, errs):
        if p.returncode != 0:
            sys.exit(f"a worker failed ({p.returncode}): {err[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", type=Path, default=ROOT / "conf" / "spaces" / "llama3_70b_2node_space.toml")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--trial-s", type=float, default=None, help="trials of about this many seconds (local backend)")
    ap.add_argument("--url", default=os.environ.get("DSE_PG_URL"), help="default: $DSE_PG_URL")
    args = ap.parse_args()
    if not args.url:
        sys.exit("no PostgreSQL server: --url URL, or DSE_PG_URL from .ci/postgres/up.sh ROOT")
    tmp_space = None
    if args.trial_s is not None:
        tmp_space = Path(tempfile.mkdtemp()) / "workers_timed.toml"
        tmp_space.write_text(TIMED.format(step_s=args.trial_s / 10))
        args.space = tmp_space
        os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # the payload's python
    space = load_space(args.space)
    knobs = list(space.knobs)
    reference = None
    what = f"local backend, trials of ~{args.trial_s:g} s" if args.trial_s is not None else "simulated grid"
    print(f"{args.space.name}: {what}, workers on one PostgreSQL study ({os.cpu_count()} CPU cores here)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(w) for w in args.workers.split(",")):
            name, url = fresh_db(args.url)
            try:
                wall = run_workers(args.space, url, n, Path(tmp))
                store = Store(url, space.name, {k: list(v) for k, v in space.knobs.items()}, create=False)
                records = store.records()
                store.close()
            finally:
                drop_db(args.url, name)
            keys = [tuple(r.knobs.values()) for r in records]
            # timed trials: GPU-hours come from each run's measured wall time, which no two runs share
            drop = ["trial", "run_dir"] + (["gpu_hours"] if args.trial_s is not None else [])
            lb = frame(records, knobs).drop(columns=drop).sort_values(knobs).reset_index(drop=True)
            if reference is None:
                reference = lb
            same = lb.equals(reference)
            ok = len(keys) == len(set(keys)) and not any(r.interrupted for r in records) and same
            print(
                f"  {n} worker(s): {len(records)} trials in {wall:6.1f} s = {len(records) / wall:6.2f} trials/s; "
                f"no point twice: {len(keys) == len(set(keys))}; leaderboard as with 1 worker: {same}"
                + ("" if ok else "  <-- WRONG")
            )


if __name__ == "__main__":
    main()
