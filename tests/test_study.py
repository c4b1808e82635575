"""The whole loop: store round trip, resume after an interrupted run, and reward agreement."""

from __future__ import annotations

import threading

import optuna
import pandas as pd
import pytest

from dse.backends.sim import SimBackend
from dse.errors import UserError
from dse.rules.space import load_space
from dse.study import loop as study_mod
from dse.study import request as request_mod
from dse.study.store import Store, TrialRecord
from tests.helpers import write_space


def valid_count(space):
    from dse.rules import constraints
    from dse.rules.trial import resolve

    return sum(constraints.check(resolve(space, p)) is None for p in space.points())


def test_grid_visits_every_valid_point_once(tmp_path):
    space = load_space(write_space(tmp_path))
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid"))
    keys = [tuple(r.knobs.values()) for r in res.records]
    assert len(keys) == len(set(keys)) == valid_count(space)
    assert all(r.status != "rejected" for r in res.records)


def test_store_round_trip_and_optunas_view_of_it(tmp_path):
    from dse.results import export

    url = f"sqlite:///{tmp_path / 'x.db'}"
    knobs = {"tp": [1, 2], "recompute": ["none", "full"]}
    store = Store(url, "s", knobs, batch_size=2)
    recs = [
        TrialRecord(0, {"tp": 2, "recompute": "full"}, "ok", 12.5, None, {"step_time_s": 3.0}, "/r/0", "h100", 16),
        TrialRecord(1, {"tp": 1, "recompute": "none"}, "oom", 0.0, "CUDA out of memory", {}, "/r/1", "h100", 16),
        TrialRecord(2, {"tp": 1, "recompute": "full"}, "rejected", 0.0, "rule: why", {}, None, "h100", 16),
    ]
    for r in recs:
        store.record(r)
    assert store.records() == recs
    optuna_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert export.write(store, optuna_url, {"study_name": "s", "knobs": knobs}) == 3
    store.close()
    study = optuna.load_study(study_name="s", storage=optuna_url)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL", "FAIL"]  # failures are FAIL trials, never a sentinel value
    assert study.best_trial.params == {"tp": 2, "recompute": "full"} and study.best_value == 12.5
    assert study.trials[1].user_attrs["status"] == "oom" and study.trials[1].value is None
    assert study.trials[1].user_attrs["reason"] == "CUDA out of memory"


def test_store_refuses_out_of_order_numbers(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'x.db'}", "s", {"tp": [1]})
    with pytest.raises(RuntimeError):
        store.record(TrialRecord(3, {"tp": 1}, "ok", 1.0))


class Interrupting(SimBackend):
    """Stops the study like Ctrl-C on its n-th run."""

    def __init__(self, n, **kw):
        super().__init__(**kw)
        self.n, self.calls = n, 0

    def run(self, plan, run_dir):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return super().run(plan, run_dir)


def test_resume_after_an_interrupted_run(tmp_path, monkeypatch):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: Interrupting(5))
    with pytest.raises(KeyboardInterrupt):
        study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid"))
    monkeypatch.undo()
    store, _ = study_mod.open_store(out)
    before = store.records()
    store.close()
    assert len(before) == 5 and before[-1].interrupted and before[-1].status == "interrupted"
    assert (out / "leaderboard.csv").exists()  # written even when interrupted
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", resume=True))
    keys = [tuple(r.knobs.values()) for r in res.records]
    assert len(keys) == len(set(keys)) == valid_count(space)  # nothing twice, nothing lost, no stale row
    assert not any(r.interrupted for r in res.records)
    assert res.records[:4] == before[:4]  # history kept as it was
    # the interrupted trial is replaced by its rerun: same number, same point, same run directory
    assert res.records[4].knobs == before[4].knobs and res.records[4].run_dir == before[4].run_dir
    assert res.records[4].status == "ok"
    assert res.new_trials == valid_count(space) - 4
    lb = pd.read_csv(out / "leaderboard.csv")
    assert len(lb) == valid_count(space) and "interrupted" not in set(lb["reason"].dropna())


