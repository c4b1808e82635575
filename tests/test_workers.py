"""Several ``dse run --worker`` processes on one study: on SQLite (one --out) and on a real PostgreSQL server
(one --storage, a directory each, as on different machines). No point twice, every trial recorded once, the
leaderboard of a one-worker run; claims that expire when a worker dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from dse.rules.space import load_space
from dse.study import loop as study_mod
from dse.study.claims import CLAIMS, Claims, add_trial
from dse.study.leaderboard import frame
from dse.study.store import Store, TrialRecord
from tests.helpers import SMALL_SPACE, write_space
from tests.test_study import valid_count

ROOT = Path(__file__).resolve().parent.parent

# the shared small space with a recompute knob besides: 100+ valid points, enough for four workers to collide
SPACE = SMALL_SPACE.replace('name = "small"', 'name = "workers"').replace(
    "mbs = [1, 2]\n", 'mbs = [1, 2]\nrecompute = ["none", "selective", "full"]\n'
)


def dse(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dse", "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )


def wait_all(procs: list[subprocess.Popen]) -> None:
    results = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]


def board(records, knobs) -> pd.DataFrame:
    """The leaderboard without what names a trial (its number, its directory): what it found."""
    lb = frame(records, knobs).drop(columns=["trial", "run_dir"])
    return lb.sort_values(knobs).reset_index(drop=True)


def records_of(out: Path):
    store, _ = study_mod.open_store(out)
    try:
        return store.records()
    finally:
        store.close()


def check_workers(records, reference, knobs, n_valid):
    keys = [tuple(r.knobs.values()) for r in records]
    assert len(keys) == len(set(keys)) == n_valid  # no point twice, none lost
    assert sorted(r.number for r in records) == list(range(n_valid))  # every trial recorded once
    assert not any(r.interrupted for r in records)
    pd.testing.assert_frame_equal(board(records, knobs), board(reference, knobs))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    space = load_space(write_space(tmp, SPACE))
    return space, study_mod.run_study(space, study_mod.Request(out_dir=tmp / "one", agent="grid")).records


def test_two_workers_on_one_sqlite_study_share_the_grid(tmp_path, reference):
    space, ref = reference
    path = write_space(tmp_path, SPACE)
    out = tmp_path / "out"
    procs = [dse("--space", str(path), "--out", str(out), "--worker") for _ in range(2)]
    wait_all(procs)
    records = records_of(out)
    check_workers(records, ref, list(space.knobs), valid_count(space))
    lb = pd.read_csv(out / "leaderboard.csv")  # the last worker to end wrote it, with every trial
    assert len(lb) == valid_count(space)
    dirs = sorted(p.name for p in (out / "trials").iterdir())
    assert dirs == [f"{n:05d}" for n in range(valid_count(space))]


def test_a_plain_run_still_refuses_a_directory_in_use(tmp_path):
    path = write_space(tmp_path, SPACE)
    out = tmp_path / "out"
    import fcntl

    out.mkdir()
    with open(out / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)  # a worker holds it
        r = subprocess.run(
            [sys.executable, "-m", "dse", "run", "--space", str(path), "--out", str(out)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    assert r.returncode == 2 and "in use by another dse run" in r.stderr and "--worker" in r.stderr


def test_a_dead_workers_claim_expires_and_its_trial_is_rerun_in_place(tmp_path, reference):
    space, ref = reference
    out = tmp_path / "out"
    study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", trials=3))  # a study with three trials
    meta = study_mod.read_meta(out)
    store = Store(study_mod.stored_storage(meta["storage"], out), meta["study_name"], meta["knobs"], resume=True)
    point = next(r.knobs for r in ref if r.knobs not in [x.knobs for x in records_of(out)] and r.status == "ok")
    dead = Claims(store, lease_s=0.5)
    assert dead.claim(point)
    number = add_trial(store, TrialRecord(0, point, "failed", 0.0, "interrupted", gpu="h100", num_gpus=16))
    dead.numbered(point, number)
    dead._stop.set()  # the worker dies: no heartbeat, nothing given up
    other = Claims(store, lease_s=0.5)
    assert not other.claim(point)  # held while the lease lasts
    time.sleep(0.7)
    other.close()
    dead.engine.dispose()
    store.close()
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", worker=True, lease_s=0.5))
    check_workers(res.records, ref, list(space.knobs), valid_count(space))
    rerun = next(r for r in res.records if r.number == number)
    assert rerun.knobs == point and rerun.status == "ok"  # the dead worker's row, replaced by its rerun


def test_a_done_point_is_never_claimed_again(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}", "s", {"tp": [1, 2]})
    a, b = Claims(store, lease_s=0.1), Claims(store, lease_s=0.1)
    assert a.claim({"tp": 1}) and not b.claim({"tp": 1})
    a.done({"tp": 1})
    time.sleep(0.2)
    assert not b.claim({"tp": 1}) and b.claim({"tp": 2})
    a.close()
    b.close()  # gives up tp = 2 at once
    c = Claims(store, lease_s=60)
    assert c.claim({"tp": 2}) and not c.claim({"tp": 1})
    c.close()
    store.close()


# ------------------------------------------------------------------------------------------- PostgreSQL
@pytest.fixture
def pg_url(pg_server):
    """A fresh database on the test server (tests/services.py), dropped afterwards."""
    import psycopg

    name = f"dse_test_{uuid.uuid4().hex[:10]}"
    admin = pg_server.replace("+psycopg", "")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_on_one_postgresql_study_never_run_a_point_twice(tmp_path, reference, pg_url, workers):
    space, ref = reference
    path = write_space(tmp_path, SPACE)
    # a directory each, as on different machines: the storage is all they share
    procs = [
        dse("--space", str(path), "--out", str(tmp_path / f"w{i}"), "--storage", pg_url, "--worker")
        for i in range(workers)
    ]
    wait_all(procs)
    store = Store(pg_url, space.name, {k: list(v) for k, v in space.knobs.items()}, create=False)
    records = store.records()
    store.close()
    check_workers(records, ref, list(space.knobs), valid_count(space))
    # each point ran in exactly one worker's directory; a worker that started after the others had claimed every
    # point ran none (and made no trials/ folder). How many workers got work is the OS's scheduling, not dse's: on a
    # loaded 2-core machine one worker claimed all 84 millisecond trials before the other had started (seen in CI),
    # so sharing is not asserted here; that a claimed point is never claimed again is (test_a_done_point_...).
    ran = [len(list(d.iterdir())) if (d := tmp_path / f"w{i}" / "trials").is_dir() else 0 for i in range(workers)]
    assert sum(ran) == valid_count(space) and max(ran) > 0


def test_a_claim_is_renewed_while_its_worker_lives(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}", "s", {"tp": [1, 2]})
    alive, other = Claims(store, lease_s=0.3), Claims(store, lease_s=0.3)
    assert alive.claim({"tp": 1})
    time.sleep(1.0)  # three leases: the heartbeat (a thread of its own) kept it
    assert not other.claim({"tp": 1})
    alive._stop.set()  # the heartbeat stops, as when the worker dies
    alive._beat.join()
    time.sleep(0.5)
    assert other.claim({"tp": 1})
    alive.engine.dispose()
    other.close()
    store.close()


def test_a_killed_workers_row_says_interrupted_with_its_run_directory(tmp_path):
    path = write_space(
        tmp_path,
        SPACE.replace("max_steps = 20", 'max_steps = 2000\n"env.DSE_SIM_STEP_S" = "1"')
        .replace('system = "h100"', 'system = { gpu = "h100", gpus_per_node = 2, slurm = { use_container = false } }')
        .replace("num_nodes = 2", "num_nodes = 1")
        + '\n[backend]\nkind = "local"\npayload = "sim"\n',
    )
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse", "run", "--space", str(path), "--out", str(out), "--worker"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not list(out.glob("trials/*/log.txt")) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, 9)  # the worker dies outright: no Ctrl-C path, nothing given up
    proc.wait()
    recs = records_of(out)
    running = [r for r in recs if r.interrupted]
    assert len(running) == 1 and running[0].run_dir == str(study_mod.trial_dir(out, running[0].number))
    engine = sa.create_engine(study_mod.storage_url(out))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(CLAIMS.c.number, CLAIMS.c.done, CLAIMS.c.expires)).all()
    engine.dispose()
    claim = [r for r in rows if r.number == running[0].number]
    assert len(claim) == 1 and not claim[0].done and claim[0].expires > time.time()  # held until its lease ends
