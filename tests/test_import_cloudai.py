"""`dse import cloudai`: CloudAI NeMoRun tests, scenarios and Slurm systems as dse spaces."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.errors import UserError
from dse.facts import knobs
from dse.importers.cloudai import import_cloudai, nemo2_paths
from dse.rules.space import load_space
from dse.study.loop import Request, run_study

runner = CliRunner()
FIX = Path(__file__).parent / "fixtures" / "cloudai"
SYSTEM = FIX / "system" / "slurm_cluster.toml"
TEST = FIX / "test" / "llama3_8b_dse.toml"
SCENARIO = FIX / "test_scenario" / "dse_llama3_8b_fp8.toml"
BY_NAME = FIX / "test_scenario" / "llama3_8b_by_name.toml"


def _list_product(table) -> int:
    """CloudAI's raw point count: the product of the lengths of every list-valued field of a test."""
    if isinstance(table, dict):
        return math.prod(_list_product(v) for v in table.values())
    return len(table) if isinstance(table, list) else 1


def _cloudai_test(path: Path) -> dict:
    data = tomllib.loads(path.read_text())
    test = data["Tests"][0] if "Tests" in data else data
    return {
        "cmd_args": test.get("cmd_args") or tomllib.loads(TEST.read_text())["cmd_args"],
        "extra_env_vars": test.get("extra_env_vars") or tomllib.loads(TEST.read_text())["extra_env_vars"],
    }


@pytest.mark.parametrize("src, extra", [(TEST, []), (SCENARIO, []), (BY_NAME, ["--test", "llama3_8b.2nodes"])])
def test_imports_validates_counts_and_runs_on_sim(tmp_path, src, extra):
    out = tmp_path / "space.toml"
    r = runner.invoke(
        app, ["import", "cloudai", str(src), "--system", str(SYSTEM), "--gpu", "h100", "--out", str(out), *extra]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "lab-cluster.toml").is_file()
    r = runner.invoke(app, ["validate", str(out)])
    assert r.exit_code == 0, r.output
    space = load_space(out)
    assert space.size == _list_product(_cloudai_test(src))
    result = run_study(space, Request(out_dir=tmp_path / "run", agent="grid", backend="sim", seed=0))
    # the grid visits every raw point once (invalid ones are recorded as rejected), and some train
    assert sorted(tuple(sorted(r.knobs.items())) for r in result.records) == sorted(
        tuple(sorted(p.items())) for p in space.points()
    )
    assert any(rec.ok for rec in result.records)


