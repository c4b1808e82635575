"""``dse/Recipe-v0``: registered, vectorised over twins, Gymnasium's checker, and its in-memory truth."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import dse.envs
from dse.envs.search import make_env, table, twin_best
from dse.errors import UserError
from dse.perfmodel.twin import make_twin
from dse.searchgame import features
from dse.space import load_space

SPACE = "conf/spaces/nemotron3_8b_space.toml"  # small: 216 raw points, 162 valid


@pytest.fixture(scope="module")
def space():
    return load_space(SPACE)


@pytest.fixture(scope="module")
def tab(space):
    return table(space)


def test_importing_dse_envs_registers_the_environment():
    assert dse.envs.ENV_ID == "dse/Recipe-v0" and "dse/Recipe-v0" in gym.registry


def test_gym_make_passes_check_env():
    env = gym.make("dse/Recipe-v0", space=SPACE, backend="sim", twin_seed=2, budget=10)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and obs.shape == (len(features(load_space(SPACE).knob_names)),)


def test_the_vector_form_is_one_twin_per_sub_environment_and_each_passes_check_env():
    vec = gym.make_vec("dse/Recipe-v0", num_envs=3, space=SPACE, twin_seed=5, budget=10)
    assert vec.num_envs == 3
    games = [e.unwrapped for e in vec.envs]
    assert len({id(g.forecasts) for g in games}) == 1  # one table of the space, shared
    for g in games:
        check_env(g, skip_render_check=True)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (3, games[0].observation_space.shape[0])
    # the same point, three twins: three different measured values
    fits = {k: f for k, f in games[0].forecasts.items() if f.peak_memory_gib < 0.8 * f.memory_gib}
    top = max(fits, key=lambda k: fits[k].reward)
    action = np.tile(np.array(top, dtype=np.int64), (3, 1))
    _, rewards, *_, infos = vec.step(action)
    assert len(set(np.round(infos["reward"], 6))) == 3 and rewards.shape == (3,)


def test_in_memory_figures_are_the_figures_of_runs_on_disk(space, tab, tmp_path):
    """The fast path (log written into a string) gives exactly what the simulated backend's logs parse to."""
    fast = make_env(space, twin_seed=1, table_=tab)
    slow = make_env(space, twin_seed=1, table_=tab, in_memory=False, out_dir=tmp_path)
    keys = list(tab.forecasts)[::9]
    statuses = set()
    for key in keys:
        a, b = fast.truth(key), slow.truth(key)
        statuses.add(a.status)
        assert (a.status, a.reward, a.peak_memory_gib) == (b.status, b.reward, b.peak_memory_gib), key
    assert "ok" in statuses
    assert len(list((tmp_path / "trials").iterdir())) == len(keys)  # the slow path did run each point


def test_budget_truncates_and_the_stop_rule_terminates(space, tab):
    twin = make_twin(space, 4, trials=tab.trials)
    best = twin_best(space, tab, twin)
    env = make_env(space, twin_seed=4, table_=tab, budget=3)
    env.reset()  # no seed: twin 4 (a seed would draw another twin)
    ok_keys = [k for k in tab.forecasts if env.truth(k).status == "ok"]
    worst = sorted(ok_keys, key=lambda k: env.truth(k).reward)[:3]
    ends = [env.step(np.array(k))[2:4] for k in worst]
    assert ends == [(False, False), (False, False), (False, True)]  # truncated: the budget of 3 runs is spent
    env.reset()
    top = max(ok_keys, key=lambda k: env.truth(k).reward)
    _, reward, terminated, truncated, info = env.step(np.array(top))
    assert terminated and not truncated and env.truth(top).reward >= 0.99 * best
    assert reward == pytest.approx(info["best_fraction"] - env.run_cost)


def test_a_rejected_point_launches_nothing_and_costs_a_little(space, tab):
    env = make_env(space, twin_seed=0, table_=tab)
    env.reset(seed=0)
    sizes = tab.sizes
    bad = next(k for k in np.ndindex(*sizes) if k not in tab.forecasts)
    obs, reward, terminated, truncated, info = env.step(np.array(bad))
    assert info["status"] == "rejected" and not info["launched"] and info["runs"] == 0
    assert reward == -env.waste_cost and not (terminated or truncated)
    names = features(space.knob_names)
    assert obs[names.index("status.rejected")] == 1.0


def test_a_space_too_large_to_walk_is_a_one_line_error(tmp_path):
    from tests.test_big_spaces import CORE, write_space

    big = write_space(tmp_path / "big.toml", CORE, env_knobs=3, env_values=40)
    with pytest.raises(UserError, match="raw points"):
        make_env(big)


def test_without_the_rl_extra_the_policy_agent_is_a_one_line_error_naming_it(monkeypatch):
    import dse.policy
    from dse.agents.base import load_agents, make_agent
    from tests.contracts import SPACE as TOY
    from tests.contracts import forecast, mask

    monkeypatch.setattr(dse.policy, "available", lambda: False)
    with pytest.raises(UserError, match=r"pip install 'dse\[rl\]'"):
        make_agent("policy", load_agents(), TOY, action_mask=mask, forecast=forecast, train_steps=64)


