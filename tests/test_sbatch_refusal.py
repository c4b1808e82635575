"""sbatch refusing a job, as a real cluster words it: the trial is an infrastructure failure whose reason is
sbatch's own message (the agent is not shown it, the report classes it apart, --resume runs it again), and the
study stops after the same refusal three times in a row. A fake ``sbatch`` on PATH replays sbatch's
stderr (``tests/data/sbatch/*.stderr``, written as sbatch prints Slurm's error strings); the real-Slurm check
is ``tests/test_slurm_backend.py::test_submission_failure_is_data_not_an_exception``."""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import pytest

from dse.backends.base import InfrastructureFailure
from dse.backends.slurm import SUBMIT_FAILED, SlurmBackend, sbatch_message
from dse.errors import UserError
from dse.execute import run_trial
from dse.rules.space import BackendSettings, load_space
from dse.study import loop as study_mod
from tests.trials import DATA, system, trial

SBATCH = Path(__file__).parent / "data" / "sbatch"
SPACE = DATA / "spaces" / "llama3_70b_16l_local_slurm.toml"


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """``fake_sbatch(name)``: sbatch now prints ``tests/data/sbatch/<name>.stderr`` and exits 1; the count of
    calls is in ``bin/calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def use(name: str) -> Path:
        exe = bin_dir / "sbatch"
        exe.write_text(
            textwrap.dedent(f"""\
            #!/bin/sh
            echo x >> {bin_dir / "calls"}
            cat {SBATCH / (name + ".stderr")} >&2
            exit 1
            """)
        )
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        return bin_dir / "calls"

    return use


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gres", "Invalid generic resource (gres) specification"),
        ("partition", "invalid partition specified: gpu; Invalid partition name specified"),
        ("nodes", "Requested node configuration is not available"),  # the warning line is left out
        ("account", "Invalid account or account/partition combination specified"),
        ("qos", "Invalid qos specification"),
    ],
)
def test_sbatch_message_is_sbatchs_words_without_its_prefixes(name, message):
    assert sbatch_message((SBATCH / f"{name}.stderr").read_text()) == message


def test_sbatch_message_keeps_a_warning_when_it_is_all_there_is():
    assert sbatch_message("sbatch: warning: something odd\n") == "warning: something odd"


def _trial():
    return trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml"),
        num_nodes=2,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=2,
    )


def test_refused_trial_has_sbatchs_message_as_its_reason(tmp_path, fake_sbatch):
    fake_sbatch("gres")
    m = run_trial(_trial(), tmp_path / "t", SlurmBackend(poll_s=0.01), BackendSettings(kind="slurm", payload="sim"))
    assert m.status == "failed"
    assert m.reason == "infrastructure: sbatch refused the job: Invalid generic resource (gres) specification"
    assert InfrastructureFailure.of(m.status, m.reason) is not None
    out = (tmp_path / "t" / "sbatch.out").read_text()
    assert out.startswith("sbatch: error: Batch job") and "sbatch: sbatch:" not in out  # as printed, once


def test_backend_asks_to_stop_after_the_same_refusal_three_times(tmp_path, fake_sbatch):
    from dse.launch import build_plan

    be = SlurmBackend(poll_s=0.01)
    plan = build_plan(_trial(), payload="nemo2")
    fake_sbatch("partition")
    for i in range(2):
        r = be.run(plan, tmp_path / f"a{i}")
        assert r.scheduler_state == SUBMIT_FAILED and be.stop_reason() is None
    fake_sbatch("gres")  # a different message starts the count again
    for i in range(2):
        be.run(plan, tmp_path / f"b{i}")
        assert be.stop_reason() is None
    be.run(plan, tmp_path / "b2")
    assert "refused 3 jobs in a row: Invalid generic resource (gres) specification" in be.stop_reason()


def test_study_stops_after_three_identical_refusals_with_a_user_error(tmp_path, fake_sbatch):
    calls = fake_sbatch("partition")
    space = load_space(SPACE)
    with pytest.raises(UserError, match="sbatch refused 3 jobs in a row: invalid partition specified: gpu"):
        study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid", trials=10))
    assert len(calls.read_text().splitlines()) == 3  # not one submission per remaining trial
    store, _ = study_mod.open_store(tmp_path / "out")
    recs = store.records()
    store.close()
    assert len(recs) == 3 and all(r.status == "failed" for r in recs)
    assert all(
        r.reason
        == "infrastructure: sbatch refused the job: invalid partition specified: gpu; Invalid partition name specified"
        for r in recs
    )
    assert all(study_mod._rerun(r) for r in recs)  # once the system file is fixed, --resume runs them again
    assert (tmp_path / "out" / "leaderboard.csv").exists()


def test_cli_prints_the_refusal_on_one_line_and_exits_2(tmp_path, fake_sbatch):
    from typer.testing import CliRunner

    from dse.cli import app

    fake_sbatch("gres")
    r = CliRunner().invoke(app, ["run", "--space", str(SPACE), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    assert "sbatch refused 3 jobs in a row: Invalid generic resource (gres) specification" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("name", ["account", "qos"])
def test_an_account_or_qos_refusal_is_an_infrastructure_failure(tmp_path, fake_sbatch, name):
    fake_sbatch(name)
    m = run_trial(_trial(), tmp_path / "t", SlurmBackend(poll_s=0.01), BackendSettings(kind="slurm", payload="sim"))
    assert InfrastructureFailure.of(m.status, m.reason) is not None
    assert m.reason.startswith("infrastructure: sbatch refused the job: Invalid ")


def test_the_agent_is_not_shown_a_refused_trial(tmp_path, fake_sbatch, monkeypatch):
    """A refusal says nothing of the layout: the agent learns nothing from it (as a resume replays nothing of it)."""
    from dse.agents.base import Agent

    seen: list[str | None] = []
    original = Agent.observe

    def spy(self, action, reward, ok, **kw):
        seen.append(kw.get("status"))
        original(self, action, reward, ok, **kw)

    abandoned: list[dict] = []
    monkeypatch.setattr(Agent, "observe", spy)
    monkeypatch.setattr(Agent, "abandon", lambda self, action: abandoned.append(dict(action)))
    fake_sbatch("qos")
    with pytest.raises(UserError, match="sbatch refused 3 jobs in a row: Invalid qos specification"):
        study_mod.run_study(load_space(SPACE), study_mod.Request(out_dir=tmp_path / "out", agent="grid", trials=10))
    assert seen == []
    assert len(abandoned) == 3 and len({tuple(a.values()) for a in abandoned}) == 3  # each refused point, once


def test_the_report_classes_a_refusal_as_infrastructure():
    import pandas as pd

    from dse.results.report import INFRASTRUCTURE_CLASS, failures_table

    df = pd.DataFrame(
        {
            "trial": [0, 1, 2],
            "status": ["failed", "failed", "oom"],
            "reason": ["infrastructure: sbatch refused the job: Invalid qos specification", "NaN in loss", None],
        }
    )
    html = str(failures_table(df))
    assert INFRASTRUCTURE_CLASS in html and "Invalid qos specification" in html
    assert html.count("<tr") == 4  # header, the infrastructure class, the layout's failed, oom


def test_an_abandoned_point_is_closed_and_not_proposed_again():
    """Agent.abandon: the Optuna trial of a point whose launch failed for infrastructure is told FAIL (not left
    RUNNING for the constant liar), the guided agent stops believing it in flight (its stop rule waits for points
    in flight), and neither proposes the point again in this process."""
    import optuna
    from gymnasium import spaces

    from dse.agents.guided import GuidedAgent
    from dse.agents.optuna_agent import OptunaAgent

    space = spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Discrete(2)})
    agent = OptunaAgent(space, parallel=2, sampler="random", seed=0)
    first = agent.propose()
    agent.abandon(first)
    states = [t.state for t in agent.study.get_trials(deepcopy=False)]
    assert optuna.trial.TrialState.RUNNING not in states and optuna.trial.TrialState.FAIL in states
    rest = [agent.propose() for _ in range(5)]
    assert all(a is not None for a in rest) and first not in rest and agent.propose() is None

    guided = GuidedAgent(space, seed=0)
    first = guided.propose()
    assert guided.pending
    guided.abandon(first)
    assert not guided.pending
    proposed = [guided.propose() for _ in range(5)]
    assert first not in proposed and guided.propose() is None
