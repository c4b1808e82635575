"""Default deny for what reaches a launch: environment names, srun options, sbatch options; --segment; a movable
best/; the docs' copies of the allowlists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dse.backends.scripts import stage_code
from dse.backends.slurm import render_sbatch, write_relocatable_sbatch
from dse.facts import allowlists
from dse.launch import build_plan
from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space
from tests.trials import DATA, system, trial


def space_text(**repl: str) -> str:
    text = SMALL_SPACE
    for old, new in repl.items():
        text = text.replace(old, new)
    return text


def _with_env(tmp_path, var: str, allow: list[str] | None = None, name: str = "space.toml") -> Path:
    edits = {"max_steps = 20": f'max_steps = 20\n"env.{var}" = "1"'}
    if allow is not None:
        edits["[search]"] = f"[backend]\nallow_env = {allow!r}\n\n[search]".replace("'", '"')
    return write_space(tmp_path, space_text(**edits), name=name)


# -- environment names -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "var", ["PYTHONPYCACHEPREFIX", "SLURM_TASK_PROLOG", "SRUN_EXPORT_ENV", "SLURM_EXPORT_ENV", "SLURM_TASK_EPILOG"]
)
def test_names_that_choose_code_or_srun_options_are_refused_even_when_allowed(tmp_path, var):
    one_line_error(dse("validate", _with_env(tmp_path, var)), f"settings.env.{var}", "never set by a space")
    r = dse("validate", _with_env(tmp_path, var, allow=[var], name="allowed.toml"))
    one_line_error(r, "backend.allow_env", f"{var} cannot be allowed")


def test_a_plan_built_in_code_cannot_export_them_either():
    from dse.backends.scripts import check_env
    from dse.errors import UserError

    with pytest.raises(UserError, match="PYTHONPYCACHEPREFIX is never set"):
        check_env({"NCCL_DEBUG": "INFO", "PYTHONPYCACHEPREFIX": "/tmp/planted"})


@pytest.mark.parametrize("var", ["NCCL_IB_TIMEOUT", "NVTE_FLASH_ATTN", "TORCH_NCCL_AVOID_RECORD_STREAMS", "UB_SKIPMC"])
def test_tuning_families_need_no_opt_in(tmp_path, var):
    r = dse("validate", _with_env(tmp_path, var))
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("var", ["MY_SETTING", "NCCL_NET_PLUGIN", "NCCL_DEBUG_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"])
def test_other_names_need_allow_env(tmp_path, var):
    one_line_error(dse("validate", _with_env(tmp_path, var)), f"settings.env.{var}", "allow_env")
    r = dse("validate", _with_env(tmp_path, var, allow=[var], name="allowed.toml"))
    assert r.exit_code == 0, r.output


# -- srun options ------------------------------------------------------------------------------------------------
def _system_file(tmp_path, slurm_lines: str, gpu: str = "h100") -> Path:
    f = tmp_path / "sys.toml"
    f.write_text(f'gpu = "{gpu}"\n[slurm]\ncontainer_image = "nvcr.io#nvidia/nemo:25.09"\n{slurm_lines}\n')
    return f


def _validate_with_system(tmp_path, slurm_lines: str):
    sysfile = _system_file(tmp_path, slurm_lines)
    return dse("validate", write_space(tmp_path, space_text(**{'system = "h100"': f'system = "{sysfile}"'})))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--expor=LD_PRELOAD=/x.so"], "--expor (--export) is not allowed"),
        (["--task-prolog=/tmp/x"], "runs a program"),
        (["--prolog=/tmp/x"], "runs a program"),
        (["--task-ep", "/tmp/x"], "runs a program"),
        (["--output=/etc/cron.d/x"], "reads or writes files"),
        (["-o", "/etc/cron.d/x"], "-o (--output)"),
        (["-lE"], "-E (--preserve-env)"),
        (["--container-mounts=/:/host"], "reads or writes files"),
        (["--ex"], "ambiguous"),
        (["--nodes=3"], "dse sets it"),
        (["--bogus"], "srun has no option --bogus"),
        (["python", "evil.py"], "not an srun option"),
        (["--cpu-bind=cores;id"], "not allowed as the value of --cpu-bind"),
    ],
)
def test_srun_args_outside_the_allowlist_are_refused_in_one_line(tmp_path, args, needle):
    one_line_error(
        _validate_with_system(tmp_path, f"srun_args = {args!r}".replace("'", '"')), "slurm.srun_args", needle
    )


@pytest.mark.skipif(shutil.which("srun") is None, reason="no srun on PATH")
def test_every_option_of_the_installed_srun_is_in_the_table():
    """Abbreviations are resolved against the table: an option srun has and the table lacks would make dse resolve
    a prefix that srun calls ambiguous (harmless, as dse writes the full name) or refuse a real option."""
    text = subprocess.run(["srun", "--help"], capture_output=True, text=True).stdout
    real = set(re.findall(r"--([a-z][a-z0-9-]*)", text))
    assert real - set(allowlists.SRUN_OPTIONS) == set()
    shorts = dict(re.findall(r"^\s+-([A-Za-z]), --([a-z0-9-]+)", text, re.M))
    assert {k: allowlists.SRUN_SHORT.get(k) for k in shorts} == shorts


def test_srun_args_are_written_in_srun_s_full_spelling():
    got = allowlists.parse_srun_args(["--cpu-b", "cores", "-lu", "-c4", "--mpi=pmi2", "-K1", "--overl"])
    assert got == [
        "--cpu-bind=cores",
        "--label",
        "--unbuffered",
        "--cpus-per-task=4",
        "--mpi=pmi2",
        "--kill-on-bad-exit=1",
        "--overlap",
    ]
    sys_ = system("h100", slurm={"srun_args": ["--cpu-b", "cores"]})
    text = render_sbatch(build_plan(trial(sys=sys_, tp=2, pp=1, cp=1, vp=1)), Path("/tmp/dse-allow/run"))
    assert "--cpu-bind=cores " in text and "--cpu-b " not in text


# -- sbatch options ----------------------------------------------------------------------------------------------
def test_sbatch_options_become_sbatch_lines():
    opts = {"qos": "high", "reservation": "perf-res", "constraint": "nvl72&ib", "time_min": "00:20:00", "nice": 10}
    sys_ = system("h100", slurm={"sbatch_options": {**opts, "spread-job": True, "contiguous": False}})
    text = render_sbatch(build_plan(trial(sys=sys_, tp=2, pp=1, cp=1, vp=1)), Path("/tmp/dse-allow/run"))
    for line in (
        "#SBATCH --qos=high",
        "#SBATCH --reservation=perf-res",
        "#SBATCH --constraint='nvl72&ib'",
        "#SBATCH --time-min=00:20:00",
        "#SBATCH --nice=10",
        "#SBATCH --spread-job",
    ):
        assert line in text.splitlines(), line
    assert "contiguous" not in text


@pytest.mark.parametrize(
    "line, needle",
    [
        ('output = "/etc/cron.d/x"', "'output' is not an sbatch option dse writes"),
        ('wrap = "id"', "'wrap' is not an sbatch option"),
        ('export = "ALL,LD_PRELOAD=/x.so"', "'export' is not an sbatch option"),
        ('partition = "batch"', "set slurm.partition instead"),
        ('qos = "high\\nid"', "is not allowed; use a quality of service name"),
        ('nice = "x"', "nice: an integer"),
        ("segment = -1", "segment: an integer from 0"),
    ],
)
def test_refused_sbatch_options(tmp_path, line, needle):
    r = _validate_with_system(tmp_path, f"[slurm.sbatch_options]\n{line}")
    one_line_error(r, "slurm.sbatch_options", needle)


# -- --segment for NVLink domains that span nodes ----------------------------------------------------------------
@pytest.mark.parametrize(
    "gpu, nodes, options, segment",
    [
        ("gb200", 2, {}, "2"),
        ("gb200", 18, {}, "18"),
        ("gb200", 32, {}, "16"),  # the largest divisor of 32 nodes within one 18-node domain
        ("gb200", 32, {"segment": 8}, "8"),  # the system file's own
        ("gb200", 32, {"segment": 0}, None),  # none: a Slurm without the topology/block plugin
        ("h100", 4, {}, None),  # an 8-GPU domain is one node
    ],
)
def test_segment_keeps_the_job_in_nvlink_domains(gpu, nodes, options, segment):
    sys_ = system(gpu, slurm={"sbatch_options": options})
    text = render_sbatch(build_plan(trial("llama3_70b", sys=sys_, num_nodes=nodes)), Path("/tmp/dse-allow/run"))
    got = re.findall(r"^#SBATCH --segment=(\S+)$", text, re.M)
    assert got == ([segment] if segment else [])


# -- container images as squashfs files --------------------------------------------------------------------------
def test_a_squashfs_image_path_is_accepted_and_reaches_srun(tmp_path):
    f = tmp_path / "squash-system.toml"
    f.write_text('gpu = "h100"\n[slurm]\ncontainer_image = "/lustre/images/nemo-25.09.sqsh"\n')
    r = dse("validate", write_space(tmp_path, space_text(**{'system = "h100"': f'system = "{f}"'})))
    assert r.exit_code == 0, r.output
    sys_ = system("h100", slurm={"container_image": "/lustre/images/nemo-25.09.sqsh"})
    text = render_sbatch(build_plan(trial(sys=sys_, tp=2, pp=1, cp=1, vp=1)), Path("/tmp/dse-allow/run"))
    assert "--container-image /lustre/images/nemo-25.09.sqsh " in text


# -- best/ names no path of the controller -----------------------------------------------------------------------
def test_best_scripts_name_no_path_of_the_study(tmp_path):
    from dse.rules.space import load_space
    from dse.study import loop as study_mod

    space = load_space(write_space(tmp_path, SMALL_SPACE.replace("num_nodes = 2", "num_nodes = 1")))
    out = tmp_path / "study-out"
    study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid"))
    for name in ("launch.sbatch", "launch.sh"):
        text = (out / "best" / name).read_text()
        assert str(tmp_path) not in text and "/DSE_RELOCATABLE" not in text, name
        assert '"${DSE_DIR}"' in text
    sbatch = (out / "best" / "launch.sbatch").read_text()
    assert "#SBATCH --output=sbatch.out" in sbatch and "--chdir" not in sbatch.split("# Command 1")[0]
    assert subprocess.run(["bash", "-n", str(out / "best" / "launch.sbatch")]).returncode == 0
    # submitted from another folder, it stops at once and says why instead of starting srun without its code
    head = sbatch.split("set -evx")[0]
    r = subprocess.run(["bash", "-c", head], env={"SLURM_SUBMIT_DIR": str(tmp_path)}, capture_output=True, text=True)
    assert r.returncode == 2 and "submit from the folder of launch.sbatch" in r.stderr
    r = subprocess.run(["bash", "-c", head], env={"SLURM_SUBMIT_DIR": str(out / "best")}, capture_output=True)
    assert r.returncode == 0


def test_best_launch_sh_moved_to_another_directory_still_runs(tmp_path):
    import os
    import sys

    from dse.recipes.sim.logwriter import SimRun
    from dse.study import best as best_mod

    t = trial("llama3_70b_16l", sys=system("h100"), num_nodes=1, tp=1, pp=1, cp=1, vp=1, gbs=4, max_steps=3)
    run = SimRun(step_time_s=0.01, tflops_per_gpu=100.0, gbs=4, max_steps=3)
    best = tmp_path / "study" / "best"
    best.mkdir(parents=True)
    stage_code(best)
    best_mod._write_scripts(build_plan(t, payload="sim", sim_run=run), best, one_node=True)
    moved = tmp_path / "elsewhere" / "best-copy"
    shutil.copytree(best, moved)
    shutil.rmtree(tmp_path / "study")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("DSE_DIR", None)
    r = subprocess.run(["bash", "best-copy/launch.sh"], cwd=moved.parent, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (moved / "log.txt").read_text().count("train_step_timing in s") == 3


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_best_moved_to_another_directory_still_submits(tmp_path):
    from dse.backends.slurm import SlurmBackend, query_state
    from dse.recipes.sim.logwriter import SimRun

    sys_ = system(DATA / "systems" / "local_slurm.toml")
    t = trial("llama3_70b_16l", sys=sys_, num_nodes=1, tp=1, pp=1, cp=1, vp=1, gbs=4, max_steps=3)
    run = SimRun(step_time_s=1.0, tflops_per_gpu=100.0, gbs=4, max_steps=3)
    best = tmp_path / "study" / "best"
    write_relocatable_sbatch(build_plan(t, payload="sim", sim_run=run), best)
    stage_code(best)
    moved = tmp_path / "login-node" / "copied-best"
    shutil.copytree(best, moved.parent / "copied-best")
    shutil.rmtree(tmp_path / "study")  # nothing of the old place is left to find
    r = subprocess.run(["sbatch", "--parsable", "launch.sbatch"], cwd=moved, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    end = SlurmBackend(poll_s=0.5, settle_s=20).wait(job_id, limit_s=240)
    assert end.state == "COMPLETED", (
        end,
        (moved / "sbatch.out").read_text() if (moved / "sbatch.out").exists() else "",
    )
    log = (moved / "log.txt").read_text()
    assert log.count("train_step_timing in s") == 3, log[-2000:]
    assert query_state(job_id).state == "COMPLETED"


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_sbatch_options_reach_slurm_as_the_job_s_settings(tmp_path):
    """nemo-run quotes values (``--nodelist='node[1]'``); sbatch reads its #SBATCH lines with the quotes removed."""
    from dse.backends.slurm import cancel, write_sbatch

    options = {"nodelist": "node[1]", "comment": "dse-options", "nice": 7}
    sys_ = system(DATA / "systems" / "local_slurm.toml", slurm={"sbatch_options": options})
    t = trial("llama3_70b_16l", sys=sys_, num_nodes=1, tp=1, pp=1, cp=1, vp=1, gbs=4, max_steps=3)
    script = write_sbatch(build_plan(t, payload="nemo2"), tmp_path)
    assert "#SBATCH --nodelist='node[1]'" in script.read_text()
    r = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    try:
        show = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    finally:
        cancel(job_id)
    fields = dict(p.split("=", 1) for p in show.split() if "=" in p)
    assert (fields["ReqNodeList"], fields["Comment"], fields["Nice"]) == ("node1", "dse-options", "7"), show


