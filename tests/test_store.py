"""dse's own store: one row layout for every trial, a schema version, trial numbers from the database for
workers, and an older dse's Optuna study migrated once through Optuna's public API."""

from __future__ import annotations

import json
import math
import threading

import optuna
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dse.cli import app
from dse.errors import UserError
from dse.rules.space import load_space
from dse.study.loop import Request, open_store, run_study
from dse.study.store import SCHEMA_VERSION, TRIALS, Store, TrialRecord, check_url, exists
from tests.helpers import write_space

runner = CliRunner()
KNOBS = {"tp": [1, 2, 4], "recompute": ["none", "full"], "fp8": [False, True]}


def _records(n: int) -> list[TrialRecord]:
    out = []
    for i in range(n):
        ok = i % 3 != 0
        out.append(
            TrialRecord(
                number=i,
                knobs={"tp": [1, 2, 4][i % 3], "recompute": ["none", "full"][i % 2], "fp8": bool(i % 5 == 0)},
                status="ok" if ok else "oom",
                reward=float(i) if ok else 0.0,
                reason=None if ok else "CUDA out of memory",
                metrics={"step_time_s": i + 0.5},
                run_dir=f"/r/{i}",
                gpu="h100",
                num_gpus=8,
                gpu_hours=0.25 * i,
            )
        )
    return out


