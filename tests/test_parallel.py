"""``--parallel N``: trials in flight at once, recorded as they finish, Ctrl-C, and the interrupted row replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from gymnasium import spaces

from dse.agents.guided import GuidedAgent
from dse.agents.optuna_agent import OptunaAgent
from dse.backends.base import RunResult
from dse.backends.sim import SimBackend
from dse.rules.space import load_space
from dse.study import loop as study_mod
from dse.study import request as request_mod
from dse.study.outdir import trial_dir
from tests.helpers import write_space
from tests.test_study import valid_count


class Slow(SimBackend):
    """The simulated backend, taking ``delay(point)`` seconds a trial; counts how many run at once and which
    were cancelled (stopped by their stop check while running, as a real backend's poll loop stops its job)."""

    interruptible = True  # it stands for a job that takes time (a poll loop), which a Ctrl-C cancels

    def __init__(self, delay=lambda trial: 0.05, hold: threading.Event | None = None, release_at: int = 0):
        super().__init__()
        self.delay, self.hold = delay, hold
        # with release_at: the first runs hold until that many run at once (then ``hold`` is set), so a loaded
        # machine that is slow to fill the pool cannot make "three at once" depend on timing
        self.release_at = release_at
        if release_at:
            self.hold = threading.Event()
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.cancelled: list[Path] = []
        self.spans: list[tuple[float, float]] = []
        self.interrupts = 0  # KeyboardInterrupts that landed inside a run (none should: cancelling is the event's)

    def run(self, plan, run_dir, stop=None):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            if self.release_at and self.now >= self.release_at:
                self.hold.set()
        t0 = time.monotonic()
        try:
            end = t0 + self.delay(plan.trial)
            while time.monotonic() < end or (self.hold is not None and not self.hold.is_set()):
                if stop is not None and stop(run_dir / "log.txt"):  # a backend's poll loop asks its stop check
                    with self.lock:
                        self.cancelled.append(run_dir)
                    return RunResult(run_dir=run_dir, log_path=run_dir / "log.txt", exit_code=None, stopped=True)
                time.sleep(0.01)
            return super().run(plan, run_dir)
        except KeyboardInterrupt:
            with self.lock:
                self.interrupts += 1
            raise
        finally:
            with self.lock:
                self.now -= 1
                self.spans.append((t0, time.monotonic()))


def jitter(trial):
    """Different durations per point, so that trials finish in another order than they started."""
    return 0.02 + 0.08 * ((trial.layout.tp * 7 + trial.layout.pp * 3 + trial.layout.mbs) % 5) / 4


def by_point(records):
    return {tuple(r.knobs.values()): (r.status, r.reward) for r in records}


def test_parallel_grid_runs_trials_at_once_and_records_what_a_serial_grid_does(tmp_path, monkeypatch):
    space = load_space(write_space(tmp_path))
    serial = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "serial", agent="grid"))
    backend = Slow(jitter, release_at=3)
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: backend)
    finished: list[int] = []
    res = study_mod.run_study(
        space,
        study_mod.Request(
            out_dir=tmp_path / "par",
            agent="grid",
            parallel=3,
            on_trial=lambda rec, done, total, best: finished.append(rec.number),
        ),
    )
    assert backend.most == 3  # three at once, never more
    assert finished != sorted(finished)  # recorded as they finished, not in launch order
    assert [r.number for r in res.records] == list(range(valid_count(space)))
    assert by_point(res.records) == by_point(serial.records)  # the same point, the same result
    for r in res.records:  # each trial's metrics from its own run directory, under its own number
        assert Path(r.run_dir) == study_mod.trial_dir(tmp_path / "par", r.number)
        assert any((Path(r.run_dir) / name).exists() for name in ("log.txt", "log.txt.gz"))
    a = pd.read_csv(serial.leaderboard).drop(columns=["trial", "run_dir"], errors="ignore")
    b = pd.read_csv(res.leaderboard).drop(columns=["trial", "run_dir"], errors="ignore")
    pd.testing.assert_frame_equal(
        a.sort_values(list(space.knobs)).reset_index(drop=True), b.sort_values(list(space.knobs)).reset_index(drop=True)
    )


