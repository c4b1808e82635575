"""Every backend in the ``dse.backends`` registry passes the backend contract (tests/contracts.py): the
simulated backend in-process, the local one through its launch script, Slurm on the local test cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dse.backends import load_backends
from dse.backends.local import LocalBackend
from dse.backends.replay import ReplayBackend, read_table
from dse.backends.sim import SimBackend
from dse.backends.slurm import SlurmBackend
from dse.launch import build_plan
from dse.recipes.sim.logwriter import OOM_EXIT_CODE, SimRun
from tests.contracts import BackendContract
from tests.trials import LOCAL_SLURM, system, trial


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


REPLAY_TABLE = """trial,status,reward,step_time_s,tflops_per_gpu,tokens_per_s_per_gpu,peak_memory_gib,mbs,gpu,num_gpus,reason
0,ok,50.0,1.0,50.0,1000.0,40.5,1,h100,8,
1,oom,0.0,,,,,2,h100,8,"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
"""


class TestReplayBackend(BackendContract):
    """The replay backend over a table that records the contract's plan as an ok run (mbs 1) and, at mbs 2, as
    a run out of memory: the contract's out-of-memory plan is the recorded OOM point."""

    backend_name = "replay"
    oom_exit_codes = (OOM_EXIT_CODE,)

    @pytest.fixture(autouse=True)
    def _table(self, tmp_path_factory):
        self.table = tmp_path_factory.mktemp("replay") / "leaderboard.csv"
        self.table.write_text(REPLAY_TABLE)

    def make_backend(self):
        return ReplayBackend(read_table(self.table))

    def plan(self, max_steps: int, **run):
        t = trial(
            "llama3_70b_16l",
            sys=system(LOCAL_SLURM),
            num_nodes=1,
            tp=1,
            pp=1,
            cp=1,
            vp=1,
            gbs=4,
            mbs=2 if run.get("oom") else 1,
            max_steps=max_steps,
        )
        sim = SimRun(**{"step_time_s": 1.0, "tflops_per_gpu": 50.0, "gbs": 4, "max_steps": max_steps, **run})
        return build_plan(t, payload="sim", sim_run=sim)


CONTRACTS = {c.backend_name for c in (TestSimBackend, TestLocalBackend, TestSlurmBackend, TestReplayBackend)}


def test_every_registered_backend_has_a_contract_class():
    assert set(load_backends()) <= CONTRACTS, f"no contract class for {set(load_backends()) - CONTRACTS}"
