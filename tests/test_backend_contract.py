"""Every backend in the ``dse.backends`` registry passes the backend contract (tests/contracts.py): the
simulated backend in-process, the local one through its launch script, Slurm on the local test cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dse.backends import load_backends
from dse.backends.local import LocalBackend
from dse.backends.sim import SimBackend
from dse.backends.slurm import SlurmBackend
from dse.recipes.sim.logwriter import OOM_EXIT_CODE
from tests.contracts import BackendContract


@pytest.fixture
def python_first(monkeypatch):
    """The simulated trainer's ``python`` is this interpreter."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")


class TestSimBackend(BackendContract):
    backend_name = "sim"
    oom_exit_codes = (OOM_EXIT_CODE,)

    def make_backend(self):
        return SimBackend()


@pytest.mark.usefixtures("python_first")
class TestLocalBackend(BackendContract):
    backend_name = "local"
    oom_exit_codes = (OOM_EXIT_CODE,)

    def make_backend(self):
        return LocalBackend()

    def test_runs_the_simulated_trainer_through_its_launch_script(self, tmp_path):
        r = LocalBackend().run(self.plan(self.run_steps), tmp_path)
        assert r.log_path == tmp_path / "log.txt" and (tmp_path / "launch.sh").exists()
        assert (tmp_path / "code" / "recipes" / "sim" / "__main__.py").exists()


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
class TestSlurmBackend(BackendContract):
    backend_name = "slurm"
    collects_after_interrupt = True

    def make_backend(self):
        return SlurmBackend(poll_s=0.3, settle_s=20)


CONTRACTS = {c.backend_name for c in (TestSimBackend, TestLocalBackend, TestSlurmBackend)}


def test_every_registered_backend_has_a_contract_class():
    assert set(load_backends()) <= CONTRACTS, f"no contract class for {set(load_backends()) - CONTRACTS}"
