"""``dse bench-agents``: the agent leaderboard runs each agent through the environment (a refused proposal is a step
the environment charges), writes the CSV's columns with 95% bootstrap intervals around each figure, and refuses
bad inputs in one line before any episode runs."""

from __future__ import annotations

import csv
import math
import pickle

import optuna
import pytest

from dse.envs.search import as_space, make_env, table
from dse.rl import leaderboard as lb
from tests.helpers import dse, one_line_error

TINY = "conf/spaces/llama3_8b_4l_h200_te_space.toml"  # 32 raw points, 24 valid: episodes of a few steps
SPACE = "conf/spaces/nemotron3_8b_space.toml"


def test_the_csv_has_every_column_and_each_interval_holds_its_figure(tmp_path):
    out, page = tmp_path / "lb.csv", tmp_path / "lb.md"
    r = dse(
        "bench-agents", "--space", TINY, "--twins", "3", "--seeds", "2", "--budget", "20", "--csv", out, "--page", page
    )
    assert r.exit_code == 0, r.output
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == lb.COLUMNS
    assert [x["agent"] for x in rows] == list(lb.DEFAULT_AGENTS)
    for x in rows:
        assert (x["episodes"], x["twins"], x["seeds"], x["budget"], x["truth"]) == ("6", "3", "2", "20", lb.TRUTH)
        for stat in ("runs_to_99_median", "runs_to_99_p90", "gpu_hours_to_99_median"):
            v, lo, hi = (float(x[stat + s]) for s in ("", "_lo", "_hi"))
            assert lo <= v <= hi, (x["agent"], stat)
    guided = next(x for x in rows if x["agent"] == "guided")
    assert float(guided["solved_share"]) == 1.0 and 1 <= float(guided["runs_to_99_median"]) <= 20
    text = page.read_text()
    assert "| guided |" in text and "measured: on simulated twins" in text and "dse bench-agents --space" in text
    assert f"TPE: Optuna {optuna.__version__})" in text  # TPE's draws for a seed differ between Optuna releases


def test_refused_proposals_are_steps_the_environment_charges():
    """TPE does not use the rules as a mask: its refused proposals are steps (proposals) but cost no run."""
    s = as_space(SPACE)
    game = make_env(s, "sim", twin_seed=0, budget=40, table_=table(s))
    agent = lb._agent(game, "tpe", 0, None, {})
    ep = lb.play(game, agent, "b", "tpe", twin=0, seed=0)
    assert ep.refused > 0
    assert ep.proposals == ep.runs + ep.refused == game.proposals
    assert ep.end == "solved" and ep.runs_to_target == ep.runs


def test_an_unreached_target_is_censored_above_the_budget():
    eps = [
        lb.Episode("b", "a", t, 0, None, None, 5, 5, 0, 1.0, 0.9, "budget", 5)
        if t < 3
        else lb.Episode("b", "a", t, 0, 2, 0.5, 2, 2, 0, 0.5, 1.0, "solved", 5)
        for t in range(5)
    ]
    (row,) = lb.rows(eps, resamples=200)
    assert row.solved_share == pytest.approx(0.4)
    assert row.runs_to_99_median == 6  # budget + 1: more than the budget
    assert math.isinf(row.gpu_hours_to_99_median)
    assert lb.shown(row.runs_to_99_median, 5) == ">5"
    assert "inf" in lb.to_csv([row]).splitlines()[1]


@pytest.mark.parametrize(
    "args, field",
    [
        (["--twins", "0"], "--twins"),
        (["--twins", "201"], "--twins"),
        (["--seeds", "0"], "--seeds"),
        (["--seeds", "21"], "--seeds"),
        (["--budget", "0"], "--budget"),
        (["--agent", "nope"], "--agent"),
        (["--agent", "policy"], "--policy"),
    ],
)
def test_bad_inputs_are_one_line_before_any_episode(tmp_path, args, field):
    one_line_error(dse("bench-agents", "--space", TINY, "--csv", tmp_path / "x.csv", *args), field)
    assert list(tmp_path.iterdir()) == []


def test_a_pickled_policy_is_refused_unopened(tmp_path):
    bad = tmp_path / "p.safetensors"
    bad.write_bytes(pickle.dumps({"weights": [1.0]}))
    one_line_error(
        dse("bench-agents", "--space", TINY, "--policy", bad, "--csv", tmp_path / "x.csv"), "not a safetensors"
    )
    assert not (tmp_path / "x.csv").exists()


def test_the_suite_s_benchmarks_a_replay_included(tmp_path):
    out = tmp_path / "lb.csv"
    replay, twins = "dse/Replay-Llama8B-4L-H200-TE-v0", "dse/Llama405B-2Node-H100-v0"
    args = ["--benchmark", replay, "--benchmark", twins, "--twins", "2", "--agent", "guided", "--csv", out]
    r = dse("bench-agents", *args, "--seeds", "2")
    assert r.exit_code == 0, r.output
    with out.open(newline="") as fh:
        rows = {x["benchmark"]: x for x in csv.DictReader(fh)}
    assert rows[twins]["truth"] == lb.TRUTH and rows[twins]["episodes"] == "4"  # 2 twins x 2 seeds
    assert rows[twins]["budget"] == "50"  # the benchmark's own
    assert rows[replay]["truth"] == lb.REPLAY_TRUTH and rows[replay]["episodes"] == "2"  # one truth x 2 seeds
    assert rows[replay]["budget"] == "24"  # every point of the replayed study


def test_an_unknown_benchmark_is_one_line_naming_the_split_s_ids(tmp_path):
    line = one_line_error(dse("bench-agents", "--benchmark", "dse/Nope-v0", "--csv", tmp_path / "x.csv"), "--benchmark")
    assert "dse/Qwen3-30B-A3B-H100-v0" in line
    one_line_error(dse("bench-agents", "--split", "dev", "--csv", tmp_path / "x.csv"), "--split")
    assert list(tmp_path.iterdir()) == []
