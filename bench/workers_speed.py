"""Several ``dse run --worker`` processes on one PostgreSQL study: trials/s with 1, 2 and 4 workers, and that
the result stays the one-worker result.

A simulated grid (``conf/spaces/llama3_70b_2node_space.toml`` by default) is run by N worker processes, each
with its own output directory (as on N machines), all given the same ``--storage postgresql+psycopg://...``
(a fresh database per N on the server of ``.ci/postgres/up.sh``). Timed from the first start to the last end;
trials/s counts every trial in the study. Checked each time: no point twice, every valid point once, and the
leaderboard (without trial numbers and run directories) identical to the one-worker run's.

    bash .ci/postgres/up.sh             # as root, once
    python bench/workers_speed.py       # --space FILE, --workers 1,2,4, --url URL of the server's admin db
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

from dse.leaderboard import frame  # noqa: E402
from dse.space import load_space  # noqa: E402
from dse.store import Store  # noqa: E402


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
    procs = [subprocess.Popen([sys.executable, "-m", "dse", "run", "--space", str(space_file), "--out",
                               str(tmp / f"n{n}-w{i}"), "--storage", url, "--worker"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(n)]
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
    ap.add_argument("--url", default=os.environ.get("DSE_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:55432/dse"))
    args = ap.parse_args()
    space = load_space(args.space)
    knobs = list(space.knobs)
    reference = None
    print(f"{args.space.name}: simulated grid, workers on one PostgreSQL study ({os.cpu_count()} CPU cores here)")
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
            lb = frame(records, knobs).drop(columns=["trial", "run_dir"]).sort_values(knobs).reset_index(drop=True)
            if reference is None:
                reference = lb
            same = lb.equals(reference)
            ok = len(keys) == len(set(keys)) and not any(r.interrupted for r in records) and same
            print(f"  {n} worker(s): {len(records)} trials in {wall:6.1f} s = {len(records) / wall:6.1f} trials/s; "
                  f"no point twice: {len(keys) == len(set(keys))}; leaderboard as with 1 worker: {same}"
                  + ("" if ok else "  <-- WRONG"))


if __name__ == "__main__":
    main()
