"""Run one trial: its launch plan, the backend, the log parsed into :class:`dse.logs.parse.RunMetrics`.

The one path every caller uses (the Gymnasium environment, and through it the study). It neither numbers
nor records trials: the caller gives the run directory and keeps the result. A failed run is data (a
``RunMetrics`` with a status and a reason), and so is an exception the backend declares as its own
(:attr:`dse.backends.base.Backend.run_errors`: a launcher that cannot start). What passes through: a
``KeyboardInterrupt`` (after the run directory has what the backend left); :class:`dse.errors.Cancelled`
(the study's cancel event stopped the run); an :class:`dse.errors.InfrastructureError` (dse could not write:
disk full, read-only), which is no outcome of the trial and must not be recorded as one; and any other
exception, a bug, which stops the study with its traceback (as Optuna's ``catch=()`` does) rather than
spending its budget on failed trials.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dse.backends.base import Backend, InfrastructureFailure, RunResult, StopCheck
from dse.errors import Cancelled, InfrastructureError, UserError, infrastructure
from dse.launch import build_plan
from dse.logs.parse import ParseContext, RunMetrics, parse_log
from dse.logs.steady import Monitor, Prune, Rule
from dse.perfmodel import model_flops_per_step
from dse.perfmodel.calibrate import calibrated_params
from dse.rules.space import BackendSettings, Objective
from dse.rules.trial import TrialConfig


def prepare_run_dir(run_dir: Path) -> Path:
    """Make ``run_dir`` empty and new. A directory already there was left by a run killed before its trial
    reached the store (records are written in batches): it is set aside as ``NAME.orphanN``, never mixed
    with this trial's files."""
    if run_dir.exists():
        i = 0
        while (aside := run_dir.with_name(f"{run_dir.name}.orphan{i}")).exists():
            i += 1
        run_dir.rename(aside)
    run_dir.mkdir(parents=True)
    return run_dir


def parse_context(trial: TrialConfig, settings: BackendSettings) -> ParseContext:
    """What the parser needs of ``trial``: batch, sequence, GPUs, model FLOPs per step (the space's
    convention, the same one the simulated run prints with) and the stall limit."""
    gbs, seq = trial.layout.gbs, trial.layout.seq_length
    return ParseContext(
        gbs=gbs,
        seq_length=seq,
        num_gpus=trial.num_gpus,
        model_flops_per_step=model_flops_per_step(trial.arch, gbs, seq, settings.flops_convention),
        stall_timeout_s=settings.timeout_s,
    )


# How often a run looks at the study's cancel event (a Ctrl-C under --parallel). Short, since a run stopped late
# may end by itself meanwhile; a backend that polls a scheduler still asks it at its own pace (dse.backends.slurm).
CANCEL_POLL_S = 0.2


class CancelCheck:
    """A backend's stop check (:class:`dse.backends.base.StopCheck`) that says stop once ``cancel`` is set, and
    otherwise asks the early-stop ``monitor`` if there is one, at the monitor's own interval (so an early stop
    reads the log as often as it does without a cancel event)."""

    poll_s = CANCEL_POLL_S

    def __init__(self, cancel: threading.Event, monitor: Monitor | None = None):
        self.cancel, self.monitor = cancel, monitor
        self._looked = time.monotonic()  # a backend first looks one poll interval after the start

    def __call__(self, log_path: Path) -> bool:
        if self.cancel.is_set():
            return True
        if self.monitor is None:
            return False
        if not self.monitor.decided and time.monotonic() - self._looked < self.monitor.poll_s:
            return False
        self._looked = time.monotonic()
        return self.monitor(log_path)


