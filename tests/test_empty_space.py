"""A space with no valid point is an error, not an empty success: ``dse validate`` and ``dse run`` exit 2 naming the
rules that removed every point and the knobs the space leaves to the recipe's layout (or sets once) that did it."""

from __future__ import annotations

from tests.helpers import dse, one_line_error, write_space

# every point breaks gbs_divisible: the setting gbs = 1 cannot split into micro-batches of 2 or 4
BY_SETTING = """
name = "empty_by_setting"
recipe = "llama3_8b"
system = "h100"
num_nodes = 1

[settings]
gbs = 1

[knobs]
mbs = [2, 4]
tp = [1, 2]

[search]
agent = "grid"
"""

# Llama 3 70B's B300 layout is Megatron FSDP (NVIDIA's preset): every pp > 1 breaks fsdp_no_pp, and the space
# neither varies nor sets fsdp
BY_RECIPE_DEFAULT = """
name = "empty_by_default"
recipe = "llama3_70b"
system = "b300"
num_nodes = 8

[settings]
precision = "bf16"

[knobs]
pp = [2, 4]
tp = [1, 2]

[search]
agent = "grid"
"""


def test_validate_refuses_a_space_with_no_valid_point_naming_the_rule_and_the_setting(tmp_path):
    path = write_space(tmp_path, BY_SETTING)
    line = one_line_error(dse("validate", path), str(path), "no valid point", "gbs_divisible", "gbs=1")
    assert "[settings]" in line


def test_run_refuses_it_before_anything_is_written(tmp_path):
    path = write_space(tmp_path, BY_SETTING)
    out = tmp_path / "out"
    one_line_error(dse("run", "--space", path, "--out", out), "no valid point", "gbs_divisible")
    assert not out.exists()


def test_the_recipe_default_that_removed_every_point_is_named(tmp_path):
    path = write_space(tmp_path, BY_RECIPE_DEFAULT)
    line = one_line_error(dse("validate", path), "no valid point", "fsdp_no_pp", "fsdp=True")
    assert "b300/bf16" in line and "NVIDIA's preset" in line, line
    # varying the knob the recipe set is the way out: the space then has valid points and validates
    fixed = write_space(tmp_path, BY_RECIPE_DEFAULT.replace("[knobs]", "[knobs]\nfsdp = [false, true]"), "ok.toml")
    r = dse("validate", fixed)
    assert r.exit_code == 0, r.output


def test_a_space_with_valid_points_still_validates(tmp_path):
    r = dse("validate", write_space(tmp_path, BY_SETTING.replace("gbs = 1", "gbs = 128")))
    assert r.exit_code == 0, r.output
