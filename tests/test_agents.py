"""Each agent's own promise; what every agent promises is the contract suite (tests/contracts.py)."""

from __future__ import annotations

import itertools
from collections import OrderedDict

import pytest
from gymnasium import spaces

from dse.agents.base import action_key, load_agents, make_agent
from dse.errors import UserError

SPACE = spaces.Dict(OrderedDict([("b", spaces.Discrete(4)), ("a", spaces.Discrete(3)), ("c", spaces.Discrete(2))]))
ALL = set(itertools.product(range(3), range(4), range(2)))


def mask(action):  # "valid" points: a + b even
    return (action["a"] + action["b"]) % 2 == 0


def objective(action):  # a smooth landscape with its best at a=2, b=3, c=1
    return -((action["a"] - 2) ** 2) - (action["b"] - 3) ** 2 + action["c"]


def drive(agent, n, *, valid=mask):
    seen = []
    for _ in range(n):
        action = agent.propose()
        if action is None:
            break
        assert SPACE.contains({k: __import__("numpy").int64(v) for k, v in action.items()})
        seen.append(action_key(action, "abc"))
        ok = valid(action)
        agent.observe(action, objective(action) if ok else 0.0, ok)
    return seen


def new(name, seed=0, **kw):
    return make_agent(name, load_agents(), SPACE, seed=seed, action_mask=mask, **kw)


def test_grid_visits_every_valid_point_once_in_order():
    seen = drive(new("grid"), 100)
    # grid order follows the action space's order (b, a, c): b varies slowest
    valid = sorted((k for k in ALL if mask(dict(zip("abc", k)))), key=lambda k: (k[1], k[0], k[2]))
    assert seen == valid  # deterministic grid order, each valid point once, invalid ones never proposed


def test_random_visits_only_valid_points_and_depends_on_the_seed():
    a, b = drive(new("random", seed=1), 100), drive(new("random", seed=2), 100)
    assert all(mask(dict(zip("abc", k))) for k in a)
    assert sorted(a) == sorted(b) and a != b


