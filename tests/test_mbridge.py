"""The Megatron-Bridge entry point's argument parsing (plain Python; Bridge itself is not installed here)."""

from __future__ import annotations

import pytest

from dse.facts import knobs
from dse.recipes.mbridge.argv import parse, recipe_module
from dse.recipes.models import RECIPES


def test_payload_args_round_trip_through_the_entry_parser():
    values = {
        "tp": 4,
        "pp": 2,
        "vp": 1,
        "cp": 1,
        "sp": None,
        "mbs": 1,
        "gbs": 64,
        "seq_length": 8192,
        "recompute": "selective",
        "recompute_num_layers": 0,
        "precision": "fp8",
        "fp8_recipe": "delayed",
        "fsdp": False,
        "tp_comm_overlap": True,
        "max_steps": 20,
    }
    argv = knobs.payload_args("mbridge", RECIPES["llama3_70b_16l"], values, gpu="h100", gpus_per_node=8)
    args = parse(argv)
    assert args.recipe == "llama3_70b_pretrain_config"
    assert args.tp_comm_overlap_cfg == "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"
    assert args.mixed_precision == "bf16_with_fp8_delayed_scaling_mixed"
    assert "mixed_precision=bf16_with_fp8_delayed_scaling_mixed" not in args.overrides
    assert args.overrides[0] == "model.tensor_model_parallel_size=4"
    assert args.overrides[-1] == "model.num_layers=16"
    assert args.needs_comm_overlap


def test_recipe_from_env_and_plain_overrides():
    args = parse(["train.global_batch_size=32", "+model.extra=1"], {"DSE_MBRIDGE_RECIPE": "llama3_8b_pretrain_config"})
    assert args.recipe == "llama3_8b_pretrain_config"
    assert args.overrides == ("train.global_batch_size=32", "+model.extra=1")
    assert args.mixed_precision is None and args.tp_comm_overlap_cfg is None and not args.needs_comm_overlap


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train.global_batch_size=32"], "no recipe"),
        (["--recipe", "os.system"], "not a Python identifier"),
        (["--recipe", "llama3_8b_pretrain_config", "trainiters"], "not an override"),
        (["--recipe", "llama3_8b_pretrain_config", "mixed_precision=bf16;rm"], "not a Python identifier"),
        (["--recipe", "llama3_8b_pretrain_config", "--tp-comm-overlap-cfg", "a.b"], "not a Python identifier"),
    ],
)
def test_bad_arguments_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(argv, {})


@pytest.mark.parametrize(
    ("recipe", "module"),
    [
        ("llama3_70b_pretrain_config", "megatron.bridge.recipes.llama"),
        ("deepseek_v3_pretrain_config", "megatron.bridge.recipes.deepseek"),
        ("qwen3_30b_a3b_pretrain_config", "megatron.bridge.recipes.qwen"),
        ("qwen3_235b_a22b_pretrain_config", "megatron.bridge.recipes.qwen"),
        ("gpt_oss_120b_pretrain_config", "megatron.bridge.recipes.gpt_oss"),
    ],
)
def test_each_recipe_is_looked_up_in_its_family_module(recipe, module):
    assert parse(["--recipe", recipe]).recipe_module == module


def test_a_recipe_of_an_unknown_family_is_refused():
    with pytest.raises(ValueError, match="no Megatron-Bridge family"):
        recipe_module("mixtral_8x7b_pretrain_config")


def test_the_recipe_layout_is_cleared_only_when_the_command_line_sets_the_split_or_a_layout():
    split = ["--recipe", "deepseek_v3_pretrain_config", "model.pipeline_model_parallel_size=8"]
    assert parse(split).clears_layout
    assert parse([*split[:2], "model.num_layers_in_first_pipeline_stage=7"]).clears_layout
    assert parse([*split[:2], "model.pipeline_model_parallel_layout=Et|tt|L"]).clears_layout
    assert not parse([*split[:2], "train.global_batch_size=32"]).clears_layout
