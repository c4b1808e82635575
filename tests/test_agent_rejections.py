"""Agents stop after a bounded run of consecutive rejected points and say so: a space with no valid point
costs nothing to propose from, so without the bound an agent that learns from rejections never stops."""

from __future__ import annotations

from collections import OrderedDict

from gymnasium import spaces

from dse.agents.optuna_agent import OptunaAgent
from dse.agents.random import RandomAgent
from dse.rules.space import load_space
from dse.study.loop import Request, run_study
from tests.helpers import write_space

ALL_INVALID = """
name = "none_valid"
recipe = "llama3_8b"
system = "h100"
num_nodes = 1

[settings]
gbs = 128
max_steps = 5

[knobs]
tp = [3, 5, 6, 7]
"env.MY_A" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"env.MY_B" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"env.MY_C" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"env.MY_D" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"env.MY_E" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]

[search]
agent = "optuna"
trials = 5

[search.options]
max_rejected = 25

[backend]
kind = "sim"
payload = "sim"
allow_env = ["MY_A", "MY_B", "MY_C", "MY_D", "MY_E"]
"""


def _space(*sizes: int) -> spaces.Dict:
    return spaces.Dict(OrderedDict((f"k{i}", spaces.Discrete(n)) for i, n in enumerate(sizes)))


def test_optuna_on_a_space_with_no_valid_point_stops_after_max_rejected_and_says_so(tmp_path):
    """A space small enough to walk is refused before the study when it has no valid point (tests/
    test_empty_space.py); one of 400,000 raw points is drawn, not walked, and its agent must stop by itself."""
    result = run_study(load_space(write_space(tmp_path, ALL_INVALID)), Request(out_dir=tmp_path / "out"))
    assert result.new_trials == 25 and all(r.status == "rejected" for r in result.records)
    assert result.stop_reason is not None and "25 proposed points in a row were rejected" in result.stop_reason


def test_optuna_counts_only_consecutive_rejections():
    agent = OptunaAgent(_space(10, 10), seed=0, max_rejected=3)
    for status in ("rejected", "rejected", "ok", "rejected", "rejected"):
        action = agent.propose()
        assert action is not None
        agent.observe(action, 1.0 if status == "ok" else -1.0, status == "ok", status=status)
    action = agent.propose()  # two in a row since the last launched point: it goes on
    assert action is not None
    agent.observe(action, -1.0, False, status="oom")  # launched and failed: not a rejection, the run restarts
    for _ in range(3):
        action = agent.propose()
        assert action is not None
        agent.observe(action, -1.0, False, status="rejected")
    assert agent.propose() is None and "3 proposed points in a row" in (agent.stop_reason or "")


def test_random_without_a_mask_stops_after_a_run_of_rejections():
    agent = RandomAgent(_space(100, 100), seed=1, max_invalid_draws=4)
    for _ in range(4):
        action = agent.propose()
        assert action is not None
        agent.observe(action, -1.0, False, status="rejected")
    assert agent.propose() is None and "random: 4 proposed points in a row" in (agent.stop_reason or "")


def test_random_on_a_listed_space_with_no_valid_point_stops_without_walking_it():
    agent = RandomAgent(_space(1000, 1000), seed=1, action_mask=lambda a: False, max_invalid_draws=50)
    assert agent.propose() is None and "50 draws in a row" in (agent.stop_reason or "")


def test_a_resumed_random_walk_is_not_stopped_by_the_points_it_ran():
    agent = RandomAgent(_space(30, 30), seed=2, action_mask=lambda a: True, max_invalid_draws=10)
    ran = [agent.propose() for _ in range(200)]
    again = RandomAgent(_space(30, 30), seed=2, action_mask=lambda a: True, max_invalid_draws=10)
    again.warm_start((a, 1.0, True, "ok", None) for a in ran if a is not None)
    assert again.propose() not in ran and again.stop_reason is None
