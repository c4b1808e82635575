"""dse/Recipe-v0's action mask, its twin per reset, pickling and vector forms."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

import dse.envs  # noqa: F401  (registers dse/Recipe-v0)
from dse.envs.search import make_env, table
from dse.rl.searchgame import action_of
from dse.rules.space import load_space

SPACE = "conf/spaces/nemotron3_8b_space.toml"  # small: 216 raw points, 162 valid


@pytest.fixture(scope="module")
def tab():
    return table(load_space(SPACE))


def outcomes(env, keys):
    return [env.truth(k).reward for k in keys]


def test_the_mask_is_false_exactly_where_a_step_would_launch_nothing(tab):
    env = make_env(tab.space, twin_seed=2, table_=tab)
    _, info = env.reset(seed=0)
    assert np.array_equal(info["action_mask"], env.action_masks())
    for key in list(tab.forecasts)[:5]:  # some points tried: the mask must drop them
        *_, info = env.step(action_of(key))
    mask = env.action_masks()
    assert np.array_equal(info["action_mask"], mask)
    assert mask.shape == (int(np.prod(tab.sizes)) + 1,) and mask.dtype == bool and mask[-1]  # the last: stop
    for key in np.ndindex(*tab.sizes):  # every action of the space, each from the same state
        probe = copy.deepcopy(env)
        *_, info = probe.step(action_of(key))
        assert bool(mask[np.ravel_multi_index(key, tab.sizes)]) == info["launched"], (key, info["status"])
        assert info["launched"] or info["status"] in ("rejected", "repeat")
    assert 0 < mask[:-1].sum() < len(tab.forecasts)


def test_reset_with_a_seed_draws_a_twin_and_the_same_seed_the_same_twin(tab):
    env = make_env(tab.space, twin_seed=0, table_=tab)
    keys = list(tab.forecasts)[::20]
    env.reset(seed=0)
    first, best0 = outcomes(env, keys), env.true_best
    env.reset(seed=123)
    assert outcomes(env, keys) != first and env.true_best != best0
    env.reset(seed=0)
    assert outcomes(env, keys) == first and env.true_best == best0
    env.reset()  # no seed: the same twin
    assert outcomes(env, keys) == first


def test_the_twin_seed_option_pins_a_twin(tab):
    env = make_env(tab.space, twin_seed=0, table_=tab)
    _, info = env.reset(seed=5, options={"twin_seed": 7})
    assert info["twin_seed"] == 7
    seven = make_env(tab.space, twin_seed=7, table_=tab)
    keys = list(tab.forecasts)[::20]
    assert outcomes(env, keys) == outcomes(seven, keys) and env.true_best == seven.true_best
    with pytest.raises(ValueError, match="twin_seed"):
        env.reset(options={"twin_seed": -1})
    with pytest.raises(ValueError, match="twin_seed only"):
        env.reset(options={"space": 1})


def test_the_environment_pickles_and_steps_identically(tab):
    env = gym.make("dse/Recipe-v0", space=SPACE, twin_seed=3, budget=20)
    env.reset(seed=1)
    env.step(action_of(next(iter(tab.forecasts))))
    clone = pickle.loads(pickle.dumps(env))
    rng = np.random.default_rng(0)
    for _ in range(15):
        a = action_of(rng.integers(0, tab.sizes))
        x, y = env.step(a), clone.step(a)
        assert np.array_equal(x[0], y[0]) and x[1:4] == y[1:4] and x[4]["status"] == y[4]["status"]


def test_a_sync_vector_env_draws_a_distinct_twin_per_sub_environment(tab):
    vec = gym.make_vec("dse/Recipe-v0", num_envs=3, vectorization_mode="sync", space=SPACE, twin_seed=0)
    _, info = vec.reset(seed=0)
    seeds = list(info["twin_seed"])
    assert len(set(seeds)) == 3
    keys = list(tab.forecasts)[::20]
    assert len({tuple(outcomes(e.unwrapped, keys)) for e in vec.envs}) == 3
    assert info["action_mask"].shape == (3, int(np.prod(tab.sizes)) + 1)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasiums_vector_forms_step_and_batch_every_info(mode):
    """Each sub-environment steps its own twin, and info batches whatever the outcomes (a proposal that gave no
    objective beside one that did: its reward left out, as the mask says; the run's figures, whose fields differ by
    outcome, one object per sub-environment)."""
    vec = gym.make_vec("dse/Recipe-v0", num_envs=3, vectorization_mode=mode, space=SPACE, twin_seed=0, budget=8)
    try:
        _, info = vec.reset(seed=0)
        assert len(set(info["twin_seed"])) == 3
        rng = np.random.default_rng(0)
        nvec = vec.single_action_space.nvec
        statuses, seen_nan, seen_value = set(), False, False
        for _ in range(40):  # episodes end (budget 8) and the vector form resets them itself
            action = rng.integers(0, nvec, size=(3, len(nvec)))
            action[:, -1] = 0
            _, _, _, _, info = vec.step(action)
            assert info["metrics"].dtype == object and ("reward" not in info or info["reward"].dtype == float)
            for i in np.flatnonzero(info["_status"]):
                statuses.add(info["status"][i])
                ok = info["status"][i] == "ok"
                assert bool(info.get("_reward", np.zeros(3, bool))[i]) == ok
                seen_nan |= not ok
                seen_value |= ok
                if ok:
                    assert info["metrics"][i]["peak_memory_gib"] > 0 and dict(info["metrics"][i])
        assert seen_nan and seen_value and {"ok", "rejected"} <= statuses
    finally:
        vec.close()
