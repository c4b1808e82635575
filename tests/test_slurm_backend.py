"""The Slurm backend against a real (local) Slurm: a grid of a 2-node reproducer through sbatch, OOM,
cancellation (scancel and Ctrl-C) and a time-limit kill. The simulated trainer stands in for NeMo."""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from dse.backends.base import InfrastructureFailure
from dse.backends.slurm import SlurmBackend, query_state, status_for
from dse.launch import build_plan
from dse.recipes.sim.logwriter import SimRun
from dse.rules.space import load_space
from dse.rules.trial import resolve
from tests.trials import DATA, system, trial

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SPACE = DATA / "spaces" / "llama3_70b_16l_local_slurm.toml"


def local_system(**slurm):
    return (
        system(DATA / "systems" / "local_slurm.toml", slurm=slurm)
        if slurm
        else system(DATA / "systems" / "local_slurm.toml")
    )


def sim_plan(t, **run):
    return build_plan(
        t,
        payload="sim",
        sim_run=SimRun(
            **{"step_time_s": 1.0, "tflops_per_gpu": 100.0, "gbs": t.layout.gbs, "max_steps": t.layout.max_steps, **run}
        ),
    )


def backend() -> SlurmBackend:
    return SlurmBackend(poll_s=0.5, settle_s=20)


def step_times(log: Path) -> list[float]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("Training epoch"):
            out.append(float(line.split("train_step_timing in s: ")[1].split(" ")[0]))
    return out


@pytest.fixture(scope="module")
def time_limit_job(tmp_path_factory):
    """A job with a 1-minute limit whose trainer hangs; started first, so the other tests run meanwhile."""
    sys_ = local_system(time_limit="1")
    t = trial(
        "llama3_70b_16l", sys=sys_, num_nodes=1, tp=1, pp=1, cp=1, vp=1, gbs=4, max_steps=3, env_DSE_SIM_SLEEP_S="600"
    )
    run_dir = tmp_path_factory.mktemp("timeout") / "trial"
    run_dir.mkdir()
    pool = ThreadPoolExecutor(1)
    fut: Future = pool.submit(backend().run, sim_plan(t), run_dir)
    yield fut
    pool.shutdown(wait=False, cancel_futures=True)


def test_grid_of_a_two_node_reproducer_through_sbatch(tmp_path, time_limit_job):
    space = load_space(SPACE)
    # a 2-node job that cannot start (a slurmd of the test cluster died) fails the test within minutes
    # instead of hanging it: the jobs here start in seconds when both nodes are up
    sys_ = space.system
    space = space.model_copy(
        update={"system": sys_.model_copy(update={"slurm": sys_.slurm.model_copy(update={"max_pending": "5"})})}
    )
    results = {}
    for i, point in enumerate(space.points()):
        t = resolve(space, point)
        step = 0.5 + 0.25 * i  # distinct figures per point, to check each log is its own
        run_dir = tmp_path / f"{i:05d}"
        run_dir.mkdir()
        r = backend().run(sim_plan(t, step_time_s=step, tflops_per_gpu=100.0 * (i + 1), seed=i), run_dir)
        results[i] = (point, step, r)
    for point, step, r in results.values():
        assert (r.scheduler_state, r.exit_code) == ("COMPLETED", 0), (point, r.log_path.read_text())
        assert r.job_id and (r.run_dir / "job_id").read_text().strip() == r.job_id
        times = step_times(r.log_path)
        assert len(times) == 5  # max_steps from the space, through the override
        assert statistics.median(times[3:]) == pytest.approx(step, rel=0.05)
        log = r.log_path.read_text()
        assert f"trainer.strategy.tensor_model_parallel_size={point['tp']}" in log
        assert "trainer.num_nodes=2" in log
        script = (r.run_dir / "launch.sbatch").read_text()
        assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
        assert status_for(r.scheduler_state) is None  # decided by the log
    # the job really spanned two Slurm nodes
    acct = subprocess.run(
        ["sacct", "-j", results[0][2].job_id, "-X", "-n", "-P", "-o", "NNodes"], capture_output=True, text=True
    ).stdout.split()
    assert acct == ["2"]


def test_study_loop_over_slurm_fills_the_leaderboard(tmp_path, time_limit_job):
    from dse.rules import constraints
    from dse.rules.trial import resolve
    from dse.study import loop as study

    space = load_space(SPACE)
    result = study.run_study(space, study.Request(out_dir=tmp_path / "study", agent="grid", backend="slurm"))
    valid = [p for p in space.points() if constraints.check(resolve(space, p)) is None]
    ran = [r.knobs for r in result.records]
    # every valid point once, through sbatch; the baseline (the recipe's layout, a point of the space) runs first
    assert len(ran) == len(valid) and all(p in ran for p in valid), ran
    assert {r.status for r in result.records} <= {"ok", "oom"}
    assert any(r.status == "ok" and r.metrics.get("tflops_per_gpu") for r in result.records)
    assert result.leaderboard.exists()


