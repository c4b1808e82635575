"""Steady-state early stop (issue 19): the convergence rule on the recorded real logs, the incremental
parser, the stop on the simulated, local and Slurm (fake scancel/sacct) backends, the record, resume and
the settings. The stop on a real Slurm is ``tests/test_slurm_backend.py::test_a_long_trial_is_stopped_early_by_scancel``."""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from dse.backends.local import LocalBackend
from dse.backends.slurm import SlurmBackend
from dse.errors import UserError
from dse.execute import run_trial
from dse.launch import build_plan
from dse.logs.parse import LogFollower, parse_log
from dse.logs.steady import Monitor, Rule, converged, estimate, steps_needed
from dse.recipes.sim.logwriter import SimRun
from dse.rules.space import BackendSettings, EarlyStopSettings, load_space
from dse.study import loop as study_mod
from tests.helpers import SMALL_SPACE, write_space
from tests.trials import DATA, system, trial

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "fixtures" / "logs"
DENSE = sorted(LOGS.glob("real_h200*/*.log")) + sorted(
    (ROOT / "bench" / "data" / "h200_local_study").glob("trials/*/log.txt")
)
# one-GPU MoE runs (H200 and H100 machines): host-bound, their steps drift after the warm-up
REAL = DENSE + sorted(LOGS.glob("real_moe/*.log"))
DEFAULT = Rule(EarlyStopSettings().min_steps, EarlyStopSettings().window, EarlyStopSettings().tolerance)
GOAL = 0.01  # the early estimate within 1% of the full run's (docs/early-stop.md)


def times_of(log: Path) -> list[float | None]:
    f = LogFollower(log)
    f.poll()
    return f.step_times()


# ---------------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("log", [p for p in REAL if parse_log(p).ok], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_on_every_real_log_the_early_estimate_is_within_one_percent_of_the_full_run(log):
    full = parse_log(log).step_time_s
    times = times_of(log)
    n = steps_needed(times, DEFAULT)
    if n is None:  # not converged within the log: the run goes to its end and the answer is the full one
        return
    assert n <= len(times)
    assert abs(estimate(times[:n]) / full - 1) < GOAL
    # the estimate at the stop is what the parser reports for the log cut there
    assert estimate(times[:n]) == pytest.approx(parse_log(_first_steps(log.read_text().splitlines(), n)).step_time_s)


def _first_steps(lines: list[str], n: int) -> list[str]:
    out, seen = [], 0
    for ln in lines:
        if "iteration" in ln and ("elapsed time per iteration" in ln or "train_step_timing" in ln):
            if seen == n:
                break
            seen += 1
        out.append(ln)
    return out


def test_the_twenty_step_dense_logs_stop_before_their_end():
    twenty = [p for p in DENSE if parse_log(p).ok and len(times_of(p)) >= 20]
    assert twenty
    for p in twenty:
        n = steps_needed(times_of(p), DEFAULT)
        assert n is not None and n < 20, p


def test_rule_needs_warmup_min_steps_and_a_still_window():
    flat = [10.0, 5.0] + [1.0] * 20  # two warm-up steps (the parser's), then steady
    n = steps_needed(flat, Rule(min_steps=5, window=5, tolerance=0.01))
    # at n steps the 5 shorter prefixes must each have a steady median: n - 5 > 2 warm-up steps
    assert n == 8
    assert steps_needed(flat, Rule(min_steps=12, window=5, tolerance=0.01)) == 14
    drifting = [10.0, 5.0] + [1.0 * 1.02**i for i in range(40)]  # 2 % slower every step: never steady
    assert steps_needed(drifting, Rule(min_steps=5, window=5, tolerance=0.01)) is None
    assert not converged(flat[:7], Rule(min_steps=5, window=5, tolerance=0.01))


def test_one_outlier_step_does_not_hold_the_stop_back():
    rng = random.Random(0)
    times = [10.0, 5.0] + [1.0 + rng.gauss(0, 0.003) for _ in range(30)]
    times[6] = 3.0  # a checkpoint or a straggler
    n = steps_needed(times, DEFAULT)
    assert n is not None and n <= 12 and abs(estimate(times[:n]) - 1.0) < 0.01


# ------------------------------------------------------------------------------------- the incremental parser
@pytest.mark.parametrize("log", sorted(LOGS.glob("*.log")) + REAL[:3], ids=lambda p: p.name)
def test_following_a_growing_log_in_pieces_reads_as_parsing_it_whole(tmp_path, log):
    data = log.read_bytes()
    rng = random.Random(len(data))
    grow = tmp_path / "log.txt"
    f = LogFollower(grow)
    assert not f.poll()  # not there yet
    i = 0
    with open(grow, "wb") as out:
        while i < len(data):
            j = min(len(data), i + rng.randint(1, 400))
            out.write(data[i:j])
            out.flush()
            f.poll()
            i = j
    whole = parse_log(grow, exit_code=0)
    assert f.metrics(exit_code=0) == whole
    assert len(f.step_times()) == whole.steps