@pytest.mark.parametrize("agent", ["grid", "random", "optuna", "guided"])
def test_every_agent_hands_out_distinct_points_in_parallel(tmp_path, monkeypatch, agent):
    space = load_space(write_space(tmp_path))
    backend = Slow(jitter)
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: backend)
    res = study_mod.run_study(
        space, study_mod.Request(out_dir=tmp_path / "out", agent=agent, trials=10, parallel=4, seed=3)
    )
    keys = [tuple(r.knobs.values()) for r in res.records]
    assert len(keys) == len(set(keys))
    assert backend.most >= 2
    launched = [r for r in res.records if r.status != "rejected"]
    assert len(launched) == min(10, valid_count(space)) or (agent == "guided" and res.stop_reason)
    assert not any(r.interrupted for r in res.records)


def test_optuna_asks_with_the_constant_liar_only_when_parallel():
    space = spaces.Dict({"a": spaces.Discrete(4), "b": spaces.Discrete(3)})
    assert OptunaAgent(space, parallel=2).study.sampler._constant_liar
    assert not OptunaAgent(space).study.sampler._constant_liar
    agent = OptunaAgent(space, parallel=12, sampler="random", seed=1)
    keys = {tuple(agent.propose().values()) for _ in range(12)}  # nothing observed yet: all in flight
    assert len(keys) == 12 and agent.propose() is None


def test_guided_batch_is_diverse_under_its_own_uncertainty():
    space = spaces.Dict({"a": spaces.Discrete(5), "b": spaces.Discrete(5)})
    agent = GuidedAgent(space, seed=0)
    for a, b, r in [(0, 0, 10.0), (4, 4, 12.0), (2, 2, 11.0)]:
        agent.observe({"a": a, "b": b}, r, True, status="ok")
    _, sd0, _, _ = agent.scores()
    first = agent.propose()
    i = agent.index[agent.key(first)]
    _, sd1, _, _ = agent.scores()
    assert sd1[i] < sd0[i]  # believed at its mean: its uncertainty (and its neighbours') shrinks
    shares = [j for j, k in enumerate(agent.keys) if k[0] == first["a"] and j != i]
    assert (sd1[shares] < sd0[shares]).all()
    batch = [first] + [agent.propose() for _ in range(3)]
    assert len({agent.key(a) for a in batch}) == 4
    agent.observe(first, 11.5, True, status="ok")
    assert i not in agent.pending and agent.key(agent.propose()) not in {agent.key(a) for a in batch}


def test_ctrl_c_cancels_every_running_trial_and_resume_replaces_them(tmp_path, monkeypatch):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    backend = Slow(lambda t: 0.0, hold=threading.Event())  # held: no trial ends by itself...
    held = backend.run

    def run(plan, run_dir, stop=None):
        # ...but trial 0, whose result arrives while the three others run: chosen by its number, not by which
        # worker thread calls first (the threads start in any order)
        if Path(run_dir).name == trial_dir(out, 0).name:
            return SimBackend.run(backend, plan, run_dir, stop)
        return held(plan, run_dir, stop)

    backend.run = run
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: backend)

    def on_trial(rec, done, total, best):
        while backend.now < 3:  # the three other slots are running
            time.sleep(0.01)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as e:
        study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", parallel=4, on_trial=on_trial))
    assert isinstance(e.value, study_mod.Interrupted) and (e.value.saved, e.value.interrupted) == (4, 3)
    # each running trial was stopped through its stop check (the cancel event), none left, no exception injected
    assert len(backend.cancelled) == 3 and backend.now == 0 and backend.interrupts == 0
    store, _ = study_mod.open_store(out)
    before = store.records()
    store.close()
    assert [r.status for r in before][1:] == ["interrupted", "interrupted", "interrupted"]
    assert [r.interrupted for r in before] == [False, True, True, True]
    assert sorted(Path(p) for p in backend.cancelled) == [Path(r.run_dir) for r in before[1:]]
    monkeypatch.undo()
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", resume=True, parallel=2))
    keys = [tuple(r.knobs.values()) for r in res.records]
    assert len(keys) == len(set(keys)) == valid_count(space)  # the interrupted rows were replaced
    assert [r.knobs for r in res.records[:4]] == [r.knobs for r in before]
    assert res.records[0] == before[0] and not any(r.interrupted for r in res.records)
    lb = pd.read_csv(out / "leaderboard.csv")
    assert len(lb) == valid_count(space)