def run_trial(
    trial: TrialConfig,
    run_dir: Path,
    backend: Backend,
    settings: BackendSettings,
    *,
    seed: int = 0,
    objective: Objective | None = None,
    best: Callable[[], float | None] | None = None,
    cancel: threading.Event | None = None,
) -> RunMetrics:
    """Run ``trial`` in ``run_dir`` (made fresh here) on ``backend`` and parse its log.

    ``settings`` is the space's ``[backend]`` table (payload, FLOPs convention, stall limit); ``seed`` the
    study's (the simulated jitter depends on it). Metrics come from this trial's own run directory and
    nowhere else: a reward read from another trial's log stays plausible and silently wrong. Pruning
    (``[backend.early_stop] prune_margin``) needs the space's ``objective`` and ``best``: the caller's
    callable giving the best value of the objective's metric measured so far (asked while the run goes on,
    since it may change meanwhile); without them no trial is pruned. ``cancel``: the study's cancel event
    (``--parallel``), read by an :attr:`~dse.backends.base.Backend.interruptible` backend through its stop check;
    a run it stopped raises :class:`dse.errors.Cancelled`.
    """
    try:
        prepare_run_dir(run_dir)
    except OSError as e:  # the study cannot make run directories: dse's failure, not the trial's
        raise infrastructure(e, f"cannot make the run directory {run_dir}") or InfrastructureError(
            f"cannot make the run directory {run_dir}: {e}"
        ) from None
    try:
        plan = build_plan(
            trial,
            payload=settings.payload,
            seed=seed,
            flops_convention=settings.flops_convention,
            simulated=backend.simulated,
            params=calibrated_params(settings.calibration),
        )
    except UserError as e:  # a value the launch path refuses: this trial fails, the study goes on
        return RunMetrics("failed", f"launch plan: {e}")
    monitor = _monitor(trial, settings, objective, best)
    stop: StopCheck | None = monitor
    if cancel is not None and backend.interruptible:
        stop = CancelCheck(cancel, monitor)
    t0 = time.monotonic()
    try:
        result = backend.run(plan, run_dir) if stop is None else backend.run(plan, run_dir, stop=stop)
    except Exception as e:
        return _declared_failure(e, backend, run_dir, wall_s=elapsed_s(t0))
    if result.stopped and cancel is not None and cancel.is_set() and not (monitor is not None and monitor.decided):
        raise Cancelled(f"trial in {run_dir} cancelled")
    return _metrics(
        trial,
        settings,
        backend,
        run_dir,
        result,
        monitor,
        wall=duration_s(result.wall_s) if result.wall_s is not None else elapsed_s(t0),
    )


def elapsed_s(t0: float) -> float | None:
    """Seconds since ``t0`` (a ``time.monotonic()`` reading): the run's duration never comes from the wall
    clock, which jumps; None when even this clock reads less than ``t0`` (faked or reset under the run), so
    the trial's GPU-hours are unknown rather than negative."""
    return duration_s(time.monotonic() - t0)


def duration_s(value: float | None) -> float | None:
    """``value`` when it is a duration (finite, not negative), else None: unknown, never a negative cost."""
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _monitor(
    trial: TrialConfig, settings: BackendSettings, objective: Objective | None, best: Callable[[], float | None] | None
) -> Monitor | None:
    """The early-stop monitor of a run (None unless ``[backend.early_stop]`` is enabled); it prunes only with
    the objective and the study's best."""
    es = settings.early_stop
    if not es.enabled:
        return None
    prune = None
    if es.prune_margin is not None and objective is not None and best is not None:
        prune = Prune(es.prune_margin, objective.metric, objective.sense == "maximize", best)
    return Monitor(
        Rule(es.min_steps, es.window, es.tolerance),
        poll_s=es.poll_s,
        prune=prune,
        context=parse_context(trial, settings),
    )


