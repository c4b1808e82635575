"""``dse/Recipe-v0``: registered, vectorised over twins, Gymnasium's checker, and its in-memory truth."""

from __future__ import annotations

import gc

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import dse.envs
from dse.envs.search import make_env, table
from dse.errors import UserError
from dse.rl.searchgame import action_of, features
from dse.rules.space import load_space

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
    sp = load_space(SPACE)
    assert env.observation_space.contains(obs) and obs.shape == (
        len(features(sp.knob_names, [len(sp.knobs[n]) for n in sp.knob_names])),
    )


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
    action = np.tile(action_of(top), (3, 1))
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


def test_a_game_removes_the_log_directory_made_for_it_and_never_one_it_was_given(space, tab, tmp_path):
    """Without ``out_dir`` an on-disk game writes its runs' logs to a temporary directory of its own, removed when the
    game is closed or collected (each such game of the tests and benchmarks left one behind); a directory the
    caller names is the caller's and stays."""
    key = next(iter(tab.forecasts))
    game = make_env(space, twin_seed=1, table_=tab, in_memory=False)
    scratch = game.scratch
    game.truth(key)
    assert scratch.name.startswith("dse-env-") and any((scratch / "trials").iterdir())
    game.close()
    assert not scratch.exists() and game.scratch is None
    dropped = make_env(space, twin_seed=1, table_=tab, in_memory=False).scratch
    gc.collect()
    assert not dropped.exists()
    kept = make_env(space, twin_seed=1, table_=tab, in_memory=False, out_dir=tmp_path)
    kept.truth(key)
    kept.close()
    assert kept.scratch is None and any((tmp_path / "trials").iterdir())


def test_the_budget_truncates_the_step_that_spends_it_and_nothing_launches_past_it(space, tab):
    env = make_env(space, twin_seed=4, table_=tab, budget=3)
    env.reset()  # no seed: twin 4 (a seed would draw another twin)
    ok_keys = [k for k in tab.forecasts if env.truth(k).status == "ok"]
    worst = sorted(ok_keys, key=lambda k: env.truth(k).reward)[:4]
    ends = [env.step(action_of(k))[2:4] for k in worst[:3]]
    assert ends == [(False, False), (False, False), (False, True)]  # truncated: the budget of 3 runs is spent
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(action_of(worst[3]))
    assert len(env.tried) == 3 and env.history.runs == 3


def test_the_truths_best_ends_nothing_and_changes_no_reward(space, tab):
    """The twin's best is an oracle: the episode goes on after it is found, and the rewards and observations are
    those of a game that does not know it; only info's scores use it."""
    env = make_env(space, twin_seed=4, table_=tab, budget=5)
    blind = make_env(space, twin_seed=4, table_=tab, budget=5)
    env.reset(), blind.reset()
    blind.true_best = None
    ok_keys = [k for k in tab.forecasts if env.truth(k).status == "ok"]
    top = max(ok_keys, key=lambda k: env.truth(k).reward)
    for key in [top, *ok_keys[:2]]:
        a, b = env.step(action_of(key)), blind.step(action_of(key))
        assert np.array_equal(a[0], b[0]) and a[1:4] == b[1:4]
        assert not (a[2] or a[3])  # the best point found ends nothing
        assert a[4]["solved"] and a[4]["of_true_best"] >= env.target
        assert "of_true_best" not in b[4] and not b[4]["solved"]
    assert a[1] == pytest.approx(-env.run_cost)


def test_the_stop_action_ends_the_episode_launching_nothing_for_free(space, tab):
    env = make_env(space, twin_seed=4, table_=tab)
    obs0, _ = env.reset()
    key = next(iter(tab.forecasts))
    obs, reward, terminated, truncated, info = env.step(action_of(key, stop=True))
    assert terminated and not truncated and reward == 0.0
    assert info["status"] == "stop" and info["stop"] and not info["launched"] and not env.tried
    assert np.array_equal(obs, obs0)
    assert env.action_masks()[-1]  # stop is always allowed
    with pytest.raises(RuntimeError):
        env.step(action_of(key))
    env.reset()
    assert env.step(action_of(key))[4]["launched"]


