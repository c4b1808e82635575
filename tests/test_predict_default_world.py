"""``dse predict`` without --num-gpus runs a recipe's default layout on the world size of the NVIDIA preset it
comes from, where its gbs is the preset's; with a --num-gpus at which that gbs breaks a batch rule, the gbs scales
with the world (the same batch per GPU, as NVIDIA's presets scale), and says so; every shipped recipe on every GPU
at its defaults either predicts or is refused for a reason that is not its batch or its world size."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.facts.hardware import GPU_NAMES
from dse.recipes.models import RECIPES


def predict(*args: str):
    return CliRunner().invoke(app, ["predict", *args, "--json"])


def test_405b_on_b300_at_its_defaults_runs_bridges_128_gpu_recipe():
    r = predict("--model", "llama3_405b", "--gpu", "b300", "--precision", "bf16")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert (j["num_gpus"], j["tp"], j["dp"], j["gbs"], j["fsdp"]) == (128, 2, 64, 768, True)
    assert j["recipe_defaults_dropped"] == []


@pytest.mark.parametrize(
    "gpu, precision, num_gpus, gbs, rule",
    [
        # tp 2 with FSDP: 512 data-parallel ranks at 1,024 GPUs, 768 is not a multiple; 6144 is 12 per rank again
        ("b300", "bf16", "1024", 6144, "gbs_divisible"),
        # Bridge's 128-GPU B200 preset (gbs 64) at 1,024 GPUs: 4 micro-batches for 8 interleaved stages; 512 gives 32
        ("b200", "fp8", "1024", 512, "interleaved_microbatches"),
    ],
)
def test_the_recipes_gbs_scales_with_a_world_where_it_breaks_a_batch_rule(gpu, precision, num_gpus, gbs, rule):
    r = predict("--model", "llama3_405b", "--gpu", gpu, "--precision", precision, "--num-gpus", num_gpus)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["num_gpus"] == int(num_gpus) and j["gbs"] == gbs
    (note,) = j["recipe_defaults_dropped"]
    assert f"scaled to {gbs} for {num_gpus} GPUs" in note and rule in note


def test_a_gbs_that_is_valid_at_the_world_given_is_kept():
    """256 GPUs of B300 in BF16: 128 data-parallel ranks divide 768, so the recipe's gbs stays (as a space's)."""
    r = predict("--model", "llama3_405b", "--gpu", "b300", "--precision", "bf16", "--num-gpus", "256")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["gbs"] == 768 and j["recipe_defaults_dropped"] == []


def test_a_gbs_the_user_passes_is_never_scaled():
    r = predict("--model", "llama3_405b", "--gpu", "b300", "--precision", "bf16", "--num-gpus", "1024", "--gbs", "768")
    assert r.exit_code == 2
    assert "gbs_divisible" in r.output and "e.g. --gbs 1024" in r.output


def test_a_one_gpu_recipe_predicts_on_one_gpu_of_a_node():
    r = predict("--model", "llama3_8b_4l", "--gpu", "h100")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["num_gpus"] == 1


# what may still refuse a recipe's defaults: FP8 on A100; the flex dispatcher of the Bridge presets with the
# default nemo2 payload on GB200 / GB300 (DeepEP does not run there). The 2-node reproducers of the dense models
# run their full model's presets fitted to their 16 GPUs and layers (recipes.models.fit_layout).
LEGITIMATE = {"fp8_needs_hopper", "moe_dispatcher_supported"}


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_every_recipe_on_every_gpu_at_its_defaults_predicts_or_says_why_not(model):
    runner = CliRunner()
    for gpu in GPU_NAMES:
        for precision in ("bf16", "fp8"):
            r = runner.invoke(app, ["predict", "--model", model, "--gpu", gpu, "--precision", precision, "--json"])
            if r.exit_code == 0:
                continue
            assert r.exit_code == 2, (gpu, precision, r.output)
            assert any(f"invalid layout ({rule})" in r.output for rule in LEGITIMATE), (gpu, precision, r.output)


def test_gpus_per_node_given_is_kept_for_a_one_gpu_recipe():
    r = predict("--model", "llama3_8b_4l", "--gpu", "h100", "--gpus-per-node", "8")
    assert r.exit_code == 2 and "1 is not a multiple of the 8 GPUs per node" in r.output


@pytest.mark.parametrize("model, gpu", [("deepseek_v3", "gb200"), ("qwen3_30b_a3b", "gb300")])
def test_a_recipes_flex_dispatcher_the_nemo2_payload_cannot_run_becomes_alltoall_and_says_so(model, gpu):
    r = predict("--model", model, "--gpu", gpu)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["moe_dispatcher"] == "alltoall"
    assert any("moe_dispatcher=flex" in line and "alltoall" in line for line in j["recipe_defaults_dropped"])
    # the Bridge payload runs the recipe's flex (HybridEP) there: nothing replaced
    r = predict("--model", model, "--gpu", gpu, "--payload", "mbridge")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["moe_dispatcher"] == "flex"


def test_a_flex_dispatcher_the_user_asked_for_is_still_refused_where_the_payload_cannot_run_it():
    r = CliRunner().invoke(app, ["predict", "--model", "deepseek_v3", "--gpu", "gb200", "--moe-dispatcher", "flex"])
    assert r.exit_code == 2
    assert "moe_dispatcher_supported" in r.output and "Traceback" not in r.output