class FinishedJob(SimBackend):
    """A backend whose job ends by itself, but whose wait is cut by a Ctrl-C (a Slurm job that COMPLETED just
    before the cancel): the log is complete in the run directory, and the backend says so afterwards."""

    def run(self, plan, run_dir, stop=None):
        self.logs = getattr(self, "logs", {})
        self.logs[run_dir] = super().run(plan, run_dir, stop)
        raise KeyboardInterrupt

    def finished_after_interrupt(self, trial, run_dir):
        r = self.logs[run_dir]
        return RunResult(
            run_dir=run_dir, log_path=r.log_path, exit_code=r.exit_code, scheduler_state="COMPLETED", wall_s=12.0
        )


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_job_that_completed_before_the_ctrl_c_is_parsed_as_it_finished(tmp_path, monkeypatch, parallel):
    space = load_space(write_space(tmp_path))
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: FinishedJob())
    with pytest.raises(KeyboardInterrupt):
        study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid", parallel=parallel))
    store, _ = study_mod.open_store(tmp_path / "out")
    recs = store.records()
    store.close()
    assert recs and not any(r.interrupted for r in recs)
    monkeypatch.undo()
    plain = by_point(study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "plain", agent="grid")).records)
    for r in recs:  # the same outcome as the run that was not interrupted
        assert (r.status, r.reward) == plain[tuple(r.knobs.values())] and r.metrics["wall_s"] == 12.0


def test_parallel_is_a_search_setting_and_at_least_one(tmp_path, monkeypatch):
    text = write_space(tmp_path).read_text().replace('agent = "grid"', 'agent = "grid"\nparallel = 2')
    space = load_space(write_space(tmp_path, text, "p.toml"))
    assert space.search.parallel == 2
    backend = Slow(jitter)
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: backend)
    study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", trials=4))
    assert backend.most == 2
    from dse.errors import UserError

    with pytest.raises(UserError, match="parallel"):
        load_space(write_space(tmp_path, text.replace("parallel = 2", "parallel = 0"), "q.toml"))


# ---------------------------------------------------------------------- a real dse process and Ctrl-C
LOCAL_SPACE = """
name = "local_par"
recipe = "llama3_8b"
system = { gpu = "h100", gpus_per_node = 2, slurm = { use_container = false } }
num_nodes = 1

[settings]
seq_length = 1024
gbs = 8
max_steps = 100
cp = 1
vp = 1
pp = 1
recompute = "full"
"env.DSE_SIM_STEP_S" = "0.05"

[knobs]
tp = [1, 2]
mbs = [1, 2]

[backend]
kind = "local"
payload = "sim"

[search]
agent = "grid"
screen = "none"  # both points launch (the memory screen would record some of them screened first)
"""


def _alive(pattern: str) -> list[str]:
    r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return r.stdout.split()