def test_a_repeat_is_its_own_status_and_the_observation_counts_the_tried_values(space, tab):
    env = make_env(space, twin_seed=0, table_=tab)
    env.reset()
    names = features(space.knob_names, tab.sizes)
    keys = list(tab.forecasts)[:3]
    for key in keys:
        obs, *_ = env.step(action_of(key))
    valid = np.array(list(tab.forecasts))
    for j, n in enumerate(space.knob_names):
        for i in range(tab.sizes[j]):
            tried = sum(k[j] == i for k in keys)
            share = tried / max(int((valid[:, j] == i).sum()), 1)
            assert obs[names.index(f"tried.{n}[{i}]")] == pytest.approx(share)
    obs, reward, *_, info = env.step(action_of(keys[0]))
    assert info["status"] == "repeat" and not info["launched"] and reward == -env.waste_cost
    assert obs[names.index("status.repeat")] == 1.0 and obs[names.index("status.rejected")] == 0.0


def test_a_rejected_point_launches_nothing_and_costs_a_little(space, tab):
    env = make_env(space, twin_seed=0, table_=tab)
    env.reset(seed=0)
    sizes = tab.sizes
    bad = next(k for k in np.ndindex(*sizes) if k not in tab.forecasts)
    obs, reward, terminated, truncated, info = env.step(action_of(bad))
    assert info["status"] == "rejected" and not info["launched"] and info["runs"] == 0
    assert reward == -env.waste_cost and not (terminated or truncated)
    names = features(space.knob_names, sizes)
    assert obs[names.index("status.rejected")] == 1.0


def test_a_space_too_large_to_walk_is_a_one_line_error(tmp_path):
    from tests.test_big_spaces import CORE, write_space

    big = write_space(tmp_path / "big.toml", CORE, env_knobs=3, env_values=40)
    with pytest.raises(UserError, match="raw points"):
        make_env(big)


def test_without_the_rl_extra_the_policy_agent_is_a_one_line_error_naming_it(monkeypatch):
    import dse.rl.policy
    from dse.agents.base import load_agents, make_agent
    from tests.contracts import SPACE as TOY
    from tests.contracts import forecast, mask

    monkeypatch.setattr(dse.rl.policy, "available", lambda: False)
    with pytest.raises(UserError, match=r"pip install 'dse\[rl\]'"):
        make_agent("policy", load_agents(), TOY, action_mask=mask, forecast=forecast, train_steps=64)


def test_gym_make_imports_dse_envs_itself_through_the_module_prefix():
    env = gym.make("dse.envs:dse/Recipe-v0", space=SPACE, twin_seed=1, budget=5)
    assert env.spec.id == "dse/Recipe-v0" and env.unwrapped.true_best is not None


@pytest.mark.parametrize(
    "bad",
    [
        [1.5, 0, 0, 0, 0, 0],
        [1.0, 0, 0, 0, 0, 0],  # integral, still a float: not an index
        [True, 0, 0, 0, 0, 0],
        [1 + 0j, 0, 0, 0, 0, 0],
        [float("inf"), 0, 0, 0, 0, 0],
        [2**70, 0, 0, 0, 0, 0],
        [-1, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 2],  # stop is 0 or 1
        [0, 0, 0, 0, 0],  # a point without its stop entry
        np.array([0.5, 0, 0, 0, 0, 0]),
        np.array([True, False, False, False, False, False]),
        np.zeros((1, 6), dtype=np.int64),
        "000000",
        3,
    ],
)
def test_an_action_outside_the_action_space_is_a_value_error_and_runs_nothing(space, tab, bad):
    env = make_env(space, twin_seed=0, table_=tab)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="is not in the action space"):
        env.step(bad)
    assert env.proposals == 0 and not env.tried  # nothing proposed, nothing run
    _, _, _, _, info = env.step([0, 0, 0, 0, 0, 0])  # the env still works, and ints of any integer type are indices
    env.step(np.array([0, 0, 0, 0, 1, 0], dtype=np.uint8))
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
