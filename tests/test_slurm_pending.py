"""A job Slurm keeps pending (a drained node, a reservation): past ``slurm.max_pending`` it is cancelled and
the trial fails with Slurm's pending reason. Fake ``sbatch``/``sacct``/``squeue``/``scancel`` on PATH play a
cluster whose job never starts; the real-Slurm tests are in test_slurm_backend.py."""

from __future__ import annotations

import os
import stat

import pytest

from dse.backends.base import InfrastructureFailure
from dse.backends.slurm import SlurmBackend, _check_settings, slurm_seconds
from dse.errors import UserError
from dse.execute import run_trial
from dse.rules.space import BackendSettings, SlurmSettings
from tests.trials import DATA, system, trial

REASON = "ReqNodeNotAvail, UnavailableNodes:node[1-2]"


@pytest.fixture
def pending_cluster(tmp_path, monkeypatch):
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.write_text("PENDING")
    scripts = {
        "sbatch": "echo 4242",
        "sacct": f'echo "$(cat {state})|0:0"',
        "squeue": f'echo "{REASON}"',
        "scancel": f'echo "CANCELLED" > {state}; echo "$@" >> {bin_dir / "cancelled"}',
    }
    for name, body in scripts.items():
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\n{body}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def _trial(**slurm):
    return trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml", slurm=slurm),
        num_nodes=2,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=2,
    )


def test_a_job_pending_past_the_limit_is_cancelled_and_failed_with_slurms_reason(tmp_path, pending_cluster, capsys):
    m = run_trial(
        _trial(max_pending="00:01"),
        tmp_path / "t",
        SlurmBackend(poll_s=0.05),
        BackendSettings(kind="slurm", payload="sim"),
    )
    assert m.status == "failed"
    assert m.reason == f"infrastructure: pending longer than slurm.max_pending 00:01 ({REASON}); job 4242 cancelled"
    assert (
        InfrastructureFailure.of(m.status, m.reason) is not None
    )  # the layout never ran: agents skip it, --resume runs it again
    assert (pending_cluster / "cancelled").read_text().split() == ["4242"]
    assert capsys.readouterr().err.splitlines() == [f"job 4242 pending: {REASON}"]  # once, not per poll


def test_wait_reports_the_pending_reason_while_it_waits(pending_cluster):
    be = SlurmBackend(poll_s=0.05)
    st = be.wait("4242", limit_s=0.2)
    assert st.state == "PENDING" and st.reason == REASON


def test_max_pending_is_checked_as_a_slurm_time(tmp_path):
    bad = SlurmSettings(use_container=False).model_copy(update={"max_pending": "soon; rm -rf /"})
    with pytest.raises(UserError, match="slurm.max_pending"):
        _check_settings(bad, "sys.toml")  # the script path checks again what it writes
    _check_settings(SlurmSettings(max_pending="1-00:00:00", use_container=False), "sys.toml")
    assert slurm_seconds("1-00:00:00") == 86400
    from typer.testing import CliRunner

    from dse.cli import app

    text = (DATA / "spaces" / "llama3_70b_16l_local_slurm.toml").read_text()
    space = tmp_path / "s.toml"
    space.write_text(text.replace('time_limit = "00:05:00"', 'time_limit = "00:05:00", max_pending = "1h"'))
    r = CliRunner().invoke(app, ["validate", str(space)])
    assert r.exit_code == 2 and "max_pending" in r.output and "Traceback" not in r.output


class _NeverStop:
    poll_s = 0.05

    def __call__(self, log_path):
        return False


def test_the_early_stop_path_honours_the_pending_limit_too(tmp_path, pending_cluster):
    from dse.launch import build_plan

    be = SlurmBackend(poll_s=0.05)
    r = be.run(build_plan(_trial(max_pending="00:01"), payload="nemo2"), tmp_path / "t", stop=_NeverStop())
    assert r.scheduler_state == "PENDING" and not r.stopped
    assert r.reason == InfrastructureFailure(
        f"pending longer than slurm.max_pending 00:01 ({REASON}); job 4242 cancelled"
    )
