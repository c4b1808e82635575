"""Hostile and unlucky input (issue 11): nothing runs that the user did not write, nothing recorded is lost.

The hostile cases go through real subprocesses: ``python -m dse`` for what a user types, ``bash launch.sh``
for a local script, ``bash -n`` plus a marker file for an sbatch script.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dse.errors import UserError
from tests.helpers import SMALL_SPACE, write_space


def dse(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run([sys.executable, "-m", "dse", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def one_line_error(r, *needles):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def space_text(**repl) -> str:
    text = SMALL_SPACE
    for old, new in repl.items():
        text = text.replace(old, new)
    return text


# -- 1. names are names; nothing unquoted in a script, comments included --------------------------------------
def test_system_name_with_a_newline_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    text = SMALL_SPACE.replace('system = "h100"',
                               f'system = {{name = "x\\ntouch {marker}\\n", gpu = "h100", gpus_per_node = 1}}')
    text = text.replace("num_nodes = 2", "num_nodes = 1").replace("[search]", '[backend]\nkind = "local"\npayload = "sim"\n\n[search]')
    path = write_space(tmp_path, text)
    r = dse("run", "--space", path, "--out", tmp_path / "out", "--trials", "1", "--agent", "random")
    one_line_error(r, "system.name", "is not a name")
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["x\n", "a b", "../x", "/abs", "..", "x;y"])
def test_names_are_full_matches(name):
    from dse.space import System
    from tests.trials import space, system

    with pytest.raises(Exception, match="is not a name"):
        System.model_validate({"name": name, "gpu": "h100"})
    with pytest.raises(Exception, match="is not a name"):
        space(sys=system(), name=name)


def _hostile_local_plan(tmp_path, marker):
    from dse.launch import build_plan
    from recipes.sim.logwriter import SimRun
    from tests.trials import system, trial

    # a name that validation would refuse, forced in, so that only the script writer stands in the way
    sys_ = system("h100", gpus_per_node=1).model_copy(update={"name": f"x\ntouch {marker}\n"})
    plan = build_plan(trial(sys=sys_, num_nodes=1, tp=1, pp=1, cp=1, vp=1, max_steps=2, env_ENABLE_VBOOST="1"),
                      payload="sim", sim_run=SimRun(step_time_s=1.0, tflops_per_gpu=100.0, gbs=8, max_steps=2))
    return plan


def test_local_script_comments_carry_no_command(tmp_path):
    from dse.backends.local import write_local_script
    from dse.backends.scripts import stage_code

    marker = tmp_path / "marker"
    plan = _hostile_local_plan(tmp_path, marker)
    run_dir = tmp_path / "run"
    stage_code(run_dir)
    script = write_local_script(plan, run_dir)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    assert all(line.startswith("#") for line in script.read_text().splitlines() if "touch" in line)


def test_sbatch_script_with_a_hostile_system_name_runs_nothing(tmp_path):
    from dse.backends.slurm import render_sbatch

    marker = tmp_path / "marker"
    plan = _hostile_local_plan(tmp_path, marker)
    text = render_sbatch(plan, tmp_path / "run")
    script = tmp_path / "launch.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    # the environment section, run for real: nothing of the name may execute
    block = text[text.index("export "):text.index("# Command 1")]
    block = "\n".join(ln for ln in block.splitlines() if not ln.startswith("srun "))
    r = subprocess.run(["bash", "-c", block], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()


# -- 2. environment names that change which program runs need an opt-in ---------------------------------------
@pytest.mark.parametrize("var", ["LD_PRELOAD", "PATH", "PYTHONPATH", "BASH_ENV", "LD_AUDIT", "BASH_FUNC_x%%"])
def test_protected_environment_names_need_an_opt_in(tmp_path, var):
    path = write_space(tmp_path, space_text(**{"max_steps = 20": f'max_steps = 20\n"env.{var}" = "/tmp/x"'}))
    r = dse("validate", path)
    if var == "BASH_FUNC_x%%":  # not even a name
        one_line_error(r, "is not an environment variable name")
        return
    line = one_line_error(r, f"settings.env.{var}", "allow_env")
    assert str(path) in line
    allowed = write_space(tmp_path, space_text(**{
        "max_steps = 20": f'max_steps = 20\n"env.{var}" = "/tmp/x"',
        "[search]": f'[backend]\nallow_env = ["{var}"]\n\n[search]'}), name="allowed.toml")
    r = dse("validate", allowed)
    assert r.returncode == 0, r.stderr


def test_environment_name_with_a_trailing_newline_is_refused():
    from dse import knobs

    with pytest.raises(UserError, match="not an environment variable name"):
        knobs.get("env.FOO\n")
    from dse.backends.scripts import check_env

    with pytest.raises(UserError, match="not an environment variable name"):
        check_env({"FOO\n": "1"})


def test_srun_export_of_a_protected_name_needs_the_opt_in(tmp_path):
    sysfile = tmp_path / "sys.toml"
    sysfile.write_text('gpu = "h100"\n[slurm]\ncontainer_image = "nvcr.io#nvidia/nemo:25.09"\n'
                       'srun_args = ["--export=ALL,LD_PRELOAD=/tmp/evil.so"]\n')
    path = write_space(tmp_path, space_text(**{'system = "h100"': f'system = "{sysfile}"'}))
    one_line_error(dse("validate", path), "srun_args", "LD_PRELOAD", "allow_env")


# -- 3. every Slurm field is checked when the file is read ---------------------------------------------------
@pytest.mark.parametrize("line, field", [
    ('container_image = "#nvidia/nemo:25.09"', "slurm.container_image"),
    ('job_dir = "/scratch/%u/jobs"', "slurm.job_dir"),
    ('partition = "batch\\nid"', "slurm.partition"),
    ('time_limit = "1h"', "slurm.time_limit"),
    ('srun_args = ["--mpi=pmix\\n"]', "slurm.srun_args"),
])
def test_slurm_fields_are_validated_by_dse_validate(tmp_path, line, field):
    sysfile = tmp_path / "sys.toml"
    sysfile.write_text(f'gpu = "h100"\n[slurm]\n{line}\n')
    path = write_space(tmp_path, space_text(**{'system = "h100"': f'system = "{sysfile}"'}))
    one_line_error(dse("validate", path), field, str(sysfile))


def test_job_dir_is_refused_before_any_directory_is_made(tmp_path):
    from dse.backends.slurm import SlurmBackend
    from dse.launch import build_plan
    from tests.trials import system, trial

    job_dir = tmp_path / "jobs%u"
    sys_ = system("h100", slurm={"job_dir": str(job_dir)})
    plan = build_plan(trial(sys=sys_, tp=2, pp=1, cp=1, vp=1))
    with pytest.raises(UserError, match="slurm.job_dir"):
        SlurmBackend().run(plan, tmp_path / "run")
    assert not job_dir.exists()


# -- 4. a name cannot leave its directory -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["/abs/x", "../../x", "a/b", ".."])
def test_space_name_cannot_leave_runs(tmp_path, name):
    path = write_space(tmp_path, space_text(**{'name = "small"': f'name = "{name}"'}))
    one_line_error(dse("run", "--space", path, cwd=tmp_path), "name", "is not a name")
    assert not (tmp_path / "runs").exists() and not Path("/abs").exists()


@pytest.mark.parametrize("ref", ["..", ".", "h100\n", "h100 "])
def test_system_name_cannot_traverse_out_of_conf_systems(tmp_path, ref):
    from dse.space import load_system

    with pytest.raises(UserError, match="unknown system"):
        load_system(ref)


def test_a_system_spelled_with_a_slash_is_a_path_not_a_name_under_conf_systems():
    from dse.space import load_system

    # conf/systems/../systems/h100.toml exists; as a path from here, ../systems/h100 does not
    with pytest.raises(UserError, match="no such file"):
        load_system("../systems/h100")


def test_a_system_path_is_spelled_with_a_slash_or_toml(tmp_path):
    from dse.space import load_system

    (tmp_path / "mine.toml").write_text('gpu = "h200"\n')
    assert load_system(tmp_path / "mine.toml").gpu == "h200"
    assert load_system("h100").gpu == "h100"


# -- 5. dse's own I/O errors stop the study; nothing is recorded for that trial; --resume runs it -----------
def _full_disk_after(monkeypatch, n):
    """Fault injection at the simulated backend's log write: the (n+1)-th log write finds the disk full."""
    import errno

    import dse.backends.sim as sim

    real, calls = sim.write_log, {"n": 0}

    def write_log(run, fh):
        calls["n"] += 1
        if calls["n"] > n:
            raise OSError(errno.ENOSPC, "No space left on device", fh.name)
        return real(run, fh)

    monkeypatch.setattr(sim, "write_log", write_log)


