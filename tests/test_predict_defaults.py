"""``dse predict``: a 0 where a count is needed is an error, and layout values the user did not pass but the
recipe chose are named as such, in the output and in the error they cause."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dse.cli import app


def predict(*args: str):
    return CliRunner().invoke(app, ["predict", "--model", "llama3_405b", "--gpu", "h100", *args])


@pytest.mark.parametrize("flag", ["--tp", "--pp", "--cp", "--vp", "--mbs", "--gbs", "--seq-length", "--num-gpus"])
def test_zero_is_an_error_not_the_recipe_default(flag):
    r = predict("--num-gpus", "1024", flag, "0") if flag != "--num-gpus" else predict(flag, "0")
    assert r.exit_code == 2
    assert f"{flag}: 0 is out of range" in r.output


def test_an_error_caused_by_a_recipe_default_names_it_and_the_flag():
    r = predict("--num-gpus", "1024", "--pp", "1")  # the recipe's vp = 8 does not divide 126 layers at pp 1
    assert r.exit_code == 2
    assert "vp = 8 (the recipe's default; pass --vp)" in r.output
    assert "pass --pp" not in r.output  # pp was passed


def test_output_names_the_values_taken_from_the_recipe():
    r = predict("--num-gpus", "1024", "--tp", "8", "--vp", "4")
    assert r.exit_code == 0, r.output
    line = [ln for ln in r.output.splitlines() if ln.startswith("not passed")][0]
    assert "pp = 8" in line and "vp" not in line and "tp" not in line
    j = json.loads(predict("--num-gpus", "1024", "--tp", "8", "--vp", "4", "--json").stdout)
    assert "pp" in j["recipe_defaults"] and "vp" not in j["recipe_defaults"] and "tp" not in j["recipe_defaults"]