def test_test_file_mapping_and_not_imported_are_listed(tmp_path):
    out = tmp_path / "space.toml"
    r = runner.invoke(
        app, ["import", "cloudai", str(TEST), "--system", str(SYSTEM), "--gpu", "h100", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    space = load_space(out)
    assert space.recipe == "llama3_8b" and space.num_nodes == 1
    assert space.knobs == {
        "mbs": [1, 2],
        "gbs": [128, 256],
        "tp": [1, 2, 4],
        "pp": [1, 2],
        "env.NCCL_NVLS_ENABLE": ["0", "1"],
    }
    assert space.settings["seq_length"] == 8192 and space.settings["max_steps"] == 20 and space.settings["cp"] == 1
    # the test's variable wins over the system's, which is reported
    assert space.settings["env.CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert space.settings["env.NCCL_IB_TIMEOUT"] == "20"
    assert space.system.gpu == "h100" and space.system.container == "25.09"
    assert space.system.slurm.partition == "batch" and space.system.slurm.account == "research"
    assert space.system.slurm.srun_args == ["--mpi=pmix"]
    assert space.system.slurm.container_image == "nvcr.io#nvidia/nemo:25.09"
    text = out.read_text()
    for field in (
        "cmd_args.log.ckpt.save_last = false",
        "cmd_args.trainer.val_check_interval = 20",
        "cmd_args.data.num_train_samples = 100000",
        "system.partitions",
        "system.install_path",
        'system.global_env_vars.CUDA_DEVICE_MAX_CONNECTIONS = "32"',
    ):
        assert f"# not imported: {field}" in text
        assert f"not imported: {field}" in r.output


def test_scenario_precision_nodes_time_limit_and_agent(tmp_path):
    imp = import_cloudai(SCENARIO, gpu="h200", out=tmp_path / "s.toml")
    s = imp.space
    assert s.num_nodes == 2 and s.system.gpu == "h200" and s.system.container == "25.11"
    assert s.system.slurm.time_limit == "01:00:00"
    assert s.settings["precision"] == "fp8" and s.settings["fp8_recipe"] == "delayed"
    assert s.knobs == {"mbs": [1, 2], "tp": [2, 4], "cp": [1, 2]}
    assert s.search.agent == "grid" and s.search.trials == 12
    fields = {n.field for n in imp.not_imported}
    # the delayed recipe's own fields (margin, history, algorithm) are carried by dse's spelling of it
    assert "Tests.cmd_args.trainer.plugins.fp8_margin" not in fields
    assert {
        "Tests.cmd_args.trainer.plugins.fp8_params",
        "Tests.cmd_args.trainer.plugins.grad_reduce_in_fp32",
        "Tests.cmd_args.trainer.val_check_interval",
    } <= fields
    # written text is the same space
    path = tmp_path / "s.toml"
    path.write_text(imp.space_text)
    assert load_space(path).knobs == s.knobs


def _nest(overrides: list[str]) -> dict:
    """`a.b.c=v` overrides as nested CloudAI cmd_args tables (values as TOML would type them)."""
    out: dict = {}
    for item in overrides:
        path, value = item.split("=", 1)
        v = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
        *parents, leaf = path.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def _toml(table: dict, prefix: str = "") -> str:
    scalars = "".join(f"{k} = {_val(v)}\n" for k, v in table.items() if not isinstance(v, dict))
    subs = "".join(f"\n[{prefix}{k}]\n" + _toml(v, f"{prefix}{k}.") for k, v in table.items() if isinstance(v, dict))
    return scalars + subs


def _val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    return str(v) if isinstance(v, int) else f'"{v}"'


@pytest.mark.parametrize("fp8_recipe", ["delayed", "tensorwise", "blockwise"])
def test_catalogue_spelling_round_trips(tmp_path, fp8_recipe):
    """A test written in the catalogue's own NeMo 2 spelling imports back to the same knob values, silently."""
    values = {
        "tp": 2,
        "pp": 2,
        "cp": 2,
        "ep": 1,
        "mbs": 2,
        "gbs": 256,
        "seq_length": 4096,
        "max_steps": 20,
        "precision": "fp8",
        "fp8_recipe": fp8_recipe,
    }
    cmd = {
        "docker_image_url": "nvcr.io#nvidia/nemo:25.09",
        "task": "pretrain",
        "recipe_name": "llama3_70b",
        **_nest(knobs.overrides(values, "nemo2")),
    }
    cmd["trainer"]["strategy"]["pipeline_model_parallel_size"] = [1, 2]  # one list: a [knobs] entry
    path = tmp_path / "t.toml"
    path.write_text('name = "rt"\ntest_template_name = "NeMoRun"\n' + _toml({"cmd_args": cmd}))
    imp = import_cloudai(path, gpu="h100", out=tmp_path / "s.toml")
    assert imp.not_imported == []
    expect = {k: v for k, v in values.items() if k != "pp"}
    assert imp.space.settings == expect and imp.space.knobs == {"pp": [1, 2]}
    assert imp.space.recipe == "llama3_70b"


def test_list_that_cannot_be_imported_is_reported_and_counted(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text(TEST.read_text() + "\n[cmd_args.optim.config]\nuse_precision_aware_optimizer = [true, false]\n")
    imp = import_cloudai(p, gpu="h100")
    assert imp.cloudai_points == 2 * imp.space.size
    assert any(
        n.field == "cmd_args.optim.config.use_precision_aware_optimizer" and n.value == [True, False]
        for n in imp.not_imported
    )


def test_cloudai_defaults_fill_what_the_file_leaves_out(tmp_path):
    """CloudAI passes its models' defaults to NeMo (context_parallel_size = 2): the import does the same, and says so."""
    p = tmp_path / "t.toml"
    p.write_text(TEST.read_text().replace("    context_parallel_size = 1\n", ""))
    out = tmp_path / "s.toml"
    r = runner.invoke(app, ["import", "cloudai", str(p), "--gpu", "h100", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert load_space(out).settings["cp"] == 2
    assert "cmd_args.trainer.strategy.context_parallel_size = 2" in r.output
    assert (
        "# CloudAI's NeMoRun default (the file leaves it out): cmd_args.trainer.strategy.context_parallel_size = 2"
        in out.read_text()
    )
    assert import_cloudai(TEST, gpu="h100").defaults == []


def test_reverse_table_is_the_catalogue():
    table = nemo2_paths()
    assert table["trainer.strategy.tensor_model_parallel_size"] == "tp"
    assert table["data.seq_length"] == table["model.config.seq_length"] == "seq_length"
    for path, name in table.items():
        assert path in knobs.CATALOGUE[name].nemo2


def test_scaled_variant_and_refusal_naming_both(tmp_path):
    text = TEST.read_text().replace(
        'recipe_name = "cloudai_llama3_8b_recipe"', 'recipe_name = "cloudai_llama3_8b_recipe"\nnum_layers = 4'
    )
    p = tmp_path / "t.toml"
    p.write_text(text)
    assert import_cloudai(p, gpu="h100").space.recipe == "llama3_8b_4l"
    p.write_text(text.replace("num_layers = 4", "num_layers = 7"))
    with pytest.raises(UserError, match=r"num_layers = 7 differs from llama3_8b's 32.*llama3_8b_4l"):
        import_cloudai(p, gpu="h100")


def test_on_the_fly_import_runs(tmp_path):
    r = runner.invoke(app, ["run", "--space", f"cloudai:{SCENARIO}", "--gpu", "h100", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "not imported: Tests.cmd_args.trainer.plugins.fp8_params" in r.output
    assert (tmp_path / "o" / "leaderboard.csv").is_file()


BAD = [
    ([str(TEST), "--gpu", "h900"], "unknown GPU generation 'h900'"),
    ([str(TEST)], "give --gpu, one of"),
    ([str(BY_NAME), "--gpu", "h100"], "2 tests (llama3_8b.1node, llama3_8b.2nodes)"),
    ([str(BY_NAME), "--gpu", "h100", "--test", "nope"], "no test 'nope'"),
    ([str(TEST), "--gpu", "h100", "--system", str(FIX / "missing.toml")], "no such file"),
]


@pytest.mark.parametrize("args, msg", BAD)
def test_bad_arguments_one_line_exit_2_nothing_written(tmp_path, args, msg):
    out = tmp_path / "o" / "space.toml"
    r = runner.invoke(app, ["import", "cloudai", *args, "--out", str(out)])
    assert r.exit_code == 2 and msg in r.output and r.output.strip().count("\n") == 0, r.output
    assert not (tmp_path / "o").exists()


EDITS = [
    (('test_template_name = "NeMoRun"', 'test_template_name = "NcclTest"'), "dse imports NeMoRun tests"),
    (('task = "pretrain"', 'task = "finetune"'), "task 'finetune' is not supported"),
    (('recipe_name = "cloudai_llama3_8b_recipe"', 'recipe_name = "cloudai_gpt5_recipe"'), "no dse recipe for"),
    (("NVTE_FUSED_ATTN", "nvte_fused_attn"), "is not an environment variable name"),
    (('NVTE_FUSED_ATTN = "1"', 'NVTE_FUSED_ATTN = "$(reboot)"'), "takes letters, digits"),
    (("tensor_model_parallel_size = [1, 2, 4]", "tensor_model_parallel_size = [1, 0]"), "must be >= 1"),
    (("num_nodes = 1", "num_nodes = [1, 2]"), "a dse space has one node count"),
    (("[cmd_args]", "[cmd_args"), "malformed TOML"),
    (("num_nodes = 1", 'num_nodes = "' + "9" * 5000 + '"'), "num_nodes"),
    (("num_nodes = 1", 'num_nodes = 1\nplugins = {fp8 = "hybrid", fp8_recipe = [1]}'), "not an FP8 recipe dse knows"),
]


@pytest.mark.parametrize("edit, msg", EDITS)
def test_bad_files_one_line_exit_2_nothing_written(tmp_path, edit, msg):
    src = tmp_path / "t.toml"
    text = TEST.read_text()
    assert edit[0] in text
    src.write_text(text.replace(edit[0], edit[1], 1))
    out = tmp_path / "o" / "space.toml"
    r = runner.invoke(app, ["import", "cloudai", str(src), "--gpu", "h100", "--out", str(out)])
    assert r.exit_code == 2 and msg in r.output and r.output.strip().count("\n") == 0, r.output
    assert str(src) in r.output
    assert not (tmp_path / "o").exists()


def test_a_trainer_that_is_no_table_is_a_note_not_a_traceback(tmp_path):
    text = TEST.read_text()
    head, _, rest = text.partition("  [cmd_args.trainer]")
    _, _, tail = rest.partition("  [cmd_args.log.ckpt]")
    src = tmp_path / "t.toml"
    src.write_text(head.replace("[cmd_args]", "[cmd_args]\ntrainer = 5") + "  [cmd_args.log.ckpt]" + tail)
    imp = import_cloudai(src, gpu="h100")
    assert "cmd_args.trainer" in {n.field for n in imp.not_imported}


def test_non_slurm_system_refused(tmp_path):
    sysf = tmp_path / "k8s.toml"
    sysf.write_text('name = "k8s"\nscheduler = "kubernetes"\n')
    with pytest.raises(UserError, match="dse imports Slurm systems"):
        import_cloudai(TEST, system_path=sysf, gpu="h100")


HOSTILE = 'x"\n[knobs]\ntp = [8]\n# \\ \r\x1b end'  # quotes, newlines, TOML syntax, a CR and an escape


def test_hostile_strings_round_trip_and_inject_no_key(tmp_path):
    """A newline or quote in a CloudAI description, value or key (which the import writes as comments: the
    values it writes as TOML values are validated first) stays inside its comment: the written space reloads
    with the imported values and no other key; a note's value reads back as the value (tomlkit spells it)."""
    import json

    from dse.importers.cloudai import _toml_value

    text = TEST.read_text().replace('description = "Llama 3 8B layout sweep"', f"description = {json.dumps(HOSTILE)}")
    text += (
        f"\n[cmd_args.log]\n{json.dumps(HOSTILE)} = {json.dumps(HOSTILE)}\n"
        f'\n[cmd_args.optim]\nname = [{json.dumps(HOSTILE)}, "adam"]\n'
    )
    src = tmp_path / "hostile.toml"
    src.write_text(text)
    imp = import_cloudai(src, system_path=SYSTEM, gpu="h100", out=tmp_path / "space.toml")
    notes = {n.field: n.value for n in imp.not_imported}
    assert notes[f"cmd_args.log.{HOSTILE}"] == HOSTILE and notes["cmd_args.optim.name"] == [HOSTILE, "adam"]
    assert all(len(n.line().splitlines()) == 1 for n in imp.not_imported)  # printed one line each, key escaped
    for value in (HOSTILE, [HOSTILE, "adam"], {HOSTILE: [1.5, True]}):
        assert tomllib.loads(f"v = {_toml_value(value)}")["v"] == value
    written = imp.write(tmp_path / "space.toml")
    assert written == [tmp_path / "space.toml", tmp_path / "lab-cluster.toml"]
    space_text = written[0].read_text()
    doc = tomllib.loads(space_text)
    assert set(doc) == {"name", "recipe", "system", "num_nodes", "settings", "knobs", "search", "backend"}
    assert doc["knobs"] == imp.space.knobs and set(doc["knobs"]) == {"mbs", "gbs", "tp", "pp", "env.NCCL_NVLS_ENABLE"}
    assert {k: v for k, v in doc["settings"].items()} == dict(imp.space.settings)
    assert load_space(written[0]).knobs == imp.space.knobs
    # the description's lines are comment lines; none of its TOML reaches a line of its own
    lines = space_text.splitlines()
    assert lines[1:6] == ['# x"', "# [knobs]", "# tp = [8]", "# # \\ ", "# \\x1b end"]
    assert lines.count("[knobs]") == 1 and "tp = [8]" not in lines
    assert set(tomllib.loads(written[1].read_text())) == {
        "name",
        "gpu",
        "gpus_per_node",
        "nvlink_domain",
        "container",
        "slurm",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.toml", "lab-cluster.toml", "space.toml"]


def test_a_space_that_does_not_load_leaves_the_users_files_as_they_were(tmp_path, monkeypatch):
    """The written space is loaded in a scratch directory before anything of the user's is replaced: a failure
    there leaves a pre-existing --out file and the system file beside it untouched, and no scratch behind."""
    import dse.rules.space
    from dse.errors import UserError

    out = tmp_path / "space.toml"
    r = runner.invoke(
        app, ["import", "cloudai", str(TEST), "--system", str(SYSTEM), "--gpu", "h100", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert len(before) == 2  # the space and its system file
    for p in tmp_path.iterdir():
        p.write_text(p.read_text() + "# the user's own edit\n")
    edited = {p.name: p.read_text() for p in tmp_path.iterdir()}

    def refuse(path):
        raise UserError("does not load", file=str(path))

    monkeypatch.setattr(dse.rules.space, "load_space", refuse)
    r = runner.invoke(
        app, ["import", "cloudai", str(TEST), "--system", str(SYSTEM), "--gpu", "h100", "--out", str(out), "--force"]
    )
    assert r.exit_code == 2 and "does not load" in r.output, r.output
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == edited


@pytest.mark.parametrize("existing", ["space.toml", "lab-cluster.toml"])
def test_an_existing_out_or_system_file_needs_force(tmp_path, existing):
    """An import never replaces a file that is there (the space, or the system file it writes beside it) unless
    --force; with --force both are replaced by the import's."""
    out = tmp_path / "space.toml"
    (tmp_path / existing).write_text("# the user's own file\n")
    args = ["import", "cloudai", str(TEST), "--system", str(SYSTEM), "--gpu", "h100", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already exists; pass --force" in r.output, r.output
    assert r.output.strip().count("\n") == 0 and existing in r.output
    assert [p.name for p in tmp_path.iterdir()] == [existing]
    assert (tmp_path / existing).read_text() == "# the user's own file\n"
    r = runner.invoke(app, [*args, "--force"])
    assert r.exit_code == 0, r.output
    assert load_space(out).recipe == "llama3_8b"
    assert "user's own" not in (tmp_path / existing).read_text()


def test_an_out_that_is_a_directory_is_refused_even_with_force(tmp_path):
    out = tmp_path / "space.toml"
    out.mkdir()
    r = runner.invoke(app, ["import", "cloudai", str(TEST), "--gpu", "h100", "--out", str(out), "--force"])
    assert r.exit_code == 2 and "is not a file" in r.output, r.output
    assert out.is_dir() and not any(out.iterdir())


@pytest.mark.parametrize(
    "edit, msg",
    [
        (("num_nodes = 2", "num_nodes = true"), "num_nodes"),
        (("num_nodes = 2", 'num_nodes = "x"'), "num_nodes"),
        (("agent_steps = 12", 'agent_steps = "12"'), "search.trials"),
        (('time_limit = "01:00:00"', 'time_limit = "soon; reboot"'), "time_limit"),
        (("gpus_per_node = 8", "gpus_per_node = 100000"), "gpus_per_node"),
    ],
)
def test_cloudai_values_reach_no_traceback(tmp_path, edit, msg):
    """Values of a CloudAI scenario or system that dse's models refuse are one line naming the field, exit 2."""
    src, sysf = tmp_path / "scenario.toml", tmp_path / "system.toml"
    src.write_text(SCENARIO.read_text())
    sysf.write_text(SYSTEM.read_text())
    for f in (src, sysf):
        f.write_text(f.read_text().replace(*edit))
    assert edit[1] in src.read_text() + sysf.read_text()
    out = tmp_path / "o" / "space.toml"
    r = runner.invoke(app, ["import", "cloudai", str(src), "--system", str(sysf), "--gpu", "h100", "--out", str(out)])
    assert r.exit_code == 2 and msg in r.output and r.output.strip().count("\n") == 0, r.output
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()


# CloudAI's own files, unchanged (tests/fixtures/cloudai/upstream/: each names its repository path and commit)
UPSTREAM = FIX / "upstream"
CLOUDAI_SYSTEM = UPSTREAM / "system" / "example_slurm_cluster.toml"
CLOUDAI_TESTS = sorted((UPSTREAM / "test").glob("*.toml"))


@pytest.mark.parametrize("src", CLOUDAI_TESTS, ids=lambda p: p.stem)
def test_cloudais_own_example_system_and_tests_import_and_run(tmp_path, src):
    """CloudAI's example Slurm system sets MELLANOX_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, names outside the
    tuning families: the space lists each in an explicit [backend] allow_env, commented with the file it came
    from, and dse itself accepts the space it wrote and runs it."""
    out = tmp_path / "space.toml"
    r = runner.invoke(
        app, ["import", "cloudai", str(src), "--system", str(CLOUDAI_SYSTEM), "--gpu", "h100", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["validate", str(out)])
    assert r.exit_code == 0, r.output
    space = load_space(out)
    assert space.backend.allow_env == ["MELLANOX_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
    assert space.settings["env.MELLANOX_VISIBLE_DEVICES"] == "0,3,4,5,6,9,10,11"
    assert space.settings["env.NCCL_IB_GID_INDEX"] == "3"  # a tuning family: no opt-in needed
    lines = out.read_text().splitlines()
    for name in space.backend.allow_env:
        line = next(x for x in lines if x.strip().startswith(f'"{name}"'))
        assert "example_slurm_cluster.toml" in line and "global_env_vars" in line, line
    result = run_study(space, Request(out_dir=tmp_path / "run", agent="grid", backend="sim", seed=0))
    assert any(rec.ok for rec in result.records)


def test_names_that_choose_code_or_control_dse_are_left_out_with_a_note(tmp_path):
    """Names no space may set (LD_*, PYTHON*, SLURM_*), names of a file or library to load (NCCL_NET_PLUGIN) and
    dse's own control variables (DSE_*) are not imported: each is a note, and the space still validates."""
    sysf = tmp_path / "cluster.toml"
    sysf.write_text(
        CLOUDAI_SYSTEM.read_text()
        + 'LD_PRELOAD = "/x.so"\nPYTHONPATH = "/p"\nNCCL_NET_PLUGIN = "/lib.so"\nDSE_PAYLOAD = "x"\nMY_TUNING = "1"\n'
    )
    out = tmp_path / "space.toml"
    r = runner.invoke(app, ["import", "cloudai", str(TEST), "--system", str(sysf), "--gpu", "h100", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0
    space = load_space(out)
    assert space.backend.allow_env == ["MELLANOX_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "MY_TUNING"]
    text = out.read_text()
    for name in ("LD_PRELOAD", "PYTHONPATH", "NCCL_NET_PLUGIN", "DSE_PAYLOAD"):
        assert f"env.{name}" not in space.settings
        assert f"# not imported: system.global_env_vars.{name}" in text, name
        assert f"not imported: system.global_env_vars.{name}" in r.output