def test_ctrl_c_at_the_terminal_stops_a_parallel_local_study_and_prints_the_resume_command(tmp_path):
    space = write_space(tmp_path, LOCAL_SPACE)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "dse", "run", "--space", str(space), "--out", str(out), "--parallel", "2"]
    # its own process group, as a terminal gives a job: Ctrl-C is SIGINT to the whole group. SIGINT at its
    # default, whatever this pytest inherited (a background job of a non-interactive shell ignores it).
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    # the baseline (the recipe's layout, a point of this space) runs first and alone, as a seed; then two trials
    # run at once: their logs are growing
    while time.monotonic() < deadline:
        logs = list(out.glob("trials/*/log.txt"))
        if len(logs) == 3 and all(p.stat().st_size > 0 for p in logs):
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the two trials did not start")
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    # the progress bar and the model's one-line updates after each run (dse/perfmodel/refit.py) aside, one line: the interruption
    lines = [ln for ln in stderr.splitlines() if ln.strip() and "━" not in ln and not ln.startswith("model: ")]
    assert len(lines) == 1, stderr
    assert "3 trials saved" in lines[0] and "2 interrupted" in lines[0]
    assert f"--out {out}" in lines[0] and lines[0].endswith("--resume")
    assert "Traceback" not in stderr
    assert not _alive(str(out / "trials"))  # no trial outlives dse
    resume = lines[0].split("continue with: ", 1)[1]
    assert resume.startswith("dse run ")
    r = subprocess.run(
        [sys.executable, "-m", "dse", *resume.split()[1:]], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr
    store, _ = study_mod.open_store(out)
    recs = store.records()
    store.close()
    assert len(recs) == 4 and not any(r.interrupted for r in recs)
    assert len({tuple(r.knobs.values()) for r in recs}) == 4


def test_a_journal_file_is_refused_before_anything_is_written(tmp_path):
    from dse.errors import UserError

    space = load_space(write_space(tmp_path))
    with pytest.raises(UserError, match="not an SQL storage URL"):
        study_mod.run_study(
            space, study_mod.Request(out_dir=tmp_path / "out", parallel=2, storage=str(tmp_path / "j.log"))
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "j.log").exists()


def test_replace_rewrites_a_row_as_optuna_reads_it(tmp_path):
    import optuna

    from dse.results import export
    from dse.study.store import Store, TrialRecord

    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = Store(url, "s", {"tp": [1, 2]})
    store.record(TrialRecord(0, {"tp": 1}, "failed", 0.0, "interrupted", run_dir="/r/0"))
    store.record(TrialRecord(1, {"tp": 2}, "ok", 3.0, None, {"step_time_s": 1.0}, "/r/1"))
    new = TrialRecord(0, {"tp": 1}, "ok", 7.5, None, {"step_time_s": 2.0}, "/r/0", "h100", 8, 0.1)
    store.replace(new)
    assert store.records()[0] == new and len(store.records()) == 2
    optuna_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    export.write(store, optuna_url, {"study_name": "s", "knobs": {"tp": [1, 2]}})
    store.close()
    trials = optuna.load_study(study_name="s", storage=optuna_url).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"] and trials[0].value == 7.5
    assert "reason" not in trials[0].user_attrs and trials[0].params == {"tp": 1}


class EndedMeanwhile(SimBackend):
    """On --resume: the interrupted trial's job had gone on and COMPLETED after its dse was gone (its log is
    complete); every run is counted."""

    def __init__(self):
        super().__init__()
        self.ran: list[Path] = []

    def run(self, plan, run_dir, stop=None):
        self.ran.append(run_dir)
        return super().run(plan, run_dir, stop)

    def finished_after_interrupt(self, trial, run_dir):
        if not (run_dir / "job_id").exists():
            return None
        from dse.launch import build_plan

        r = super().run(build_plan(trial, payload="sim", simulated=True), run_dir)
        return RunResult(
            run_dir=run_dir, log_path=r.log_path, exit_code=r.exit_code, scheduler_state="COMPLETED", wall_s=r.wall_s
        )


@pytest.mark.parametrize("parallel", [1, 2])
def test_resume_parses_a_job_that_completed_after_its_dse_was_gone(tmp_path, monkeypatch, parallel):
    from tests.test_study import Interrupting

    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: Interrupting(3))
    with pytest.raises(KeyboardInterrupt):
        study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid"))
    store, _ = study_mod.open_store(out)
    stale = store.records()[-1]
    store.close()
    assert stale.interrupted
    (Path(stale.run_dir) / "job_id").write_text("1234\n")  # its job went on without dse
    backend = EndedMeanwhile()
    monkeypatch.setattr(request_mod, "make_backend", lambda *a: backend)
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", resume=True, parallel=parallel))
    assert Path(stale.run_dir) not in backend.ran  # parsed, not run again
    row = res.records[stale.number]
    assert row.knobs == stale.knobs and not row.interrupted and row.metrics.get("steps")
    keys = [tuple(r.knobs.values()) for r in res.records]
    assert len(keys) == len(set(keys)) == valid_count(space)
