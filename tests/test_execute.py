"""``dse.execute.run_trial``: which exceptions of a backend are trial outcomes."""

from __future__ import annotations

import errno

import pytest

from dse.backends.sim import SimBackend
from dse.errors import InfrastructureError
from dse.execute import run_trial
from dse.space import BackendSettings
from tests.trials import system, trial

SETTINGS = BackendSettings(payload="sim")


def _trial():
    # fits in memory: the simulated run is ok
    return trial("llama3_8b", sys=system(gpus_per_node=2), num_nodes=1, tp=2, pp=1, cp=1, vp=1, mbs=1, gbs=8,
                 recompute="full", max_steps=20)


class Raising(SimBackend):
    def __init__(self, error: BaseException, declared: tuple[type[Exception], ...] | None = None):
        super().__init__()
        self.error = error
        if declared is not None:
            self.run_errors = declared

    def run(self, plan, run_dir, stop=None):
        raise self.error


def test_a_declared_error_of_the_backend_is_a_failed_trial(tmp_path):
    m = run_trial(_trial(), tmp_path / "a", Raising(FileNotFoundError(errno.ENOENT, "no such file", "torchrun")),
                  SETTINGS)
    assert m.status == "failed" and m.reason.startswith("backend sim raised FileNotFoundError")
    m = run_trial(_trial(), tmp_path / "b", Raising(RuntimeError("launcher gone"), declared=(RuntimeError,)),
                  SETTINGS)
    assert m.status == "failed" and "launcher gone" in m.reason


def test_a_bug_in_the_backend_propagates(tmp_path):
    with pytest.raises(ZeroDivisionError):
        run_trial(_trial(), tmp_path / "a", Raising(ZeroDivisionError("division by zero")), SETTINGS)
    with pytest.raises(RuntimeError):  # not declared by this backend: a bug, not an outcome
        run_trial(_trial(), tmp_path / "b", Raising(RuntimeError("oops")), SETTINGS)


def test_a_full_disk_is_dses_failure_not_the_trials(tmp_path):
    with pytest.raises(InfrastructureError, match="No space left"):
        run_trial(_trial(), tmp_path / "a", Raising(OSError(errno.ENOSPC, "No space left on device")), SETTINGS)
