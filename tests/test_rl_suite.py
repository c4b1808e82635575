"""The benchmark suite (:mod:`dse.envs.suite`): ids make and step, twin splits disjoint, held-out spaces and replays
never in the training splits, and the shared encoding acting on spaces with different knob sets."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

import dse.envs  # noqa: F401  (registers the suite)
from dse.envs import suite
from dse.envs.suite import SUITE, TWIN_SPLITS, Candidates, benchmarks, columns
from dse.rl.searchgame import action_of
from dse.rules.space import load_space

SMALL = "dse/Nemotron3-8B-H100-v0"  # a training space with few points: fast to build
HELD = "dse/Qwen3-30B-A3B-H100-v0"


def test_every_id_is_registered_and_the_ids_are_unique():
    assert len({b.id for b in SUITE}) == len(SUITE) >= 12
    for b in SUITE:
        assert b.id in gym.registry and gym.spec(b.id).kwargs == {"benchmark": b.id}


def test_the_twin_splits_are_disjoint_and_cover_every_seed():
    ranges = sorted(TWIN_SPLITS.values())
    assert ranges[0][0] == 0 and ranges[-1][1] == 2**32 - 1
    for (_, hi), (lo, _) in zip(ranges, ranges[1:]):
        assert lo == hi + 1  # no seed in two splits, none in no split


def test_held_out_spaces_and_replays_are_in_the_test_split_only():
    train = {b.id for b in benchmarks("train")}
    val = {b.id for b in benchmarks("validation")}
    test = {b.id for b in benchmarks("test")}
    held = {b.id for b in SUITE if b.held_out}
    assert train == val and train and held and train <= test and held & test
    assert not held & train
    # a held-out space differs from every training space on the axis it names
    tr = [load_space(b.space) for b in SUITE if not b.held_out]
    for b in SUITE:
        if b.replay:
            continue
        s = load_space(b.space)
        if b.held_out == "model":
            assert all(s.recipe != t.recipe for t in tr), b.id
        elif b.held_out == "gpu":
            assert all(s.system.gpu != t.system.gpu for t in tr), b.id
        elif b.held_out == "scale":
            gpus = s.num_nodes * s.system.gpus_per_node
            assert all((s.recipe, gpus) != (t.recipe, t.num_nodes * t.system.gpus_per_node) for t in tr), b.id
    with pytest.raises(ValueError, match="test split only"):
        gym.make(HELD, split="train")
    with pytest.raises(ValueError, match="split takes one of"):
        gym.make(SMALL, split="dev")


def test_a_suite_id_makes_and_steps_and_draws_twins_of_its_split_only():
    env = gym.make(SMALL, split="validation")
    lo, hi = TWIN_SPLITS["validation"]
    seen = set()
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        assert lo <= info["twin_seed"] <= hi and env.observation_space.contains(obs)
        seen.add(info["twin_seed"])
        mask = info["action_mask"]
        key = np.unravel_index(int(np.flatnonzero(mask[:-1])[0]), env.unwrapped.sizes)
        obs, reward, terminated, truncated, info = env.step(action_of(key))
        assert info["launched"] and info["status"] in ("ok", "oom", "failed")
    assert len(seen) == 5
    assert env.unwrapped.budget == suite.get(SMALL).budget
    with pytest.raises(ValueError, match="options\\['twin_seed'\\] takes an integer from 10,000"):
        env.reset(options={"twin_seed": 5})  # a test twin: not in the validation split
    env.reset(options={"twin_seed": lo + 7})
    assert env.unwrapped.twin_seed == lo + 7
    # the training split's environment never meets a test or validation twin
    tr = gym.make(SMALL)  # a training space defaults to the train split
    assert tr.unwrapped.twin_seed == TWIN_SPLITS["train"][0]
    assert all(tr.reset(seed=s)[1]["twin_seed"] >= TWIN_SPLITS["train"][0] for s in range(20))
    pickle.loads(pickle.dumps(tr.unwrapped))  # async vector forms need it


def test_the_vector_form_gives_distinct_twins_of_the_split():
    vec = gym.make_vec(SMALL, num_envs=3, split="test")
    _, info = vec.reset(seed=0)
    twins = list(info["twin_seed"])
    assert len(set(twins)) == 3 and all(TWIN_SPLITS["test"][0] <= t <= TWIN_SPLITS["test"][1] for t in twins)


@pytest.mark.parametrize("b", [b for b in SUITE if b.replay and b.available], ids=lambda b: b.id)
def test_a_replay_benchmark_plays_the_measured_runs(b):
    env = b.make("test")
    obs, info = env.reset(seed=0)
    game = env.unwrapped
    assert game.true_best is not None and len(game.forecasts) <= b.budget
    statuses = set()
    done = False
    while not done:
        key = np.unravel_index(int(np.flatnonzero(info["action_mask"][:-1])[0]), game.sizes)
        obs, _, terminated, truncated, info = env.step(action_of(key))
        statuses.add(info["status"])
        done = terminated or truncated
    assert terminated and info["runs"] == len(game.forecasts) and info["solved"]  # every measured point ran
    assert "ok" in statuses


def test_the_shared_encoding_has_the_same_columns_for_spaces_with_different_knobs():
    a = Candidates(gym.make(SMALL, split="test"))
    b = Candidates(gym.make("dse/Mixtral8x7B-H100-v0", split="test"))
    assert a.game.names != b.game.names  # different knob sets...
    oa, _ = a.reset(seed=0)
    ob, _ = b.reset(seed=0)
    assert oa.shape[1] == ob.shape[1] == len(columns())  # ...one row layout
    assert oa.shape[0] == len(a.game.forecasts) and a.action_space.n == oa.shape[0] + 1
    cols = columns()
    # values, not positions: a row's tp column is the point's tp, wherever the space lists it
    tp = cols.index("tp")
    names = a.game.names
    for i, key in enumerate(a.keys[:20]):
        v = load_space(suite.get(SMALL).space).knobs["tp"][key[names.index("tp")]]
        assert oa[i, tp] == pytest.approx(np.log2(1 + v) / suite.INT_SCALE)
    # a knob the space fixes is still given: ep is 1 in every dense point, varied in the MoE space
    ep = cols.index("ep")
    assert np.allclose(oa[:, ep], np.log2(2) / suite.INT_SCALE) and len(set(ob[:, ep].tolist())) > 1


def test_the_candidate_action_steps_the_game_and_the_mask_follows():
    env = Candidates(gym.make(SMALL, split="test"))
    obs, info = env.reset(seed=1)
    tried = columns().index("tried")
    assert info["candidate_mask"].all() and obs[:, tried].sum() == 0
    obs, reward, term, trunc, info = env.step(3)
    assert info["launched"] and info["action"] == env.keys[3]
    assert obs[3, tried] == 1 and not env.action_masks()[3] and env.action_masks()[-1]
    assert env.game.history.runs == 1
    # a point run twice launches nothing: the game's own repeat
    _, _, _, _, info = env.step(3)
    assert info["status"] == "repeat" and not info["launched"]
    _, _, term, _, info = env.step(len(env.keys))  # stop
    assert term and info["stop"]
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(len(env.keys) + 1)


@pytest.mark.parametrize("b", [b for b in SUITE if not b.replay], ids=lambda b: b.id)
def test_every_twin_benchmark_makes_steps_and_encodes(b):
    env = Candidates(b.make(b.splits[0]))
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and obs.shape[0] >= 50  # enough points to search
    assert env.game.budget == b.budget and env.game.true_best is not None
    _, _, _, _, info = env.step(int(np.argmax(obs[:, columns().index("forecast")])))  # the model's favourite
    assert info["launched"] and env.game.history.runs == 1
