"""The masked policy of the shortlist encoding: its candidates are untried valid points (the mask says which slots hold
one), it trains on several spaces at once and acts on a space it never saw, and its file is weights plus JSON
metadata that dse rebuilds, never a pickle."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")
pytest.importorskip("safetensors")

from dse.envs.search import as_space, make_env, table  # noqa: E402
from dse.errors import UserError  # noqa: E402
from dse.rl import leaderboard as lb  # noqa: E402
from dse.rl import shortlist as cd  # noqa: E402
from dse.rl.policy import META_KEY, load, load_shortlist  # noqa: E402
from dse.rl.training import train_policy, train_shortlist  # noqa: E402
from tests.helpers import dse, one_line_error  # noqa: E402

TRAIN = ["conf/spaces/llama3_8b_4l_h200_te_space.toml", "conf/spaces/llama3_70b_12l_h200_x2_local_space.toml"]
HELD_OUT = "conf/spaces/nemotron3_8b_space.toml"  # another model, another knob set


@pytest.fixture(scope="module")
def shortlist_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "shared.safetensors"
    train_shortlist(TRAIN, out, twins=2, steps=64, budget=10)
    return out


def test_the_candidates_are_untried_valid_points_and_the_mask_says_which_slots_hold_one():
    s = as_space(HELD_OUT)
    game = make_env(s, "sim", twin_seed=0, budget=30, table_=table(s))
    env = cd.ShortlistEnv(game, [0, 1])
    obs, _ = env.reset(seed=0)
    assert obs.shape == (cd.OBS_DIM,) and env.observation_space.contains(obs)
    seen = set()
    for _ in range(5):
        mask = env.action_masks()
        assert mask.all()  # 162 valid points: every slot holds one
        slot = int(np.flatnonzero(mask)[-1])
        key = tuple(int(v) for v in env.cand.keys[env.cand.point(slot)])
        assert key in game.forecasts and key not in seen
        seen.add(key)
        _, reward, done, _, info = env.step(slot)
        assert info["launched"] and reward == -1.0
        if done:
            break
    assert seen == game.tried


def test_an_out_of_memory_run_lowers_the_rank_of_points_near_the_border():
    keys = np.array([[0], [1], [2]])
    c = cd.Shortlist(keys, [3.0, 2.0, 1.95], [70.0, 76.0, 50.0], [80.0] * 3, budget=10)
    c.observation()
    assert list(c.slots[:3]) == [0, 1, 2]  # point 1 (95% of the memory) likely fits: its estimate leads
    c.observe(0, "oom", None)  # forecast at 87.5% of the memory ran out: a miss of 12.5%
    c.observation()
    assert list(c.slots[:2]) == [2, 1]  # point 1 now unlikely to fit: after the slightly slower point 2
    assert c.fit()[1] < 0.1 < 0.99 < c.fit()[2]
    with pytest.raises(ValueError, match="holds no candidate"):
        c.point(5)


def test_a_run_below_its_forecast_lowers_the_points_like_it_most():
    """The estimate is the guided agent's residual model: one run 10% below its forecast lowers every point (the
    model's bias) but the points sharing its knob values more, so a point of other values overtakes its neighbour;
    a neighbour's uncertainty narrows more than that of a point sharing nothing with the run."""
    keys = np.array([[0, 0], [0, 1], [1, 1]])
    c = cd.Shortlist(keys, [1.0, 0.99, 0.98], [10.0] * 3, [80.0] * 3, budget=10)
    c.observation()
    assert list(c.slots[:3]) == [0, 1, 2]  # the model's order before any run
    c.observe(0, "ok", 0.9)
    est, sd = c.estimates(), c.spread()
    assert est[1] < np.log(0.99) and est[2] < np.log(0.98)  # every point lowered (the model's overall bias)
    assert est[1] - np.log(0.99) < est[2] - np.log(0.98)  # its neighbour (knob value 0 shared) more
    assert sd[1] < sd[2]
    c.observation()
    assert list(c.slots[:2]) == [2, 1]


