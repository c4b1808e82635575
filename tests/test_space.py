"""Space and system files: schema, defaults, and one-line errors that name the file and the field."""

from __future__ import annotations

import pytest

from dse.errors import UserError
from dse.facts import knobs
from dse.rules.space import load_space, load_system
from tests.helpers import SMALL_SPACE, write_space


def test_small_space_loads_with_defaults(tmp_path):
    s = load_space(write_space(tmp_path))
    assert s.recipe == "llama3_70b_16l" and s.system.gpu == "h100" and s.system.gpus_per_node == 8
    assert s.size == 4 * 3 * 2 * 2
    assert s.objective.sense == "maximize" and s.objective.failed_reward == 0.0
    assert s.backend.kind == "sim"
    assert len(list(s.points())) == s.size


def test_minimize_step_time_defaults_to_a_failure_reward_below_any_success(tmp_path):
    s = load_space(write_space(tmp_path, SMALL_SPACE.replace('metric = "tflops_per_gpu"', 'metric = "step_time_s"')))
    assert s.objective.sense == "minimize" and s.objective.failed_reward < -1000


def test_inline_system_table(tmp_path):
    text = SMALL_SPACE.replace('system = "h100"', 'system = {gpu = "gb200", gpus_per_node = 4, nvlink_domain = 72}')
    s = load_space(write_space(tmp_path, text))
    assert s.system.gpu == "gb200" and s.system.nvlink_domain == 72


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200", "b200", "b300", "gb200", "gb300"])
def test_shipped_systems_load(gpu):
    sysm = load_system(gpu)
    assert sysm.gpu == gpu and sysm.scaleout_gbps > 0


@pytest.mark.parametrize(
    "edit, field, words",
    [
        (("tp = [1, 2, 4, 8]", "tq = [1, 2]"), "knobs.tq", "did you mean 'tp'"),
        (("tp = [1, 2, 4, 8]", 'tp = [1, "two"]'), "knobs.tp", "not an integer"),
        (("tp = [1, 2, 4, 8]", "tp = [0, 2]"), "knobs.tp", ">= 1"),
        (("tp = [1, 2, 4, 8]", "tp = [-2]"), "knobs.tp", ">= 1"),
        (("tp = [1, 2, 4, 8]", "tp = []"), "knobs.tp", "empty"),
        (("tp = [1, 2, 4, 8]", "tp = [2, 2]"), "knobs.tp", "duplicate"),
        (("tp = [1, 2, 4, 8]", 'recompute = ["some"]'), "knobs.recompute", "none, selective, full"),
        (("gbs = 32", "gbs = 32.5"), "settings.gbs", "not an integer"),
        (('recipe = "llama3_70b_16l"', 'recipe = "llama3_70"'), "recipe", "unknown recipe"),
        (('system = "h100"', 'system = "h1000"'), "system", "unknown system"),
        (("num_nodes = 2", "num_nodes = 0"), "num_nodes", "greater than or equal to 1"),
        (('name = "small"', 'nam = "small"'), "nam", "unknown field"),
        (('name = "small"', ""), "name", "missing"),
        (('metric = "tflops_per_gpu"', 'metric = "mfu"'), "objective.metric", "tflops_per_gpu"),
        (("tp = [1, 2, 4, 8]", '"env.NCCL_DEBUG" = ["$(reboot)"]'), "knobs.env.NCCL_DEBUG", "not allowed"),
        (("tp = [1, 2, 4, 8]", '"env.bad-name" = ["1"]'), "knobs.env.bad-name", "environment variable"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_field(tmp_path, edit, field, words):
    path = write_space(tmp_path, SMALL_SPACE.replace(*edit))
    with pytest.raises(UserError) as e:
        load_space(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(str(path)), msg
    assert e.value.field == field, msg
    assert words in msg, msg


def test_malformed_toml_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("name = [unclosed\n")
    with pytest.raises(UserError, match="malformed TOML") as e:
        load_space(p)
    assert str(p) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_space(tmp_path / "nope.toml")


def test_knob_catalogue_has_the_required_knobs():
    required = (
        "tp pp vp cp ep sp mbs gbs seq_length recompute recompute_num_layers precision fp8_recipe fsdp "
        "tp_comm_overlap num_nodes"
    ).split()
    assert set(required) <= set(knobs.CATALOGUE)
    assert knobs.get("env.NCCL_DEBUG").kind == "str"
    with pytest.raises(UserError, match="did you mean 'mbs'"):
        knobs.get("mbz")


def test_every_shipped_space_validates_and_has_valid_points():
    from pathlib import Path

    from dse.rules import constraints
    from dse.rules.trial import resolve

    files = sorted(Path("conf/spaces").glob("*.toml"))
    names = {f.stem for f in files}
    for recipe in ("llama3_8b", "llama3_70b", "llama3_405b", "nemotron3_8b", "nemotron4_15b", "nemotron4_340b"):
        assert f"{recipe}_space" in names
    for r in ("llama3_70b", "llama3_405b", "nemotron4_340b"):
        assert any(n.startswith(r) and "_2node" in n for n in names)
    for f in files:
        s = load_space(f)
        assert any(constraints.check(resolve(s, p)) is None for p in s.points()), f


def test_main_space_has_at_least_1000_valid_points():
    from dse.rules import constraints
    from dse.rules.trial import resolve

    s = load_space("conf/spaces/llama3_405b_space.toml")
    assert s.system.gpu == "h100" and s.num_nodes == 128 and s.settings["seq_length"] == 8192
    assert {"tp", "pp", "vp", "cp", "mbs", "recompute", "precision"} <= set(s.knobs)
    valid = sum(constraints.check(resolve(s, p)) is None for p in s.points())
    assert valid >= 1000
