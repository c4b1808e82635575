"""Infrastructure failures stop, they do not spend: the local backend stops a study after 3 identical launch
failures (no torchrun here), and ``--resume`` runs the trials that failed for infrastructure again, in place,
never those that failed for their layout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dse.backends.base import InfrastructureFailure, LaunchFailures
from dse.study.loop import _rerun, open_store
from dse.study.store import TrialRecord
from tests.helpers import dse, write_space

LOCAL = """
name = "loc"
recipe = "llama3_70b_16l"
system = "h100"
num_nodes = 1

[settings]
seq_length = 4096
gbs = 32
max_steps = 4
cp = 1
vp = 1

[knobs]
tp = [1, 2, 4, 8]
pp = [1, 2, 4]

[search]
agent = "grid"
screen = "none"  # every point launches: the test counts launch failures, not the screen's predictions

[backend]
kind = "local"
payload = "nemo2"
"""

# a torchrun that starts and prints a finished run's progress lines (Megatron's format)
FAKE_TORCHRUN = """#!/bin/bash
for i in $(seq 1 10); do echo "iteration $i/ 10 | elapsed time per iteration (ms): 1000.0 | lm loss: 2.0 |"; done
"""


def _rows(out: Path) -> list[TrialRecord]:
    store, _ = open_store(out)
    try:
        return store.records()
    finally:
        store.close()


# torchx's local scheduler leaves the log files it opened for a process that could not start unclosed
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_without_torchrun_the_study_stops_after_three_and_resume_reruns_them(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")  # no torchrun
    path, out = write_space(tmp_path, LOCAL), tmp_path / "out"
    r = dse("run", "--space", path, "--out", out)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    error = r.stderr.strip().splitlines()[-1]  # after the progress bar: one line
    assert error.startswith("error:") and "3 trials in a row could not be launched" in error and "torchrun" in error
    rows = _rows(out)
    assert [r.number for r in rows] == [0, 1, 2]
    assert all(InfrastructureFailure.of(r.status, r.reason) and "FileNotFoundError" in (r.reason or "") for r in rows)

    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    r = dse("run", "--space", path, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    rows = _rows(out)
    assert len(rows) == 9 and {r.number for r in rows} == set(range(9))  # the three ran again in place
    assert all(r.status == "ok" for r in rows), [(r.number, r.status, r.reason) for r in rows]


def test_resume_reruns_infrastructure_failures_not_layout_failures():
    def rec(status: str, reason: str | None) -> TrialRecord:
        return TrialRecord(0, {"tp": 1}, status, -1.0, reason)

    assert _rerun(rec("failed", str(InfrastructureFailure("backend local raised FileNotFoundError: torchrun"))))
    assert _rerun(rec("failed", "interrupted"))
    assert not _rerun(rec("oom", "torch.OutOfMemoryError: CUDA out of memory"))
    assert not _rerun(rec("failed", "exit code 1"))
    assert not _rerun(rec("rejected", "tp does not divide heads"))


def test_launch_failures_count_only_identical_ones_in_a_row():
    f = LaunchFailures(3)
    for message in ("a", "a", "b", "b"):
        f.failed(message)
    assert f.repeated() is None  # two of b
    f.launched()
    for _ in range(3):
        f.failed("b")
    assert f.repeated() == ("b", 3)


def test_an_infrastructure_failure_is_stored_as_its_reason_text_and_read_back():
    """A backend hands the type back; the store keeps its text (the prefix, then the message), and a recorded row
    is read back as the failure, or as none: another failure, another status, no reason, pandas' NaN."""
    failure = InfrastructureFailure("sbatch refused the job: Invalid qos specification")
    assert str(failure) == "infrastructure: sbatch refused the job: Invalid qos specification"
    assert InfrastructureFailure.of("failed", str(failure)) == failure
    assert InfrastructureFailure.of("failed", "NaN in loss") is None
    assert InfrastructureFailure.of("oom", str(failure)) is None  # only a failed trial failed for infrastructure
    assert InfrastructureFailure.of("failed", None) is None
    assert InfrastructureFailure.of("failed", float("nan")) is None