def test_records_come_back_as_written_in_one_row_layout(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    store = Store(url, "s", KNOBS, batch_size=4)
    recs = _records(11) + [
        TrialRecord(
            11, {"tp": 1, "recompute": "none", "fp8": False}, "failed", math.nan, "interrupted", {"steps": None}
        )
    ]
    for r in recs:
        store.record(r)
    store.close()
    reopened = Store(url, "s", KNOBS, create=False)
    assert reopened.next_number() == 12
    back = reopened.records()
    reopened.close()
    assert back[:11] == recs[:11] and back[11].interrupted and math.isnan(back[11].reward)
    assert back[11].metrics == {}  # None values are left out
    assert back[4].knobs == {"tp": 2, "recompute": "none", "fp8": False}
    assert isinstance(back[5].knobs["fp8"], bool) and isinstance(back[5].knobs["tp"], int)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        row = conn.execute(sa.select(TRIALS).where(TRIALS.c.number == 3)).mappings().one()
        version = conn.execute(sa.text("SELECT value FROM dse_meta WHERE key = 'schema_version'")).scalar()
    engine.dispose()
    assert tables == {"dse_meta", "dse_studies", "dse_trials", "dse_claims", "dse_fingerprints"}  # no Optuna table
    assert version == str(SCHEMA_VERSION)
    assert (row["status"], row["reason"], row["gpu"], row["num_gpus"]) == ("oom", "CUDA out of memory", "h100", 8)
    assert json.loads(row["metrics"]) == {"step_time_s": 3.5}


def test_a_second_writer_without_worker_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    Store(url, "s", KNOBS).close()
    with pytest.raises(UserError, match="`resume`"):
        Store(url, "s", KNOBS)
    with pytest.raises(UserError, match="no study 'other'"):
        Store(url, "other", KNOBS, create=False)
    assert exists(url, "s") and not exists(url, "other")
    assert not exists(f"sqlite:///{tmp_path / 'none.db'}", "s") and not (tmp_path / "none.db").exists()


def test_workers_numbering_in_the_database_never_take_a_number_twice(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    Store(url, "s", KNOBS).close()
    stores = [Store(url, "s", KNOBS, resume=True) for _ in range(4)]
    got: list[int] = []
    rec = _records(1)[0]

    def add(store):
        for _ in range(10):
            got.append(store.add_numbered(rec, run_dir=lambda n: f"trials/{n:05d}"))

    threads = [threading.Thread(target=add, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert sorted(got) == list(range(40))
    store = Store(url, "s", KNOBS, create=False, base=tmp_path)
    assert [r.run_dir for r in store.records()] == [str(tmp_path / "trials" / f"{n:05d}") for n in range(40)]
    store.close()


def test_a_journal_file_is_not_a_store():
    with pytest.raises(UserError, match="not an SQL storage URL"):
        check_url("study.log")
    assert check_url("sqlite:///x.db") == "sqlite:///x.db"


def _older_dse_study(url: str) -> None:
    """A study as dse wrote it into Optuna's tables before it had its own: ``status`` and ``record`` user
    attributes (and, older still, one attribute each), written through Optuna's public API."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    dists = {"tp": CategoricalDistribution([1, 2]), "recompute": CategoricalDistribution(["none", "full"])}
    study = optuna.create_study(storage=url, study_name="old", direction="maximize")
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            value=5.0,
            params={"tp": 2, "recompute": "full"},
            distributions=dists,
            user_attrs={
                "status": "ok",
                "record": {
                    "reward": 5.0,
                    "run_dir": "trials/00000",
                    "gpu": "h100",
                    "num_gpus": 16,
                    "gpu_hours": 1.5,
                    "metrics": {"step_time_s": 2.0},
                },
            },
        )
    )
    study.add_trial(
        create_trial(
            state=TrialState.FAIL,
            params={"tp": 1, "recompute": "none"},
            distributions=dists,
            user_attrs={
                "status": "oom",
                "record": {"reason": "CUDA out of memory", "reward": 0.0, "run_dir": "trials/00001"},
            },
        )
    )
    study.add_trial(
        create_trial(
            state=TrialState.FAIL,
            params={"tp": 1, "recompute": "full"},
            distributions=dists,
            user_attrs={"status": "rejected", "reason": "rule: why", "reward": 0.0, "metrics": {}},
        )
    )


def test_an_older_dses_optuna_study_is_migrated_once(tmp_path):
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    _older_dse_study(url)
    assert exists(url, "old") and not exists(url, "new")
    knobs = {"tp": [1, 2], "recompute": ["none", "full"]}
    store = Store(url, "old", knobs, create=False, base=tmp_path)
    recs = store.records()
    store.close()
    assert [(r.number, r.status, r.reward, r.reason) for r in recs] == [
        (0, "ok", 5.0, None),
        (1, "oom", 0.0, "CUDA out of memory"),
        (2, "rejected", 0.0, "rule: why"),
    ]
    assert recs[0].knobs == {"tp": 2, "recompute": "full"} and recs[0].metrics == {"step_time_s": 2.0}
    assert (recs[0].gpu, recs[0].num_gpus, recs[0].gpu_hours) == ("h100", 16, 1.5)
    assert recs[0].run_dir == str(tmp_path / "trials" / "00000")
    resumed = Store(url, "old", knobs, resume=True)  # migrated: read from dse's tables, not again from Optuna's
    assert resumed.next_number() == 3
    resumed.record(TrialRecord(3, {"tp": 2, "recompute": "none"}, "ok", 6.0))
    resumed.close()
    assert len(optuna.load_study(study_name="old", storage=url).trials) == 3  # Optuna's tables left as they were
    store = Store(url, "old", knobs, create=False)
    assert [r.number for r in store.records()] == [0, 1, 2, 3]
    store.close()
    with pytest.raises(UserError, match="`resume`"):  # a new study may not take an older study's name
        Store(url, "old", knobs)


def test_a_newer_schema_is_refused_in_one_line(tmp_path):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    run_study(space, Request(out_dir=out, agent="random", trials=2))
    engine = sa.create_engine(f"sqlite:///{out / 'study.db'}")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE dse_meta SET value = '99' WHERE key = 'schema_version'"))
    engine.dispose()
    r = runner.invoke(app, ["leaderboard", str(out)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "newer dse (store schema 99" in r.output and "upgrade dse" in r.output


def test_open_store_names_a_missing_study(tmp_path):
    space = load_space(write_space(tmp_path))
    run_study(space, Request(out_dir=tmp_path / "out", agent="random", trials=1))
    (tmp_path / "out" / "study.db").unlink()
    with pytest.raises(UserError, match="holds no study"):
        open_store(tmp_path / "out")
