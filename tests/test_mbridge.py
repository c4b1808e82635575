"""The Megatron-Bridge entry point's argument parsing (plain Python; Bridge itself is not installed here)."""

from __future__ import annotations

import pytest

from dse import knobs
from dse.recipes.mbridge.argv import parse
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