def test_oom_in_the_log_and_a_failed_job(tmp_path, time_limit_job):
    t = trial("llama3_70b_16l", sys=local_system(), num_nodes=2, tp=2, pp=1, cp=1, vp=1, gbs=4, max_steps=4)
    r = backend().run(sim_plan(t, oom=True, oom_after=1, peak_memory_gib=120.0), tmp_path)
    # the rank that ran out of memory exits 1; srun may end the other with SIGTERM (15) first
    assert r.scheduler_state == "FAILED" and r.exit_code not in (0, None)
    assert "torch.OutOfMemoryError" in r.log_path.read_text()


def _wait_running(run_dir: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = run_dir / "job_id"
        if job.exists():
            st = query_state(job.read_text().strip())
            if st and st.state == "RUNNING" and (run_dir / "log.txt").exists():
                return job.read_text().strip()
        time.sleep(0.3)
    raise AssertionError("job did not start")


def hanging_plan():
    t = trial(
        "llama3_70b_16l",
        sys=local_system(),
        num_nodes=1,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=3,
        env_DSE_SIM_SLEEP_S="300",
    )
    return sim_plan(t)


def test_scancel_is_recorded_as_cancelled(tmp_path, time_limit_job):
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(backend().run, hanging_plan(), tmp_path)
        job_id = _wait_running(tmp_path)
        subprocess.run(["scancel", job_id], check=True)
        r = fut.result(timeout=60)
    assert r.scheduler_state == "CANCELLED" and r.job_id == job_id
    assert status_for(r.scheduler_state) == "failed"


def test_ctrl_c_cancels_the_job_and_propagates(tmp_path, time_limit_job):
    def interrupt():
        _wait_running(tmp_path)
        os.kill(os.getpid(), signal.SIGINT)

    # A process started in the background by a non-interactive shell (as CI may start pytest) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler: install it for this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            backend().run(hanging_plan(), tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    job_id = (tmp_path / "job_id").read_text().strip()
    st = query_state(job_id)
    assert st is not None and st.state == "CANCELLED"


def test_submission_failure_is_data_not_an_exception(tmp_path):
    t = trial(
        "llama3_70b_16l",
        sys=local_system(partition="no_such_partition"),
        num_nodes=1,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=2,
    )
    r = backend().run(sim_plan(t), tmp_path)
    assert r.scheduler_state == "SUBMIT_FAILED" and r.exit_code is None and r.job_id is None
    assert "partition" in r.log_path.read_text().lower()
    assert "sbatch: sbatch:" not in r.log_path.read_text()  # sbatch's output as it printed it
    assert isinstance(r.reason, InfrastructureFailure)  # nothing of the layout ran
    assert r.reason.message.startswith("sbatch refused the job: ") and "partition" in r.reason.message.lower()
    assert "sbatch:" not in r.reason.message and "error:" not in r.reason.message


def test_hostile_environment_values_stay_inert_under_sbatch(tmp_path, time_limit_job):
    markers = tmp_path / "markers"
    markers.mkdir()
    t = trial("llama3_70b_16l", sys=local_system(), num_nodes=2, tp=1, pp=1, cp=1, vp=1, gbs=4, max_steps=2)
    plan = sim_plan(t)
    evil = {
        "DSE_EVIL_SUBST": f"$(touch {markers}/a)",
        "DSE_EVIL_TICKS": f"`touch {markers}/b`",
        "DSE_EVIL_SEMI": f"x; touch {markers}/c",
    }
    plan = dataclasses.replace(plan, env={**plan.env, **evil, "DSE_SIM_ECHO_ENV": ",".join(evil)})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    r = backend().run(plan, run_dir)
    assert (r.scheduler_state, r.exit_code) == ("COMPLETED", 0)
    assert list(markers.iterdir()) == []
    log = r.log_path.read_text()
    for name, value in evil.items():
        assert f"[NeMo I] env {name}={value}" in log


def test_time_limit_kill_is_timeout(time_limit_job):
    r = time_limit_job.result(timeout=240)
    assert r.scheduler_state == "TIMEOUT"
    assert status_for(r.scheduler_state) == "timeout"


def test_a_long_trial_is_stopped_early_by_scancel(tmp_path):
    """Issue 19 on a real Slurm: a simulated trial of 300 steps at 0.2 s (a minute to run out) is cancelled by
    the early stop once its steady state has converged, and its result reads ok, stopped early."""
    from dse.execute import early_stopped, parse_context
    from dse.logs.steady import Monitor, Rule
    from dse.rules.space import BackendSettings

    t = trial(
        "llama3_70b_16l",
        sys=local_system(),
        num_nodes=1,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=300,
        env_DSE_SIM_STEP_S="0.2",
    )
    mon = Monitor(Rule(), poll_s=0.5)
    t0 = time.monotonic()
    r = backend().run(sim_plan(t), tmp_path, stop=mon)
    assert r.stopped and mon.decided and r.scheduler_state == "CANCELLED"
    assert time.monotonic() - t0 < 50
    m = early_stopped(t, mon.metrics(parse_context(t, BackendSettings(payload="sim"))), time.monotonic() - t0)
    assert m.status == "ok" and m.early_stopped and m.steps < 300 and m.gpu_hours_saved > 0
    assert len(step_times(r.log_path)) < 300