def test_a_point_forecast_just_beyond_the_memory_is_not_put_last():
    """A soft margin, not a cut: the best point forecast at 100.4% of the GPU's memory is about as likely to fit
    as not, and comes before much slower points that surely fit; one far beyond the memory comes last."""
    keys = np.arange(4).reshape(4, 1)
    c = cd.Shortlist(keys, [2.0, 1.6, 1.5, 2.2], [80.3, 60.0, 50.0, 96.0], [80.0] * 4, budget=10)
    c.observation()
    assert 0.4 < c.fit()[0] < 0.5 and c.fit()[3] < 1e-3
    assert list(c.slots[:4]) == [0, 1, 2, 3]


def test_the_file_is_weights_and_json_never_a_pickle(shortlist_file):
    from safetensors import safe_open

    raw = shortlist_file.read_bytes()
    assert b"\x80\x04" not in raw[:16] and raw[8:9] == b"{"
    with safe_open(str(shortlist_file), framework="pt") as f:
        meta = json.loads(f.metadata()[META_KEY])
        assert all(f.get_slice(k).get_dtype() == "F32" for k in f.keys())
    assert meta["encoding"] == "shortlist" and meta["action_sizes"] == [cd.SLOTS]
    assert meta["observation_dim"] == cd.OBS_DIM
    policy = load_shortlist(shortlist_file)
    obs = np.zeros(cd.OBS_DIM, dtype=np.float32)
    mask = np.zeros(cd.SLOTS, dtype=bool)
    mask[3] = True
    assert policy.choose(obs, mask) == 3  # only what the mask allows


def test_it_acts_on_a_held_out_space_through_the_leaderboard(shortlist_file):
    s = as_space(HELD_OUT)
    game = make_env(s, "sim", twin_seed=0, budget=30, table_=table(s))
    agent = lb._agent(game, "policy", 0, shortlist_file, {})
    ep = lb.play(game, agent, "held-out", "policy", twin=3, seed=0)
    assert ep.refused == 0  # the candidates are valid untried points
    assert ep.runs >= 1 and ep.proposals == ep.runs + (ep.end == "stopped")


def test_the_two_encodings_refuse_each_other_and_a_pickle(shortlist_file, tmp_path):
    one = tmp_path / "one.safetensors"
    train_policy(TRAIN[0], one, twins=1, steps=64, budget=5)
    with pytest.raises(UserError, match="shortlist encoding"):
        load_shortlist(one)
    with pytest.raises(UserError, match="shortlist encoding"):
        load(shortlist_file, [cd.SLOTS], cd.OBS_DIM)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(pickle.dumps({"weights": np.zeros(3)}))
    with pytest.raises(UserError, match="not a safetensors file"):
        load_shortlist(bad)


def test_each_training_seed_draws_its_own_twins_of_the_train_split():
    from dse.envs import suite
    from dse.rl.training import training_twins

    a, b, again = training_twins(16, 0), training_twins(16, 1), training_twins(16, 0)
    spaces = suite.benchmarks("train")
    assert len(a) == len(spaces) and a == again  # a function of the seed
    for sp, x, y in zip(spaces, a, b):
        lo, hi = sp.twin_range("train")
        assert len(set(x)) == 16 and all(lo <= t <= hi for t in x + y)
        assert not set(x) & set(y)  # another seed, other twins (2**32 of them to draw from)
        assert not any(
            sp.twin_range(other)[0] <= t <= sp.twin_range(other)[1] for other in ("test", "validation") for t in x
        )


def test_train_policy_shared_inputs_are_one_line(tmp_path):
    one_line_error(dse("train-policy", *TRAIN, "--out", tmp_path / "p.safetensors"), "SPACE", "--shortlist")
    one_line_error(
        dse("train-policy", *TRAIN, "--shortlist", "--twins", "0", "--out", tmp_path / "p.safetensors"), "--twins"
    )
    assert list(tmp_path.iterdir()) == []