def _declared_failure(e: Exception, backend: Backend, run_dir: Path, *, wall_s: float | None) -> RunMetrics:
    """The failed trial that an error the backend declares (:attr:`~dse.backends.base.Backend.run_errors`) makes;
    anything else is raised: a full disk as an InfrastructureError (dse's machinery failed, not the trial),
    dse's own failures as they are, and any other exception, a bug, as it is (the study stops)."""
    if (
        isinstance(e, OSError)
        and (infra := infrastructure(e, f"backend {backend.name} could not write in {run_dir}")) is not None
    ):
        raise infra from None
    if isinstance(e, InfrastructureError) or not isinstance(e, backend.run_errors):
        raise e
    # an infrastructure failure: --resume runs the trial again (dse.study.trials)
    failure = InfrastructureFailure(f"backend {backend.name} raised {type(e).__name__}: {e}")
    return RunMetrics("failed", str(failure), wall_s=wall_s)


def _metrics(
    trial: TrialConfig,
    settings: BackendSettings,
    backend: Backend,
    run_dir: Path,
    result: RunResult,
    monitor: Monitor | None,
    *,
    wall: float | None,
) -> RunMetrics:
    """The trial's metrics from what its run left: the backend's reason when nothing ran, the monitor's when it
    stopped the run, otherwise the log parsed (this run's own, inside its run directory)."""
    if result.reason is not None:  # nothing ran (sbatch refused it): the backend's words are the reason
        return RunMetrics("failed", str(result.reason), wall_s=wall)
    log = Path(result.log_path)
    if not log.resolve().is_relative_to(run_dir.resolve()):
        return RunMetrics(
            "failed", f"backend {backend.name} returned a log outside the run directory: {log}", wall_s=wall
        )
    if not log.exists():
        return RunMetrics(
            "failed", f"no log at {log} (exit code {result.exit_code}, state {result.scheduler_state})", wall_s=wall
        )
    if result.stopped and monitor is not None and monitor.decided:
        if monitor.outcome == "pruned":
            return pruned(trial, monitor, wall)
        return early_stopped(trial, monitor.metrics(parse_context(trial, settings)), wall)
    return replace(
        parse_log(
            log,
            exit_code=result.exit_code,
            scheduler_state=result.scheduler_state,
            context=parse_context(trial, settings),
        ),
        wall_s=wall,
    )


def saved_gpu_hours(trial: TrialConfig, metrics: RunMetrics) -> float | None:
    """What running on from ``metrics.steps`` to ``max_steps`` at the measured step time would have cost."""
    if metrics.step_time_s is None:
        return None
    return max(0, int(trial.layout.max_steps) - metrics.steps) * metrics.step_time_s * trial.num_gpus / 3600.0


def pruned(trial: TrialConfig, monitor: Monitor, wall_s: float | None) -> RunMetrics:
    """The result of a run stopped as a loser: status ``pruned``, the partial metrics of the log as read at
    the stop, the optimistic bound and the best it lost to, and the GPU-hours saved (as for an early stop)."""
    # a monitor decides "pruned" only with a Prune, and _monitor gives every monitor its context
    assert monitor.prune is not None and monitor.context is not None
    m = monitor.metrics(monitor.context)
    unit = monitor.prune.metric
    # "prune_margin: ..." names the setting that stopped it (the summary shows the name alone)
    reason = (
        f"prune_margin: after {m.steps} steps, {unit} at best {monitor.bound:.4g} (95% bound) is more "
        f"than {monitor.prune.margin:.0%} worse than the best measured, {monitor.best:.4g}"
    )
    return replace(
        m,
        status="pruned",
        reason=reason,
        partial=True,
        prune_bound=monitor.bound,
        prune_best=monitor.best,
        gpu_hours_saved=saved_gpu_hours(trial, m),
        wall_s=wall_s,
    )


def early_stopped(trial: TrialConfig, metrics: RunMetrics, wall_s: float | None) -> RunMetrics:
    """The result of a run stopped once its steady state had converged: the metrics of the log as read at
    the stop (whatever the stop itself printed is not the trial's), flagged, with the GPU-hours that running
    on to ``max_steps`` at the measured step time would have cost (one logged line per step, as the
    payloads log)."""
    return replace(metrics, early_stopped=True, gpu_hours_saved=saved_gpu_hours(trial, metrics), wall_s=wall_s)
