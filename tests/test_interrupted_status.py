"""A trial with no outcome is its own status, ``interrupted`` (dse.logs.parse.Status), not ``failed`` with a reason:
its placeholder row says so, a row an older dse wrote (failed, reason "interrupted") still reads as interrupted, and
a replay table holding one replays no outcome for its point."""

from __future__ import annotations

import csv
import io

from dse.backends.replay import read_table
from dse.logs.parse import STATUSES, Status
from dse.rules.space import load_space
from dse.rules.trial import resolve
from dse.study.recording import placeholder
from dse.study.store import TrialRecord
from tests.helpers import write_space


def test_a_placeholder_is_interrupted_and_no_outcome(tmp_path):
    space = load_space(write_space(tmp_path))
    row = placeholder(3, resolve(space, {}), space.objective.failed_reward)
    assert row.status == Status.INTERRUPTED and row.interrupted and not row.ok and row.reason is None
    assert Status.INTERRUPTED not in STATUSES  # no run ends interrupted: a run's outcomes are the others


def test_an_older_row_failed_for_an_interruption_reads_as_interrupted():
    assert TrialRecord(0, {"tp": 1}, "failed", 0.0, "interrupted").interrupted
    assert not TrialRecord(0, {"tp": 1}, "failed", 0.0, "NaN in loss").interrupted
    assert TrialRecord(0, {"tp": 1}, "interrupted", 0.0).interrupted


def test_a_replay_table_skips_an_interrupted_row(tmp_path):
    out = io.StringIO()
    w = csv.DictWriter(out, ["trial", "status", "reason", "step_time_s", "tflops_per_gpu", "peak_memory_gib", "mbs"])
    w.writeheader()
    w.writerow({"trial": 0, "status": "ok", "step_time_s": 2.0, "tflops_per_gpu": 400, "peak_memory_gib": 50, "mbs": 1})
    w.writerow({"trial": 1, "status": "interrupted", "mbs": 2})
    path = tmp_path / "leaderboard.csv"
    path.write_text(out.getvalue())
    table = read_table(path, varied=["mbs"])
    assert set(table.rows) == {("1",)} and table.unmeasured == {("2",): "interrupted"}