# ------------------------------------------------------------------------------------------ the simulated backend
def es_space(tmp_path, enabled=True, **extra):
    lines = "".join(f"{k} = {v}\n" for k, v in extra.items())
    return write_space(
        tmp_path,
        SMALL_SPACE.replace("max_steps = 20", "max_steps = 100")
        + f"\n[backend.early_stop]\nenabled = {'true' if enabled else 'false'}\n{lines}",
        name=f"space_{enabled}.toml",
    )


def test_sim_study_stops_ok_trials_early_and_records_the_savings(tmp_path):
    on = study_mod.run_study(load_space(es_space(tmp_path)), study_mod.Request(out_dir=tmp_path / "on", agent="grid"))
    off = study_mod.run_study(
        load_space(es_space(tmp_path, enabled=False)), study_mod.Request(out_dir=tmp_path / "off", agent="grid")
    )
    by_knobs = {tuple(r.knobs.values()): r for r in off.records}
    ok = [r for r in on.records if r.ok]
    assert ok
    for r in ok:
        full = by_knobs[tuple(r.knobs.values())]
        m = r.metrics
        assert m["early_stopped"] and not full.metrics["early_stopped"]
        assert m["steps"] < 100 == full.metrics["steps"]
        log = Path(r.run_dir) / "log.txt"
        assert log.read_text().count("Training epoch") == m["steps"]  # the log ends at the stop
        assert abs(m["step_time_s"] / full.metrics["step_time_s"] - 1) < 0.01
        assert r.gpu_hours < full.gpu_hours
        assert m["gpu_hours_saved"] == pytest.approx(r.num_gpus * (100 - m["steps"]) * m["step_time_s"] / 3600)
    for r in on.records:  # failures are not early stops
        if not r.ok:
            assert not r.metrics.get("early_stopped")
    lb = pd.read_csv(on.leaderboard)
    assert set(lb[lb.status == "ok"].early_stopped) == {True}
    assert lb.gpu_hours_saved.sum() == pytest.approx(sum(r.metrics["gpu_hours_saved"] for r in ok))
    best = lambda res: max((r for r in res.records if r.ok), key=lambda r: r.reward).knobs  # noqa: E731
    assert best(on) == best(off)


def test_resume_keeps_early_stopped_trials(tmp_path):
    space = load_space(es_space(tmp_path))
    out = tmp_path / "out"
    first = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="optuna", trials=4, seed=1))
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="optuna", trials=8, seed=1, resume=True))
    assert res.records[: len(first.records)] == first.records
    stopped = [r for r in res.records if r.metrics.get("early_stopped")]
    assert any(r.number >= len(first.records) for r in stopped)
    assert any(r.number < len(first.records) for r in stopped)


