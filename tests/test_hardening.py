"""Hostile and unlucky input (issue 11): nothing runs that the user did not write, nothing recorded is lost.

What a user types runs through the ``dse`` command in this process (tests.helpers.dse: Typer's CliRunner;
tests/test_cli_smoke.py runs the real ``python -m dse``); the scripts dse writes run in real subprocesses:
``bash launch.sh`` for a local script, ``bash -n`` plus a marker file for an sbatch script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dse.errors import UserError
from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space


def space_text(**repl) -> str:
    text = SMALL_SPACE
    for old, new in repl.items():
        text = text.replace(old, new)
    return text


# -- 1. names are names; nothing unquoted in a script, comments included --------------------------------------
def test_system_name_with_a_newline_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    text = SMALL_SPACE.replace(
        'system = "h100"', f'system = {{name = "x\\ntouch {marker}\\n", gpu = "h100", gpus_per_node = 1}}'
    )
    text = text.replace("num_nodes = 2", "num_nodes = 1").replace(
        "[search]", '[backend]\nkind = "local"\npayload = "sim"\n\n[search]'
    )
    path = write_space(tmp_path, text)
    r = dse("run", "--space", path, "--out", tmp_path / "out", "--trials", "1", "--agent", "random")
    one_line_error(r, "system.name", "is not a name")
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["x\n", "a b", "../x", "/abs", "..", "x;y"])
def test_names_are_full_matches(name):
    from dse.rules.space import System
    from tests.trials import space, system

    with pytest.raises(Exception, match="is not a name"):
        System.model_validate({"name": name, "gpu": "h100"})
    with pytest.raises(Exception, match="is not a name"):
        space(sys=system(), name=name)


def _hostile_local_plan(tmp_path, marker):
    from dse.launch import build_plan
    from dse.recipes.sim.logwriter import SimRun
    from tests.trials import system, trial

    # a name that validation would refuse, forced in, so that only the script writer stands in the way
    sys_ = system("h100", gpus_per_node=1).model_copy(update={"name": f"x\ntouch {marker}\n"})
    plan = build_plan(
        trial(sys=sys_, num_nodes=1, tp=1, pp=1, cp=1, vp=1, max_steps=2, env_ENABLE_VBOOST="1"),
        payload="sim",
        sim_run=SimRun(step_time_s=1.0, tflops_per_gpu=100.0, gbs=8, max_steps=2),
    )
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
    block = text[text.index("export ") : text.index("# Command 1")]
    block = "\n".join(ln for ln in block.splitlines() if not ln.startswith("srun "))
    r = subprocess.run(["bash", "-c", block], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()


# -- 2. environment names outside the tuning families need an opt-in (LD_*, PYTHON*: tests/test_allowlists.py) ---
@pytest.mark.parametrize("var", ["PATH", "BASH_ENV", "HOME", "BASH_FUNC_x%%"])
def test_protected_environment_names_need_an_opt_in(tmp_path, var):
    path = write_space(tmp_path, space_text(**{"max_steps = 20": f'max_steps = 20\n"env.{var}" = "/tmp/x"'}))
    r = dse("validate", path)
    if var == "BASH_FUNC_x%%":  # not even a name
        one_line_error(r, "is not an environment variable name")
        return
    line = one_line_error(r, f"settings.env.{var}", "allow_env")
    assert str(path) in line
    allowed = write_space(
        tmp_path,
        space_text(
            **{
                "max_steps = 20": f'max_steps = 20\n"env.{var}" = "/tmp/x"',
                "[search]": f'[backend]\nallow_env = ["{var}"]\n\n[search]',
            }
        ),
        name="allowed.toml",
    )
    r = dse("validate", allowed)
    assert r.exit_code == 0, r.output


def test_environment_name_with_a_trailing_newline_is_refused():
    from dse.facts import knobs

    with pytest.raises(UserError, match="not an environment variable name"):
        knobs.get("env.FOO\n")
    from dse.backends.scripts import check_env

    with pytest.raises(UserError, match="not an environment variable name"):
        check_env({"FOO\n": "1"})


def test_srun_export_is_refused(tmp_path):
    sysfile = tmp_path / "sys.toml"
    sysfile.write_text(
        'gpu = "h100"\n[slurm]\ncontainer_image = "nvcr.io#nvidia/nemo:25.09"\n'
        'srun_args = ["--export=ALL,LD_PRELOAD=/tmp/evil.so"]\n'
    )
    path = write_space(tmp_path, space_text(**{'system = "h100"': f'system = "{sysfile}"'}))
    one_line_error(dse("validate", path), "slurm.srun_args", "--export is not allowed", "changes the environment")


# -- 3. every Slurm field is checked when the file is read ---------------------------------------------------
@pytest.mark.parametrize(
    "line, field",
    [
        ('container_image = "#nvidia/nemo:25.09"', "slurm.container_image"),
        ('job_dir = "/scratch/%u/jobs"', "slurm.job_dir"),
        ('partition = "batch\\nid"', "slurm.partition"),
        ('time_limit = "1h"', "slurm.time_limit"),
        ('srun_args = ["--mpi=pmix\\n"]', "slurm.srun_args"),
    ],
)
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
@pytest.mark.parametrize("name", ["{tmp}/abs", "../../x", "a/b", ".."])
def test_space_name_cannot_leave_runs(tmp_path, name):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    name = name.format(tmp=tmp_path)
    path = write_space(tmp_path, space_text(**{'name = "small"': f'name = "{name}"'}))
    one_line_error(dse("run", "--space", path, cwd=work), "name", "is not a name")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "space.toml"]


@pytest.mark.parametrize("ref", ["..", ".", "h100\n", "h100 "])
def test_system_name_cannot_traverse_out_of_conf_systems(tmp_path, ref):
    from dse.rules.space import load_system

    with pytest.raises(UserError, match="unknown system"):
        load_system(ref)


def test_a_system_spelled_with_a_slash_is_a_path_not_a_name_under_conf_systems():
    from dse.rules.space import load_system

    # conf/systems/../systems/h100.toml exists; as a path from here, ../systems/h100 does not
    with pytest.raises(UserError, match="no such file"):
        load_system("../systems/h100")


def test_a_system_path_is_spelled_with_a_slash_or_toml(tmp_path):
    from dse.rules.space import load_system

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
    from dse.study.loop import open_store

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
    from dse.study.store import Store, TrialRecord

    store = Store(f"sqlite:///{tmp_path / 'x.db'}", "s", {"tp": [1, 2]}, batch_size=1)
    (tmp_path / "x.db").unlink()  # the database is gone under the running study
    with pytest.raises(InfrastructureError, match="cannot write the study"):
        store.record(TrialRecord(number=0, knobs={"tp": 1}, status="ok", reward=1.0))
    store.close()


# -- 6-8. resume and storage safety -----------------------------------------------------------------------
def _run(path, out, *extra):
    from typer.testing import CliRunner

    from dse.cli import app

    return CliRunner().invoke(
        app, ["run", "--space", str(path), "--out", str(out), "--agent", "random", "--trials", "4", *map(str, extra)]
    )


@pytest.mark.parametrize("how", ["deleted", "emptied"])
def test_resume_without_the_study_database_refuses(tmp_path, how):
    path = write_space(tmp_path)
    out = tmp_path / "out"
    assert _run(path, out).exit_code == 0
    board = (out / "leaderboard.csv").read_text()
    if how == "deleted":
        (out / "study.db").unlink()
    else:
        (out / "study.db").write_bytes(b"")
    r = dse("run", "--space", path, "--out", out, "--resume", "--agent", "random", "--trials", "8")
    one_line_error(r, "holds no study 'small'", "4 trials ran", "--rebuild")
    assert (out / "leaderboard.csv").read_text() == board
    assert not list((out / "trials").glob("*.orphan*"))
    r = _run(path, out, "--resume", "--rebuild")
    assert r.exit_code == 0, r.output
    assert len(list((out / "trials").glob("*.orphan*"))) == 4


def test_a_moved_study_reads_and_resumes_its_own_database(tmp_path):
    from dse.study.loop import open_store

    path = write_space(tmp_path)
    first = tmp_path / "first"
    assert _run(path, first).exit_code == 0
    assert json.loads((first / "dse.json").read_text())["storage"] == "study.db"
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(first, copy)
    shutil.move(str(first), tmp_path / "moved")
    r = dse("leaderboard", tmp_path / "moved")
    assert r.exit_code == 0, r.output
    assert _run(path, copy, "--resume", "--trials", "6").exit_code == 0
    store, _ = open_store(tmp_path / "moved")
    assert len(store.records()) == 4  # the copy wrote into its own database, not the original's
    store.close()


def test_an_explicit_relative_storage_is_made_absolute_when_given(tmp_path, monkeypatch):
    path = write_space(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert _run(path, tmp_path / "out", "--storage", "sqlite:///elsewhere.db").exit_code == 0
    meta = json.loads((tmp_path / "out" / "dse.json").read_text())
    assert meta["storage"] == f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.chdir(tmp_path / "out")
    r = dse("leaderboard", tmp_path / "out", cwd=tmp_path / "out")
    assert r.exit_code == 0, r.output


def test_reading_a_directory_without_a_database_creates_nothing(tmp_path):
    path = write_space(tmp_path)
    out = tmp_path / "out"
    assert _run(path, out).exit_code == 0
    (out / "study.db").unlink()
    for cmd in (["leaderboard", out], ["report", out]):
        one_line_error(dse(*cmd), "holds no study")
        assert not (out / "study.db").exists()


# -- 11. every number is range-checked --------------------------------------------------------------------
@pytest.mark.parametrize(
    "repl, field",
    [
        (("max_steps = 20", "max_steps = 9223372036854775807"), "settings.max_steps"),
        (("gbs = 32", "gbs = 1208925819614629174706176"), "settings.gbs"),
        (("[search]", "[objective.x]\n[search]"), "objective"),
        (('metric = "tflops_per_gpu"', 'metric = "tflops_per_gpu"\nfailure_reward = nan'), "objective.failure_reward"),
        (('metric = "tflops_per_gpu"', 'metric = "tflops_per_gpu"\nfailure_reward = inf'), "objective.failure_reward"),
        (("seed = 0", "seed = -1"), "search.seed"),
        (("num_nodes = 2", "num_nodes = 10000000"), "num_nodes"),
        (("[search]", "[backend]\ntimeout_s = inf\n\n[search]"), "backend.timeout_s"),
    ],
)
def test_numbers_out_of_range_are_one_line_errors(tmp_path, repl, field):
    path = write_space(tmp_path, SMALL_SPACE.replace(*repl))
    out = tmp_path / "out"
    r = dse("run", "--space", path, "--out", out)
    one_line_error(r, field)
    assert not out.exists()


# -- 12. a huge line costs bounded memory -----------------------------------------------------------------
def test_a_log_without_newlines_is_parsed_in_bounded_memory(tmp_path):
    import tracemalloc

    from dse.logs.parse import parse_log

    log = tmp_path / "log.txt"
    line = "Training epoch 0, iteration {i}/9 | global_step: {i} | train_step_timing in s: 2.5 | TFLOPS_per_GPU: 400\n"
    with open(log, "w") as fh:
        fh.write("x" * (48 << 20))  # 48 MiB with no newline
        fh.write("\n")
        for i in range(10):
            fh.write(line.format(i=i))
    tracemalloc.start()
    m = parse_log(log, exit_code=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert m.status == "ok" and m.step_time_s == 2.5


# -- 13. one line, exit 2, nothing left behind ------------------------------------------------------------
@pytest.mark.parametrize("agent", ["grid", "random"])
def test_a_negative_seed_is_a_one_line_error(tmp_path, agent):
    path = write_space(tmp_path)
    one_line_error(dse("run", "--space", path, "--out", tmp_path / "o", "--agent", agent, "--seed", "-5"), "--seed")
    assert not (tmp_path / "o").exists()


def test_a_seed_error_in_the_space_leaves_no_dse_json(tmp_path):
    path = write_space(tmp_path, SMALL_SPACE.replace("seed = 0", "seed = -1"))
    one_line_error(dse("run", "--space", path, "--out", tmp_path / "o"), "search.seed")
    path = write_space(tmp_path)
    r = dse("run", "--space", path, "--out", tmp_path / "o", "--agent", "random", "--trials", "2")
    assert r.exit_code == 0, r.output


def test_out_that_is_a_file_is_a_one_line_error(tmp_path):
    path = write_space(tmp_path)
    (tmp_path / "f").write_text("x")
    one_line_error(dse("run", "--space", path, "--out", tmp_path / "f"), "--out")


@pytest.mark.parametrize(
    "url, needle",
    [
        ("postgresql://nohost/db", "--storage"),  # no driver installed
        ("notaurl", "--storage"),
        ("mysql+nosuchdriver://x/y", "--storage"),
    ],
)
def test_bad_storage_urls_are_one_line_errors_and_leave_nothing(tmp_path, url, needle):
    path = write_space(tmp_path)
    out = tmp_path / "out"
    one_line_error(dse("run", "--space", path, "--out", out, "--storage", url), needle)
    assert not out.exists()


def test_a_corrupt_database_is_a_one_line_error(tmp_path):
    path = write_space(tmp_path)
    out = tmp_path / "out"
    assert _run(path, out).exit_code == 0
    (out / "study.db").write_bytes(b"this is not a database" * 100)
    one_line_error(dse("leaderboard", out), "study.db")
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "study.db")


@pytest.mark.parametrize("cmd, flag", [("leaderboard", "--csv"), ("report", "--html")])
def test_exports_to_a_directory_are_one_line_errors_and_leave_no_tmp(tmp_path, cmd, flag):
    path = write_space(tmp_path)
    out = tmp_path / "out"
    assert _run(path, out).exit_code == 0
    target = tmp_path / "dir"
    target.mkdir()
    one_line_error(dse(cmd, out, flag, target), flag, "is a directory")
    assert list(tmp_path.glob(".*.tmp")) == [] and list(target.iterdir()) == []


@pytest.mark.parametrize("cmd, flag", [("leaderboard", "--csv"), ("report", "--html")])
def test_a_full_disk_on_an_export_keeps_the_old_file_and_leaves_no_tmp(tmp_path, monkeypatch, cmd, flag):
    import errno

    from typer.testing import CliRunner

    from dse.cli import app

    path = write_space(tmp_path)
    out = tmp_path / "out"
    assert _run(path, out).exit_code == 0
    target = tmp_path / "export"
    target.write_text("the old export\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    r = CliRunner().invoke(app, [cmd, str(out), flag, str(target)])
    assert r.exit_code == 1 and "No space left on device" in r.output and "Traceback" not in r.output, r.output
    assert target.read_text() == "the old export\n"
    assert list(tmp_path.glob(".*.tmp")) == []


def test_an_out_that_a_script_cannot_carry_fails_before_the_study(tmp_path):
    path = write_space(tmp_path)
    out = tmp_path / "a b"
    one_line_error(dse("run", "--space", path, "--out", out), "--out")
    assert not out.exists()


def test_a_full_disk_when_writing_best_is_one_line(tmp_path, monkeypatch):
    import errno

    from typer.testing import CliRunner

    import dse.study.recording as recording
    from dse.cli import app

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(recording, "write_best", full)
    path = write_space(tmp_path)
    r = CliRunner().invoke(
        app, ["run", "--space", str(path), "--out", str(tmp_path / "o"), "--agent", "random", "--trials", "2"]
    )
    assert r.exit_code == 1 and "No space left on device" in r.output and "Traceback" not in r.output, r.output


# -- 9. a knob's value list is bounded ---------------------------------------------------------------------
def test_a_knob_with_too_many_values_is_refused(tmp_path):
    from dse.rules.space import MAX_VALUES_PER_KNOB

    values = ", ".join(str(i) for i in range(1, MAX_VALUES_PER_KNOB + 2))
    path = write_space(tmp_path, SMALL_SPACE.replace("mbs = [1, 2]", f"mbs = [{values}]"))
    one_line_error(dse("validate", path), "knobs.mbs", f"at most {MAX_VALUES_PER_KNOB}")
    ok = write_space(
        tmp_path,
        SMALL_SPACE.replace("mbs = [1, 2]", f"mbs = [{', '.join(str(i) for i in range(1, 65))}]"),
        name="ok.toml",
    )
    assert dse("validate", ok).exit_code == 0