def test_gym_make_imports_dse_envs_itself_through_the_module_prefix():
    env = gym.make("dse.envs:dse/Recipe-v0", space=SPACE, twin_seed=1, budget=5)
    assert env.spec.id == "dse/Recipe-v0" and env.unwrapped.true_best is not None


@pytest.mark.parametrize(
    "bad",
    [
        [1.5, 0, 0, 0, 0],
        [1.0, 0, 0, 0, 0],  # integral, still a float: not an index
        [True, 0, 0, 0, 0],
        [1 + 0j, 0, 0, 0, 0],
        [float("inf"), 0, 0, 0, 0],
        [2**70, 0, 0, 0, 0],
        [-1, 0, 0, 0, 0],
        [0, 0, 0, 0],
        np.array([0.5, 0, 0, 0, 0]),
        np.array([True, False, False, False, False]),
        np.zeros((1, 5), dtype=np.int64),
        "00000",
        3,
    ],
)
def test_an_action_outside_the_action_space_is_a_value_error_and_runs_nothing(space, tab, bad):
    env = make_env(space, twin_seed=0, table_=tab)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="is not in the action space"):
        env.step(bad)
    assert env.proposals == 0 and not env.tried  # nothing proposed, nothing run
    _, _, _, _, info = env.step([0, 0, 0, 0, 0])  # the env still works, and ints of any integer type are indices
    env.step(np.array([0, 0, 0, 0, 1], dtype=np.uint8))
    assert env.proposals == 2 and info["action"] == (0, 0, 0, 0, 0)


def test_the_study_environment_refuses_an_action_outside_its_space(space, tmp_path):
    from dse.backends.sim import SimBackend
    from dse.envs import RecipeEnv

    env = RecipeEnv(space, SimBackend(), tmp_path)
    env.reset(seed=0)
    names = space.knob_names
    good = dict.fromkeys(names, 0)
    for bad in (
        {**good, names[0]: 1.5},
        {**good, names[0]: True},
        {**good, names[0]: float("inf")},
        {**good, names[0]: 10**6},
        {**good, "tp2": 0},
        {n: 0 for n in names[1:]},
        [0] * len(names),
    ):
        with pytest.raises(ValueError, match="is not in the action space"):
            env.step(bad)
    assert not (tmp_path / "trials").exists()  # nothing launched


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({"run_cost": float("nan")}, ValueError, "run_cost takes a finite number"),
        ({"run_cost": float("inf")}, ValueError, "run_cost"),
        ({"waste_cost": -1}, ValueError, "waste_cost"),
        ({"budget": 0}, ValueError, "budget takes an integer from 1"),
        ({"budget": -5}, ValueError, "budget"),
        ({"budget": 1.5}, TypeError, "budget takes an integer"),
        ({"budget": True}, TypeError, "budget"),
        ({"target": float("nan")}, ValueError, "target takes a finite number above 0"),
        ({"target": 0}, ValueError, "target"),
        ({"target": 1.5}, ValueError, "target"),
        ({"target": 10**400}, ValueError, "target"),
        ({"twin_seed": 2**70}, ValueError, "twin_seed takes an integer from 0 to 4,294,967,295"),
        ({"twin_seed": "3"}, TypeError, "twin_seed"),
        ({"twin_seed": -1}, ValueError, "twin_seed"),
        ({"seed": 1.0}, TypeError, "seed"),
        ({"in_memory": "no"}, TypeError, "in_memory takes True or False"),
        ({"backend": 3}, TypeError, "backend"),
        ({"out_dir": 3}, TypeError, "out_dir"),
        ({"space": 3}, TypeError, "space takes"),
        ({"no_such": 1}, TypeError, "no argument 'no_such'"),
    ],
)
def test_bad_arguments_are_a_clear_error_naming_the_argument(kwargs, error, needle):
    args = {"space": SPACE, "backend": "sim", **kwargs}
    with pytest.raises(error, match=needle):
        gym.make("dse/Recipe-v0", **args)


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({"num_envs": 0}, ValueError, "num_envs takes an integer from 1 to 1,024"),
        ({"num_envs": -1}, ValueError, "num_envs"),
        ({"num_envs": 2, "twin_seed": 2**32 - 1}, ValueError, "twin_seed"),
        ({"num_envs": 2, "twin_seeds": [0]}, ValueError, "twin_seeds has 1 seeds for num_envs=2"),
        ({"num_envs": 1, "twin_seeds": ["0"]}, TypeError, "twin_seeds"),
        ({"num_envs": 1, "budget": 0}, ValueError, "budget"),
    ],
)
def test_bad_vector_arguments_are_a_clear_error(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        gym.make_vec("dse/Recipe-v0", space=SPACE, **kwargs)