def test_resume_with_a_budget_continues_to_it(tmp_path):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    first = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="optuna", trials=6, seed=1))
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="optuna", trials=10, seed=1, resume=True))
    # the budget is launched runs: rejected points are recorded but count for nothing
    launched = [r for r in res.records if r.status != "rejected"]
    assert sum(r.status != "rejected" for r in first.records) == 6 and len(launched) == 10
    assert any(r.status == "rejected" for r in res.records)
    keys = [tuple(r.knobs.values()) for r in res.records]
    assert len(set(keys)) == len(keys)


def test_second_run_into_the_same_directory_needs_resume(tmp_path):
    space = load_space(write_space(tmp_path))
    study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid", trials=2))
    with pytest.raises(UserError, match="`resume`"):
        study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid", trials=2))


def test_reward_agrees_across_agent_store_and_leaderboard(tmp_path, monkeypatch):
    """Regression: the reward the agent receives is the one the store records and the leaderboard shows,
    trial by trial, and each trial's metrics come from its own run directory."""
    space = load_space(write_space(tmp_path))
    seen: list[tuple[dict, float]] = []
    from dse.agents.grid import GridAgent

    original = GridAgent.observe

    def spy(self, action, reward, ok, **kw):
        seen.append((dict(action), reward))
        return original(self, action, reward, ok, **kw)

    monkeypatch.setattr(GridAgent, "observe", spy)
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid"))
    rewards = [r for _, r in seen]
    assert len(set(rewards)) > len(rewards) // 2  # distinct per-trial results, not a constant
    assert [r.reward for r in res.records] == rewards
    lb = pd.read_csv(res.leaderboard).set_index("trial").sort_index()
    assert list(lb["reward"]) == pytest.approx(rewards)
    from dse.backends.scripts import run_log
    from dse.logs.parse import ParseContext, parse_log

    for rec in res.records:
        if rec.ok:
            m = parse_log(run_log(rec.run_dir), exit_code=0, context=ParseContext())
            assert m.tflops_per_gpu == pytest.approx(rec.reward)  # read from its own run directory


def test_best_configuration_is_written_ready_to_launch(tmp_path):
    import json

    space = load_space(write_space(tmp_path))
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid"))
    top = pd.read_csv(res.leaderboard).iloc[0]
    best = json.loads((tmp_path / "out" / "best" / "best.json").read_text())
    assert best["trial"] == top.trial and best["reward"] == pytest.approx(top.reward)
    assert {k: best["knobs"][k] for k in ("tp", "pp", "vp", "mbs")} == {
        k: int(top[k]) for k in ("tp", "pp", "vp", "mbs")
    }
    sbatch = (tmp_path / "out" / "best" / "launch.sbatch").read_text()
    assert f"trainer.strategy.tensor_model_parallel_size={int(top.tp)} " in sbatch
    assert "python -m recipes.nemo2 --factory llama3_70b_recipe" in sbatch  # a real payload, not the simulator
    assert (tmp_path / "out" / "best" / "code" / "recipes" / "nemo2" / "factories.py").exists()
    # two nodes: torchrun on one machine cannot start it, so no launch.sh; the README names the sbatch script
    assert not (tmp_path / "out" / "best" / "launch.sh").exists()
    assert "launch.sbatch is the launch file" in (tmp_path / "out" / "best" / "README").read_text()


def _stored(url: str) -> int:
    """Trials on disk, as another process reads them."""
    reader = Store(url, "s", {"tp": [1, 2]}, create=False)
    try:
        return reader.next_number()
    finally:
        reader.close()


def test_a_slow_trial_is_written_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = Store(url, "s", {"tp": [1, 2]}, batch_size=64, max_delay_s=0.0)
    store.record(TrialRecord(0, {"tp": 1}, "ok", 1.0))
    assert _stored(url) == 1  # on disk before close()
    fast = Store(url, "s", {"tp": [1, 2]}, resume=True, batch_size=64, max_delay_s=3600.0)
    fast.record(TrialRecord(1, {"tp": 2}, "ok", 2.0))
    assert _stored(url) == 1  # batched
    fast.close()
    assert _stored(url) == 2