# ------------------------------------------------------------------------------------------ the local backend
@pytest.fixture
def python_first(monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def slow_plan(max_steps=400, step_s=0.05):
    t = trial(
        "llama3_8b",
        sys=system(DATA / "systems" / "local_slurm.toml", gpus_per_node=2),
        num_nodes=1,
        tp=2,
        pp=1,
        cp=1,
        vp=1,
        mbs=1,
        gbs=8,
        recompute="full",
        max_steps=max_steps,
        env_DSE_SIM_STEP_S=str(step_s),
    )  # fits in memory: the simulated run is ok
    return t, build_plan(
        t, payload="sim", sim_run=SimRun(step_time_s=1.0, tflops_per_gpu=50.0, gbs=8, max_steps=max_steps)
    )


def test_local_run_is_stopped_by_sigterm_to_its_process_group_and_recorded_ok(tmp_path, python_first):
    t, _ = slow_plan()  # 400 steps at 0.05 s: 20 s to run to the end
    settings = BackendSettings(payload="sim", early_stop=EarlyStopSettings(enabled=True, poll_s=0.1))
    t0 = time.monotonic()
    m = run_trial(t, tmp_path / "run", LocalBackend(), settings)
    assert time.monotonic() - t0 < 15
    assert m.status == "ok" and m.early_stopped and 8 <= m.steps < 400, m
    log = tmp_path / "run" / "log.txt"
    size = log.stat().st_size
    time.sleep(0.3)
    assert log.stat().st_size == size  # nothing left writing
    assert m.gpu_hours_saved == pytest.approx(2 * (400 - m.steps) * m.step_time_s / 3600)


def test_local_stop_kills_a_run_that_ignores_sigterm(tmp_path):
    log = tmp_path / "log.txt"

    class Once:
        poll_s = 0.05
        calls = 0

        def __call__(self, path):
            self.calls += 1
            return self.calls >= 2

    b = LocalBackend()
    b.grace_s = 0.3
    script = f"trap '' TERM; while true; do echo x >> {log}; sleep 0.05; done"
    t0 = time.monotonic()
    r = b._run_stoppable(["bash", "-c", script], tmp_path, Once())
    assert r.stopped and time.monotonic() - t0 < 5
    assert r.exit_code == -9  # SIGKILL after the grace period


def test_a_run_that_ends_by_itself_is_not_stopped(tmp_path, python_first):
    t, _ = slow_plan(max_steps=6, step_s=0.01)  # too short to converge
    settings = BackendSettings(payload="sim", early_stop=EarlyStopSettings(enabled=True, poll_s=0.05))
    m = run_trial(t, tmp_path / "run", LocalBackend(), settings)
    assert m.status == "ok" and not m.early_stopped and m.steps == 6


# ---------------------------------------------------------------------------------- Slurm, with fake commands
FAKE = {
    # sbatch: "submit" by copying a real log into the job directory; the job runs until scancel
    "sbatch": '#!/bin/bash\nd=$(dirname "$2"); cp "$FAKE_LOG" "$d/log.txt"; echo "RUNNING|0:0" > "$FAKE_STATE"; echo 4242\n',
    "sacct": '#!/bin/bash\ncat "$FAKE_STATE"\n',
    "scancel": '#!/bin/bash\necho "$1" >> "$FAKE_SCANCEL"; echo "CANCELLED by 1000|0:15" > "$FAKE_STATE"\n',
}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKE.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("FAKE_SCANCEL", str(tmp_path / "scancel.calls"))
    return tmp_path


def test_slurm_job_is_scancelled_once_converged_and_recorded_ok(fake_slurm, monkeypatch):
    log = LOGS / "real_h200" / "small_mbs2_s2048_none.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    t = trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml"),
        num_nodes=1,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=20,
    )
    settings = BackendSettings(kind="slurm", payload="sim", early_stop=EarlyStopSettings(enabled=True, poll_s=0.01))
    m = run_trial(t, fake_slurm / "run", SlurmBackend(poll_s=0.01, settle_s=1), settings)
    assert (fake_slurm / "scancel.calls").read_text().split() == ["4242"]
    assert m.status == "ok" and m.early_stopped, m  # CANCELLED by the stop is no failure
    # the whole log was there at the first look: the estimate is the parser's on all of it
    assert m.step_time_s == parse_log(log).step_time_s


def test_slurm_job_that_ends_by_itself_is_not_cancelled(fake_slurm, monkeypatch):
    monkeypatch.setenv("FAKE_LOG", str(LOGS / "real_h200" / "smoke_small.log"))  # 2 steps: never converges
    (fake_slurm / "bin" / "sacct").write_text('#!/bin/bash\necho "COMPLETED|0:0"\n')
    t = trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml"),
        num_nodes=1,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=2,
    )
    settings = BackendSettings(kind="slurm", payload="sim", early_stop=EarlyStopSettings(enabled=True, poll_s=0.01))
    m = run_trial(t, fake_slurm / "run", SlurmBackend(poll_s=0.01, settle_s=1), settings)
    assert not (fake_slurm / "scancel.calls").exists()
    assert not m.early_stopped


def test_monitor_leaves_a_failing_run_alone(tmp_path):
    log = tmp_path / "log.txt"
    text = (LOGS / "real_h200" / "small_mbs2_s2048_none.log").read_text()
    log.write_text(text + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    mon = Monitor(DEFAULT, poll_s=0.1)
    assert not mon(log) and not mon.decided


# ------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    "line, field",
    [
        ("tolerance = 2", "backend.early_stop.tolerance"),
        ("min_steps = 0", "backend.early_stop.min_steps"),
        ("windw = 3", "backend.early_stop.windw"),
        ('enabled = "yes please"', "backend.early_stop.enabled"),
    ],
)
def test_bad_early_stop_settings_are_one_line_naming_the_field(tmp_path, line, field):
    path = write_space(tmp_path, SMALL_SPACE + f"\n[backend.early_stop]\n{line}\n")
    with pytest.raises(UserError) as e:
        load_space(path)
    assert "\n" not in str(e.value) and e.value.field == field, str(e.value)
