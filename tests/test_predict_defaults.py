"""``dse predict``: a 0 where a count is needed is an error, layout values the user did not pass but the recipe
chose are named as such, and a recipe default that conflicts with the layout given is dropped with a line saying
so."""

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


def test_a_recipe_default_that_conflicts_with_the_given_layout_is_dropped_and_named():
    r = predict("--num-gpus", "1024", "--pp", "1")  # the recipe's vp = 8 does not divide 126 layers at pp 1
    assert r.exit_code == 0, r.output
    assert "recipe default vp=8 dropped: conflicts with pp 1 (layers_divisible)" in r.output
    assert "vp=1" in r.output  # the title's layout: vp back to the catalogue's default


def test_an_invalid_layout_of_the_users_own_is_still_refused():
    r = predict("--num-gpus", "1024", "--tp", "3")  # 128 heads do not divide by 3: nothing of the recipe's to drop
    assert r.exit_code == 2
    assert "invalid layout" in r.output and "dropped" not in r.output


def test_moe_knobs_passed_for_a_dense_model_are_named_as_ignored():
    r = predict("--num-gpus", "1024", "--moe-token-drop", "--set", "moe_dispatcher=flex")
    assert r.exit_code == 0, r.output
    assert "moe_token_drop=true, moe_dispatcher=flex: no effect on a dense model (llama3_405b), ignored" in r.output
    plain = json.loads(predict("--num-gpus", "1024", "--json").output)
    dropped = json.loads(predict("--num-gpus", "1024", "--moe-token-drop", "--json").output)
    assert plain["moe_note"] == "" and "moe_token_drop=true" in dropped["moe_note"]
    assert dropped["step_time_s"] == plain["step_time_s"]  # the dense layout it is
    moe = CliRunner().invoke(
        app, ["predict", "--model", "qwen3_30b_a3b", "--gpu", "h100", "--moe-token-drop", "--json"]
    )
    assert json.loads(moe.output)["moe_note"] == ""


def test_gb200_70b_fp8_explicit_layout_needs_no_extra_flags():
    """NVIDIA's GB200 FP8 layout for Llama 3 70B (tp 2, pp 4, vp 5): the recipe's FSDP and offloading, which
    pipeline parallelism excludes, give way to it."""
    args = ["--model", "llama3_70b", "--gpu", "gb200", "--precision", "fp8", "--tp", "2", "--pp", "4", "--vp", "5"]
    r = CliRunner().invoke(app, ["predict", *args, "--num-gpus", "64", "--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert (j["tp"], j["pp"], j["vp"], j["fsdp"], j["cpu_offload_layers"]) == (2, 4, 5, False, 0)
    assert j["recipe_defaults_dropped"] == [
        "recipe default fsdp=True dropped: conflicts with pp 4 (fsdp_no_pp)",
        "recipe default cpu_offload_layers=40 dropped: conflicts with pp 4 (cpu_offload_supported)",
    ]
    assert "fsdp" not in j["recipe_defaults"] and "mbs" in j["recipe_defaults"]


def test_nothing_is_dropped_when_the_recipe_defaults_fit_the_layout():
    r = CliRunner().invoke(app, ["predict", "--model", "llama3_70b", "--gpu", "gb200", "--precision", "fp8", "--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["recipe_defaults_dropped"] == [] and j["fsdp"] is True and j["cpu_offload_layers"] == 40


def test_output_names_the_values_taken_from_the_recipe():
    r = predict("--num-gpus", "1024", "--tp", "8", "--vp", "4")
    assert r.exit_code == 0, r.output
    line = [ln for ln in r.output.splitlines() if ln.startswith("not passed")][0]
    assert "pp = 8" in line and "vp" not in line and "tp" not in line
    j = json.loads(predict("--num-gpus", "1024", "--tp", "8", "--vp", "4", "--json").stdout)
    assert "pp" in j["recipe_defaults"] and "vp" not in j["recipe_defaults"] and "tp" not in j["recipe_defaults"]


def test_an_error_caused_by_recipe_defaults_alone_names_them_and_the_flag():
    """Bridge's B200 405B layout (tp 4, pp 8, cp 2, vp 8) on its 128 GPUs with the user's gbs of 12: six
    micro-batches cannot fill the interleaved pipeline of 8 stages. The rule names pp, which the user did not pass,
    so nothing is dropped: the error names the recipe's value, the flag to pass, and a gbs that fits (2
    data-parallel ranks x 8 micro-batches)."""
    args = ["--model", "llama3_405b", "--gpu", "b200", "--precision", "fp8", "--gbs", "12"]
    r = CliRunner().invoke(app, ["predict", *args])
    assert r.exit_code == 2
    assert "invalid layout (interleaved_microbatches)" in r.output
    assert "pp = 8 (the recipe's default; pass --pp)" in r.output and "dropped" not in r.output
    assert "a gbs that fits this layout is a multiple of 16 (e.g. --gbs 16)" in r.output


@pytest.mark.parametrize(
    "model, num_gpus, layout",
    [
        # Megatron-Bridge's B300 FP8 presets (scripts/performance/configs/llama): tp, pp, vp, mbs, gbs, fsdp
        ("llama3_8b", "8", (1, 1, 1, 4, 128, False)),
        ("llama3_70b", "64", (1, 1, 1, 1, 128, True)),
        # Bridge's 128-GPU B300 recipe: V1's (2, 8, 8, 1, 64) runs all 8 micro-batches in the warm-up (~326 GiB)
        ("llama3_405b", "128", (4, 8, 4, 1, 768, False)),
    ],
)
def test_b300_predicts_with_bridges_layout(model, num_gpus, layout):
    r = CliRunner().invoke(
        app, ["predict", "--model", model, "--gpu", "b300", "--precision", "fp8", "--num-gpus", num_gpus, "--json"]
    )
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert (j["tp"], j["pp"], j["vp"], j["mbs"], j["gbs"], j["fsdp"]) == layout
    assert j["gpu"] == "b300" and j["recipe_defaults_dropped"] == [] and j["tokens_per_s_per_gpu"] > 0
    assert j["fits"]


def test_b300_is_an_hgx_b200_with_blackwell_ultra_memory_and_fp4():
    """Same dense BF16/FP8 peaks, NVLink and node as B200; GB300's 288 GB and attention units; more FP4."""
    from dse.facts.hardware import HARDWARE

    b200, b300, gb300 = HARDWARE["b200"], HARDWARE["b300"], HARDWARE["gb300"]
    assert (b300.bf16_tflops, b300.fp8_tflops, b300.nvlink_gbps) == (b200.bf16_tflops, b200.fp8_tflops, 1800.0)
    assert (b300.gpus_per_node, b300.nvlink_domain, b300.grace_host) == (8, 8, False)
    assert b300.memory_gib == gb300.memory_gib and b300.sfu_exp_tera_per_s == gb300.sfu_exp_tera_per_s
    assert b200.peak_tflops("fp4") < b300.peak_tflops("fp4") < gb300.peak_tflops("fp4")