def test_every_trial_records_gpu_hours_and_the_summary_adds_them_up(tmp_path):
    from dse.perfmodel import predict
    from dse.rules.trial import resolve
    from dse.study.leaderboard import gpu_hours

    space = load_space(write_space(tmp_path))
    start = space.system.startup_s
    assert start > 0
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="random", trials=8))
    for r in res.records:
        if r.status == "rejected":
            assert r.gpu_hours == 0.0
        elif r.ok:  # simulated wall time: start-up plus max_steps at the simulated step time
            step = predict(resolve(space, r.knobs)).step_time_s
            assert r.gpu_hours == pytest.approx(16 * (start + 20 * step) / 3600)
        else:  # an OOM dies at start-up
            assert r.gpu_hours == pytest.approx(16 * start / 3600)
    spent, to_best = gpu_hours(res.records)
    assert spent == pytest.approx(sum(r.gpu_hours for r in res.records))
    best = max((r for r in res.records if r.ok), key=lambda r: r.reward)
    assert to_best == pytest.approx(sum(r.gpu_hours for r in res.records if r.number <= best.number))
    lb = pd.read_csv(res.leaderboard)
    assert lb["gpu_hours"].sum() == pytest.approx(spent)


def test_optuna_gets_the_spaces_ordinal_knobs_and_warm_start(tmp_path):
    space = load_space("conf/spaces/llama3_405b_space.toml")
    from dse.agents.base import load_agents

    reg = load_agents()

    def opts_of(sp, agent):
        return study_mod.space_options(sp, agent, study_mod.agent_settings(sp, agent, None, reg), reg)

    opts = opts_of(space, "optuna")
    assert opts["ordinal"] == ["tp", "pp", "vp", "cp", "mbs"] and opts["warm_start"] == "none"
    from tests.helpers import SMALL_SPACE

    unsorted = load_space(write_space(tmp_path, SMALL_SPACE.replace("tp = [1, 2, 4, 8]", "tp = [8, 1, 2, 4]")))
    assert "tp" not in opts_of(unsorted, "optuna")["ordinal"]  # no order to use
    assert opts_of(space, "grid") == {}


def test_search_warm_start_model_launches_the_models_best_point_first(tmp_path):
    from dse.forecast import model_forecaster
    from tests.helpers import SMALL_SPACE

    space = load_space(
        write_space(tmp_path, SMALL_SPACE.replace('agent = "grid"', 'agent = "optuna"\nwarm_start = "model"'))
    )
    f = model_forecaster(space)
    actions = [
        dict(zip(space.knob_names, k))
        for k in __import__("itertools").product(*(range(len(v)) for v in space.knobs.values()))
    ]
    fits = [(f(a).reward, a) for a in actions if f(a) is not None and f(a).peak_memory_gib <= f(a).memory_gib]
    best = max(fits, key=lambda x: x[0])[1]
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", trials=2))
    assert res.records[0].knobs == {n: space.knobs[n][i] for n, i in best.items()}


class Buggy(SimBackend):
    """A backend with a bug in it: its ``n``-th run divides by zero (no error the backend declares)."""

    def __init__(self, n):
        super().__init__()
        self.n, self.calls, self.lock = n, 0, threading.Lock()

    def run(self, plan, run_dir, stop=None):
        with self.lock:
            self.calls += 1
            call = self.calls
        if call == self.n:
            return 1 / 0
        return super().run(plan, run_dir, stop)


@pytest.mark.parametrize("parallel", [1, 3])
def test_a_bug_in_a_backend_stops_the_study_after_saving_what_finished(tmp_path, monkeypatch, parallel):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: Buggy(5))
    with pytest.raises(ZeroDivisionError) as e:
        study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", parallel=parallel))
    assert e.traceback[-1].name == "run"  # the bug's own traceback, down to the backend's frame
    store, _ = study_mod.open_store(out)
    records = store.records()
    store.close()
    finished = [r for r in records if not r.interrupted]
    # the four runs before it (and, in parallel, those in flight beside it) are recorded; none as a failure
    assert len(finished) >= 4 and all(r.status != "failed" for r in finished)
    assert not any("ZeroDivisionError" in (r.reason or "") for r in records)
    # its own trial: no row in a serial study, its interrupted row (resume runs it) in a parallel one
    assert len(records) - len(finished) == (0 if parallel == 1 else 1)
    assert len(pd.read_csv(out / "leaderboard.csv")) == len(records)
    monkeypatch.undo()
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", resume=True, parallel=parallel))
    keys = [tuple(r.knobs.values()) for r in res.records]
    assert len(keys) == len(set(keys)) == valid_count(space) and not any(r.interrupted for r in res.records)
