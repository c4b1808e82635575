"""``dse.execute.run_trial``: which exceptions of a backend are trial outcomes, and the study's cancel event."""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import replace

import pytest

from dse.backends.base import RunResult
from dse.backends.sim import SimBackend
from dse.errors import Cancelled, InfrastructureError
from dse.execute import CancelCheck, run_trial
from dse.rules.space import BackendSettings
from tests.trials import system, trial

SETTINGS = BackendSettings(payload="sim")


def _trial():
    # fits in memory: the simulated run is ok
    return trial(
        "llama3_8b",
        sys=system(gpus_per_node=2),
        num_nodes=1,
        tp=2,
        pp=1,
        cp=1,
        vp=1,
        mbs=1,
        gbs=8,
        recompute="full",
        max_steps=20,
    )


class Raising(SimBackend):
    def __init__(self, error: BaseException, declared: tuple[type[Exception], ...] | None = None):
        super().__init__()
        self.error = error
        if declared is not None:
            self.run_errors = declared

    def run(self, plan, run_dir, stop=None):
        raise self.error


def test_a_declared_error_of_the_backend_is_a_failed_trial(tmp_path):
    m = run_trial(
        _trial(), tmp_path / "a", Raising(FileNotFoundError(errno.ENOENT, "no such file", "torchrun")), SETTINGS
    )
    assert m.status == "failed" and m.reason.startswith("infrastructure: backend sim raised FileNotFoundError")
    m = run_trial(_trial(), tmp_path / "b", Raising(RuntimeError("launcher gone"), declared=(RuntimeError,)), SETTINGS)
    assert m.status == "failed" and "launcher gone" in m.reason


def test_a_bug_in_the_backend_propagates(tmp_path):
    with pytest.raises(ZeroDivisionError):
        run_trial(_trial(), tmp_path / "a", Raising(ZeroDivisionError("division by zero")), SETTINGS)
    with pytest.raises(RuntimeError):  # not declared by this backend: a bug, not an outcome
        run_trial(_trial(), tmp_path / "b", Raising(RuntimeError("oops")), SETTINGS)


def test_a_full_disk_is_dses_failure_not_the_trials(tmp_path):
    with pytest.raises(InfrastructureError, match="No space left"):
        run_trial(_trial(), tmp_path / "a", Raising(OSError(errno.ENOSPC, "No space left on device")), SETTINGS)


class Polling(SimBackend):
    """A backend whose run lasts until its stop check says stop (a scheduler's poll loop)."""

    interruptible = True

    def __init__(self):
        super().__init__()
        self.stops: list = []

    def run(self, plan, run_dir, stop=None):
        self.stops.append(stop)
        if stop is None:
            return super().run(plan, run_dir)
        while not stop(run_dir / "log.txt"):
            time.sleep(0.01)
        return RunResult(run_dir=run_dir, log_path=run_dir / "log.txt", exit_code=None, stopped=True)


def test_the_cancel_event_stops_an_interruptible_run_through_its_stop_check(tmp_path):
    cancel = threading.Event()
    backend = Polling()
    timer = threading.Timer(0.2, cancel.set)
    timer.start()
    try:
        with pytest.raises(Cancelled):
            run_trial(_trial(), tmp_path / "a", backend, SETTINGS, cancel=cancel)
    finally:
        timer.cancel()
    assert isinstance(backend.stops[0], CancelCheck)
    run_trial(_trial(), tmp_path / "b", backend, SETTINGS)  # no cancel event: no stop check at all
    assert backend.stops[1] is None


def test_a_run_that_is_not_interruptible_finishes_and_its_result_stands(tmp_path):
    cancel = threading.Event()
    cancel.set()
    m = run_trial(_trial(), tmp_path / "a", SimBackend(), SETTINGS, cancel=cancel)
    assert m.status == "ok" and m.steps == 20


class CountingMonitor:
    """An early-stop monitor stand-in: counts the looks, never decides."""

    decided = False

    def __init__(self, poll_s: float):
        self.poll_s, self.looks = poll_s, 0

    def __call__(self, log_path) -> bool:
        self.looks += 1
        return False


def test_the_cancel_check_asks_the_monitor_at_the_monitors_own_interval(tmp_path):
    cancel = threading.Event()
    rare, often = CountingMonitor(poll_s=3600.0), CountingMonitor(poll_s=0.0)
    check_rare, check_often = CancelCheck(cancel, rare), CancelCheck(cancel, often)
    for _ in range(3):
        assert not check_rare(tmp_path / "log.txt") and not check_often(tmp_path / "log.txt")
    assert rare.looks == 0 and often.looks == 3  # the backend may poll faster than the monitor looks
    cancel.set()
    assert check_rare(tmp_path / "log.txt") and CancelCheck(cancel)(tmp_path / "log.txt")


class Timed(SimBackend):
    """A backend that reports the given wall time (None: the caller measures it)."""

    def __init__(self, wall_s):
        super().__init__()
        self.wall_s = wall_s

    def run(self, plan, run_dir, stop=None):
        return replace(super().run(plan, run_dir), wall_s=self.wall_s)


@pytest.mark.parametrize("wall_s", [-7189.5, float("nan"), float("-inf")])
def test_a_negative_or_broken_wall_time_is_unknown_not_a_negative_cost(tmp_path, wall_s):
    from dse.study.recording import gpu_hours

    m = run_trial(_trial(), tmp_path / "a", Timed(wall_s), SETTINGS)
    assert m.status == "ok" and m.wall_s is None
    assert gpu_hours({"launched": True, "num_gpus": 2, "metrics": {"wall_s": wall_s}}) is None


def test_a_clock_that_jumps_back_during_a_run_gives_no_negative_duration(tmp_path, monkeypatch):
    import dse.execute as execute

    readings = iter([1_000_000.0, 1_000_000.0 - 7200.0])  # before the run, after it: the clock went back

    class Clock:
        @staticmethod
        def monotonic():
            return next(readings)

    monkeypatch.setattr(execute, "time", Clock)
    m = run_trial(_trial(), tmp_path / "a", Timed(None), SETTINGS)
    assert m.status == "ok" and m.wall_s is None


def test_the_run_is_timed_on_the_monotonic_clock_not_the_wall_clock(tmp_path, monkeypatch):
    import dse.execute as execute

    calls = []

    class Clock:
        @staticmethod
        def monotonic():
            calls.append("monotonic")
            return 100.0 + 5.0 * len(calls)

    monkeypatch.setattr(execute, "time", Clock)  # a call of time.time() would be an AttributeError
    m = run_trial(_trial(), tmp_path / "a", Timed(None), SETTINGS)
    assert m.wall_s == 5.0 and calls == ["monotonic", "monotonic"]
