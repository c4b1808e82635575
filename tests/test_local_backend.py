"""The local backend's nemo-run LocalExecutor path (torchrun replaced by a stand-in that starts one process per
GPU, since there is no torch here); the simulated trainer through launch.sh is in the backend contract
(tests/test_backend_contract.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dse.backends.local import LocalBackend, local_executor
from dse.launch import build_plan
from dse.recipes.sim.logwriter import SimRun
from tests.trials import DATA, system, trial

FAKE_TORCHRUN = """#!/bin/bash
# stand-in for torchrun: --nproc-per-node copies of `python -m module args`, RANK set, first failure wins
n=1; while [ $# -gt 0 ]; do case "$1" in --nproc-per-node) n=$2; shift 2;; -m) shift; break;; --*) shift 2;; *) break;; esac; done
pids=(); for r in $(seq 0 $((n-1))); do RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n python -m "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait $p || rc=$?; done; exit $rc
"""


@pytest.fixture
def python_first(monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def plan(**run):
    t = trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml", gpus_per_node=2),
        num_nodes=1,
        tp=2,
        pp=1,
        cp=1,
        vp=1,
        gbs=8,
        max_steps=4,
    )
    return build_plan(
        t,
        payload="sim",
        sim_run=SimRun(**{"step_time_s": 1.0, "tflops_per_gpu": 50.0, "gbs": 8, "max_steps": 4, **run}),
    )


def test_local_executor_runs_one_process_per_gpu_with_torchrun():
    p = plan()
    ex = local_executor(p)
    assert ex.ntasks_per_node == 2 and ex.env_vars == dict(p.env)
    assert type(ex.get_launcher()).__name__ == "Torchrun"


def test_nemo_run_path_end_to_end_with_a_torchrun_stand_in(tmp_path, python_first, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    from dse.backends.scripts import stage_code

    stage_code(run_dir)
    r = LocalBackend()._run_nemo_run(plan(), run_dir)
    assert (r.exit_code, r.scheduler_state) == (0, "SUCCEEDED")
    assert r.log_path.read_text().count("Training epoch") == 4  # rank 0 prints, rank 1 stays quiet