# -- the docs list what the code allows --------------------------------------------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"


def _doc_names(section: str) -> set[str]:
    text = (DOCS / "security.md").read_text()
    body = text.split(f"<!-- {section} -->")[1].split("<!-- end -->")[0]
    return set(re.findall(r"^\| `([^`]+)` \|", body, re.M))


def test_security_doc_lists_the_code_s_allowlists():
    assert _doc_names("env-prefixes") == {p + "*" for p in allowlists.ENV_PREFIXES}
    assert _doc_names("env-names") == set(allowlists.ENV_NAMES)
    assert _doc_names("env-never") == {p + "*" for p in allowlists.ENV_NEVER}
    assert _doc_names("srun-allowed") == {"--" + n for n in allowlists.SRUN_ALLOWED}
    assert _doc_names("sbatch-allowed") == set(allowlists.SBATCH_ALLOWED)
    suffixes = (DOCS / "security.md").read_text().split("a name that ends in")[1].split("names a file")[0]
    assert set(re.findall(r"`([A-Z_]+)`", suffixes)) == set(allowlists.ENV_FILE_SUFFIXES)


def test_the_slurm_page_s_system_file_is_valid_and_asks_for_its_options(tmp_path):
    from dse.rules.space import load_system

    text = (DOCS / "slurm.md").read_text()
    example = text.split("```toml\n")[1].split("```")[0]
    f = tmp_path / "gb200-cluster.toml"
    f.write_text(example)
    sys_ = load_system(str(f))
    assert sys_.slurm.sbatch_options == {"qos": "high", "reservation": "perf-week", "constraint": "gb200&nvl72"}
    plan = build_plan(trial("llama3_70b", sys=sys_, num_nodes=32))
    script = render_sbatch(plan, Path("/tmp/dse-allow/run"))
    for line in ("#SBATCH --qos=high", "#SBATCH --segment=16", "#SBATCH --constraint='gb200&nvl72'"):
        assert line in script.splitlines()
    assert "--container-image /lustre/images/nemo-25.09.sqsh " in script and "--cpu-bind=none " in script
