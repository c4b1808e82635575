"""Fuzz: the Gymnasium environment's arguments and actions. Hypothesis draws hostile values for each argument of
``dse/Recipe-v0`` and hostile actions; what may happen is declared: the environment is made, or a ``TypeError`` /
``ValueError`` names the argument; a step returns Gymnasium's 5-tuple, or a ``ValueError`` says the action is not
in the action space. A bounded number of examples, so it runs in seconds in CI."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dse.envs  # noqa: F401 (registers dse/Recipe-v0)

SPACE = "conf/spaces/nemotron3_8b_space.toml"  # small: 216 raw points
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
HOSTILE = st.one_of(
    st.sampled_from([0, -1, -5, 1, 2**32 - 1, 2**32, 2**70, 10**400, True, False, None, "3", "no", b"x", 1 + 0j]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
)
ARGS = ["budget", "target", "run_cost", "waste_cost", "twin_seed", "in_memory", "seed"]


@FAST
@given(name=st.sampled_from(ARGS), value=HOSTILE)
def test_a_hostile_argument_makes_the_environment_or_names_itself(name, value):
    try:
        env = gym.make("dse/Recipe-v0", space=SPACE, backend="sim", twin_seed=0, budget=5, **{name: value})
    except (TypeError, ValueError) as e:
        assert name in str(e), e
        return
    obs, _ = env.reset(seed=0)
    assert np.all(np.isfinite(obs))
    env.close()


ACTIONS = st.one_of(
    st.lists(st.one_of(st.integers(-3, 10), st.floats(), st.booleans(), st.just(2**70)), min_size=0, max_size=7),
    st.sampled_from(["00000", 3, None, np.zeros((1, 5), dtype=np.int64), np.array([0.5, 0, 0, 0, 0])]),
)


@FAST
@given(actions=st.lists(ACTIONS, min_size=1, max_size=6))
def test_a_hostile_action_steps_or_is_refused_and_the_environment_goes_on(actions):
    env = gym.make("dse/Recipe-v0", space=SPACE, backend="sim", twin_seed=0, budget=5)
    env.reset(seed=0)
    for action in actions:
        try:
            _, reward, terminated, truncated, _ = env.step(action)
        except ValueError as e:
            assert "not in the action space" in str(e), e
            continue
        assert math.isfinite(reward)
        if terminated or truncated:
            env.reset(seed=1)
    env.close()