def test_a_full_disk_stops_the_study_and_resume_reruns_the_trial(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dse.cli import app
    from dse.study import open_store

    path = write_space(tmp_path)
    out = tmp_path / "out"
    _full_disk_after(monkeypatch, 5)
    r = CliRunner().invoke(app, ["run", "--space", str(path), "--out", str(out)])
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "--resume" in lines[0], r.output
    store, _ = open_store(out)
    records = store.records()
    store.close()
    assert len(records) == 5 and not any("OSError" in (x.reason or "") for x in records)
    monkeypatch.undo()
    r = CliRunner().invoke(app, ["run", "--space", str(path), "--out", str(out), "--resume"])
    assert r.exit_code == 0, r.output
    store, _ = open_store(out)
    records = store.records()
    store.close()
    fresh = tmp_path / "fresh"
    assert CliRunner().invoke(app, ["run", "--space", str(path), "--out", str(fresh)]).exit_code == 0
    ref, _ = open_store(fresh)
    expected = ref.records()
    ref.close()
    assert [(x.knobs, x.status) for x in records] == [(x.knobs, x.status) for x in expected]
    assert not any("OSError" in (x.reason or "") for x in records)


def test_an_unwritable_store_is_infrastructure_not_a_trial(tmp_path):
    from dse.errors import InfrastructureError
    from dse.store import Store, TrialRecord

    store = Store(f"sqlite:///{tmp_path / 'x.db'}", "s", {"tp": [1, 2]}, batch_size=1)
    (tmp_path / "x.db").unlink()  # the database is gone under the running study
    with pytest.raises(InfrastructureError, match="cannot write the study"):
        store.record(TrialRecord(number=0, knobs={"tp": 1}, status="ok", reward=1.0))
    store.close()