def test_optuna_proposes_rejected_points_too_and_learns():
    agent = new("optuna", seed=0)
    seen = drive(agent, len(ALL))
    assert any(not mask(dict(zip("abc", k))) for k in seen)  # it ignores the mask: rejections are its data
    assert sorted(seen) == sorted(ALL)  # and, without repeats, it eventually covers the space
    # rejections reach the sampler without a value (PRUNED: TPE ignores FAIL trials), never as a sentinel
    for t in agent.study.trials:
        if t.state.name == "FAIL":  # the sampler proposed a point already tried (a repeat, see below)
            continue
        assert (t.state.name == "COMPLETE") == mask(t.params), t
        assert t.state.name in ("COMPLETE", "PRUNED") and (t.value is None) == (t.state.name == "PRUNED")
        if t.state.name == "COMPLETE":
            assert t.value == objective(t.params)


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_optuna_asks_its_sampler_once_a_proposal_and_tells_each_point_once(sampler):
    """A sampler that proposes a point already tried costs no further asks (each ask fits TPE to every trial told
    so far): its trial is told FAIL, which every sampler ignores, and an untried point near it is run instead. The
    sampler's history holds each point once, so its fit grows with the points tried, not with its repeats."""
    agent = new("optuna", seed=0, sampler=sampler)
    asks = []
    ask = agent.study.ask
    agent.study.ask = lambda *a, **k: asks.append(1) or ask(*a, **k)
    seen = drive(agent, len(ALL))
    assert sorted(seen) == sorted(ALL) and len(asks) <= len(seen)
    told = [tuple(t.params[n] for n in "bac") for t in agent.study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert sorted(told) == sorted((b, a, c) for a, b, c in ALL)  # each point once


def test_optuna_unknown_sampler_is_a_user_error():
    with pytest.raises(UserError, match="did you mean 'tpe'"):
        new("optuna", sampler="tpee")


def test_unknown_agent_is_a_user_error():
    with pytest.raises(UserError, match="did you mean 'grid'"):
        new("gird")


def test_optuna_ordinal_knobs_are_integer_distributions():
    agent = new("optuna", ordinal=["b", "c"])
    assert type(agent.dists["b"]).__name__ == "IntDistribution" and agent.dists["b"].high == 3
    assert type(agent.dists["a"]).__name__ == "CategoricalDistribution"
    seen = drive(agent, len(ALL))
    assert sorted(seen) == sorted(ALL)  # still every point once


def test_optuna_model_warm_start_proposes_the_models_top_points_first():
    from dse.agents.base import Forecast

    def forecast(action):  # the model's ranking: objective(); points with c = 0 predicted not to fit
        if not mask(action):
            return None
        return Forecast(float(objective(action)), 90.0 if action["c"] == 0 else 70.0, 80.0)

    agent = new("optuna", warm_start="model", forecast=forecast)
    ranked = sorted(
        (k for k in ALL if mask(dict(zip("abc", k))) and k[2] == 1), key=lambda k: -objective(dict(zip("abc", k)))
    )
    n = agent.WARM_START_POINTS
    first = drive(agent, n)
    cut = objective(dict(zip("abc", ranked[n - 1])))  # ties at the cut may go either way
    assert first[0] == ranked[0] and all(k[2] == 1 and objective(dict(zip("abc", k))) >= cut for k in first)
    plain = drive(new("optuna"), n)
    assert not all(k[2] == 1 and objective(dict(zip("abc", k))) >= cut for k in plain)


def test_optuna_unknown_warm_start_is_a_user_error():
    with pytest.raises(UserError, match="warm start"):
        new("optuna", warm_start="modle")


SAMPLERS = ("tpe", "random", "qmc", "nsga2", "gp", "cmaes")


def _sequence(sampler: str, seed: int, n: int = 8) -> list[tuple[int, ...]]:
    from collections import OrderedDict as _OD

    space = spaces.Dict(_OD(tp=spaces.Discrete(4), pp=spaces.Discrete(5), mbs=spaces.Discrete(3)))
    agent = make_agent("optuna", load_agents(), space, seed=seed, sampler=sampler, ordinal=["tp", "pp", "mbs"])
    out = []
    for _ in range(n):
        a = agent.propose()
        out.append((a["tp"], a["pp"], a["mbs"]))
        agent.observe(a, float(a["tp"] * 3 - (a["pp"] - 2) ** 2 + a["mbs"]), True, status="ok", metrics={})
    return out


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_honours_the_seed(sampler):
    import importlib.util

    from dse.agents.optuna_agent import SAMPLER_NEEDS

    missing = [m for m, _ in SAMPLER_NEEDS.get(sampler, ()) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{sampler} needs {', '.join(missing)} (an optional extra), not installed here")
    assert _sequence(sampler, 1) == _sequence(sampler, 1)
    # beyond the first trial (an unscrambled QMC sampler differed by seed at trial 0 only)
    assert _sequence(sampler, 1)[1:] != _sequence(sampler, 2)[1:]


def test_a_sampler_without_its_dependency_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(UserError, match=r"sampler 'gp' needs torch.*pip install 'dse\[gp\]'"):
        make_agent("optuna", load_agents(), SPACE, sampler="gp")


def test_cmaes_is_refused_on_categorical_knobs_with_the_reason():
    with pytest.raises(UserError, match="cmaes samples only ordered knobs"):
        make_agent("optuna", load_agents(), SPACE, sampler="cmaes")


def test_optuna_tpe_settings_reach_the_sampler():
    """``tpe_startup`` is TPE's random start: the same seed gives the same first points, then TPE takes over
    sooner; ``tpe_multivariate`` models the knobs jointly, so its proposals after the start differ too."""
    plain = drive(new("optuna", seed=3), 16)
    early = drive(new("optuna", seed=3, tpe_startup=2), 16)
    joint = drive(new("optuna", seed=3, tpe_multivariate=True), 16)
    assert early[:2] == plain[:2] and early != plain
    assert joint[:5] == plain[:5] and joint != plain
    with pytest.raises(UserError, match="tpe_startup"):
        new("optuna", tpe_startup=-1)
