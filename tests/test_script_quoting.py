"""Nothing a user writes reaches a shell unquoted: generated scripts keep $(...), backticks and ; inert.

The plans here are built by hand, bypassing the knob types' validation, so that only the script writers'
quoting stands between the values and the shell.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dse.backends.local import render_local_script, write_local_script
from dse.backends.scripts import stage_code
from dse.backends.slurm import render_sbatch
from dse.errors import UserError
from dse.launch import build_plan
from dse.recipes.sim.logwriter import SimRun
from tests.trials import trial


def hostile_values(marker_dir: Path) -> dict[str, str]:
    m = marker_dir
    return {
        "DSE_EVIL_SUBST": f"$(touch {m}/subst)",
        "DSE_EVIL_TICKS": f"`touch {m}/ticks`",
        "DSE_EVIL_SEMI": f"x; touch {m}/semi",
        "DSE_EVIL_QUOTE": f"'; touch {m}/quote; '",
        "DSE_EVIL_NEWLINE": f"a\ntouch {m}/newline",
    }


def hostile_plan(marker_dir: Path):
    plan = build_plan(
        trial(tp=2, pp=1, cp=1, vp=1, max_steps=2),
        payload="sim",
        sim_run=SimRun(step_time_s=1.0, tflops_per_gpu=100.0, gbs=8, max_steps=2),
    )
    evil = hostile_values(marker_dir)
    env = {**plan.env, **evil, "DSE_SIM_ECHO_ENV": ",".join(evil)}
    argv = plan.argv + (f"optim.config.lr=$(touch {marker_dir}/argv)",)
    return dataclasses.replace(plan, env=env, argv=argv), evil


def test_local_script_runs_with_hostile_values_inert(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    plan, evil = hostile_plan(markers)
    run_dir = tmp_path / "run"
    stage_code(run_dir)
    script = write_local_script(plan, run_dir)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert list(markers.iterdir()) == []
    log = (run_dir / "log.txt").read_text()
    for name, value in evil.items():  # each value reached the process literally
        first = value.splitlines()[0]
        assert f"[NeMo I] env {name}={first}" in log
    assert f"optim.config.lr=$(touch {markers}/argv)" in log


def test_sbatch_exports_are_quoted(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    plan, evil = hostile_plan(markers)
    script = render_sbatch(plan, tmp_path / "run")
    # the environment section of nemo-run's script, run on its own, then the values read back
    start = script.index("export CUDA_DEVICE_MAX_CONNECTIONS")
    block = script[start : script.index("# Command 1")]
    probe = block + "\n" + "\n".join(f'printf "%s\\0" "${name}"' for name in evil)
    r = subprocess.run(["bash", "-c", probe], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split("\0")[:-1] == list(evil.values())
    assert list(markers.iterdir()) == []
    srun = next(line for line in script.splitlines() if line.startswith("srun --output"))
    assert f"'optim.config.lr=$(touch {markers}/argv)'" in srun


def test_hostile_environment_names_are_refused(tmp_path):
    plan, _ = hostile_plan(tmp_path)
    bad = dataclasses.replace(plan, env={"X=1; touch /tmp/y; Y": "1"})
    with pytest.raises(UserError, match="not an environment variable name"):
        render_local_script(bad, tmp_path)
    with pytest.raises(UserError, match="not an environment variable name"):
        render_sbatch(bad, tmp_path)


@pytest.mark.parametrize("name", ["run dir", "a$(b)", "x;y", "q'uote"])
def test_run_directories_with_shell_characters_are_refused(tmp_path, name):
    plan, _ = hostile_plan(tmp_path)
    with pytest.raises(UserError, match="job script cannot carry"):
        render_sbatch(plan, tmp_path / name)
    with pytest.raises(UserError, match="job script cannot carry"):
        render_local_script(plan, tmp_path / name)


@pytest.mark.parametrize(
    "field, value",
    [
        ("partition", "batch;id"),
        ("account", "$(id)"),
        ("time_limit", "1h"),
        ("container_image", "img`id`"),
        ("srun_args", ["--mpi=pmix; id"]),
        ("container_mounts", ["/a:/b $(id)"]),
    ],
)
def test_system_slurm_fields_are_validated(tmp_path, field, value):
    from tests.trials import system

    sys_ = system("h100", slurm={field: value})
    plan = build_plan(trial(sys=sys_, tp=2, pp=1, cp=1, vp=1))
    with pytest.raises(UserError, match=re.escape(f"slurm.{field}")):
        render_sbatch(plan, tmp_path / "run")
