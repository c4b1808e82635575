"""An external library drives dse: the docs' Stable-Baselines3 example runs (a short budget), and the policy agent
uses a policy that ``dse train-policy`` trained."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app

pytest.importorskip("stable_baselines3", reason="the rl extra (stable-baselines3, torch) is not installed")

ROOT = Path(__file__).resolve().parents[1]
SPACE = "conf/spaces/nemotron3_8b_space.toml"


def test_the_docs_ppo_example_trains_on_the_vector_twins_and_searches():
    res = subprocess.run(
        [sys.executable, "docs/examples/sb3_ppo.py", "512"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r"best found: ([0-9.]+) of the model's best forecast, after (\d+) runs", res.stdout)
    assert m and 0 < float(m.group(1)) < 2 and 1 <= int(m.group(2)) <= 30, res.stdout


def test_train_policy_then_the_policy_agent_runs_a_study_with_it(tmp_path):
    runner = CliRunner()
    policy = tmp_path / "policy.zip"
    res = runner.invoke(app, ["train-policy", SPACE, "--out", str(policy), "--steps", "256", "--twins", "2"])
    assert res.exit_code == 0, res.output
    assert policy.is_file() and "twins 1000..1001" in res.output
    space = tmp_path / "space.toml"
    text = (ROOT / SPACE).read_text()
    assert "[search.options]" not in text
    space.write_text(
        text.replace('agent = "optuna"\nsampler = "tpe"', 'agent = "policy"')
        + f'\n[search.options]\npolicy = "{policy}"\n'
    )
    out = tmp_path / "study"
    res = runner.invoke(app, ["run", "--space", str(space), "--trials", "6", "--twin-seed", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "dse.json").read_text())
    assert meta["agent"] == "policy" and meta["options"]["policy"] == str(policy)
    assert re.search(r"\b6 new trials", res.output)


def test_a_policy_trained_on_another_space_is_a_one_line_error(tmp_path):
    from dse.agents.base import load_agents, make_agent
    from dse.errors import UserError
    from tests.contracts import SPACE as TOY
    from tests.contracts import forecast, mask

    policy = tmp_path / "policy.zip"
    assert CliRunner().invoke(app, ["train-policy", SPACE, "--out", str(policy), "--steps", "128"]).exit_code == 0
    with pytest.raises(UserError, match="trained on a space of"):
        make_agent("policy", load_agents(), TOY, action_mask=mask, forecast=forecast, policy=str(policy))
