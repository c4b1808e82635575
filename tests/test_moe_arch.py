"""MoE and MLA architectures, the six MoE recipes, the MoE knob entries and their spellings."""

from __future__ import annotations

import pytest

from dse.errors import UserError
from dse.facts import knobs
from dse.perfmodel.trials import load_model_file
from dse.recipes.models import RECIPES

MOE_RECIPES = ("mixtral_8x7b", "mixtral_8x22b", "deepseek_v3", "qwen3_30b_a3b", "qwen3_235b_a22b", "gpt_oss_120b")


@pytest.mark.parametrize("name", MOE_RECIPES)
def test_moe_recipes_are_moe_and_their_default_layouts_place_the_experts(name):
    r = RECIPES[name]
    assert r.arch.is_moe and r.arch.num_experts % 8 == 0 and 0 < r.arch.moe_topk <= r.arch.num_experts
    for key, lay in r.defaults.items():
        assert r.arch.num_experts % lay.ep == 0, key  # experts divide evenly over the expert-parallel ranks
        if lay.pp_first_layers or lay.pp_last_layers:  # an uneven split still places every decoder layer
            rest = r.arch.num_layers - lay.pp_first_layers - lay.pp_last_layers
            assert lay.pp > 2 and rest % (lay.pp - 2) == 0 or lay.pp == 2 and rest == 0, key


def test_deepseek_v3_is_mla_with_dense_first_layers_and_mtp():
    a = RECIPES["deepseek_v3"].arch
    assert a.is_mla and a.moe_first_dense_layers == 3 and a.moe_layers == 58 and a.mtp_layers == 1
    assert a.moe_router_score == "sigmoid" and a.moe_capacity_factor is None  # dropless
    assert not RECIPES["llama3_70b"].arch.is_moe and RECIPES["llama3_70b"].arch.moe_layers == 0


def test_head_dim_is_kv_channels_where_given():
    assert RECIPES["qwen3_30b_a3b"].arch.head_dim == 128  # 2048 / 32 heads would be 64
    assert RECIPES["llama3_8b"].arch.head_dim == 128


def test_moe_knobs_are_the_recipes_layout_and_default_dense():
    values = RECIPES["deepseek_v3"].default_values("h100", "bf16")
    assert values["ep"] == 64 and values["moe_dispatcher"] == "flex" and values["pp_first_layers"] == 7
    dense = RECIPES["llama3_8b"].default_values("h100", "bf16")
    assert dense["ep"] == 1 and dense["etp"] == 1 and dense["pp_first_layers"] == 0


def _argv(recipe: str, flavour: str, **over) -> tuple[str, ...]:
    r = RECIPES[recipe]
    values = {n: k.default for n, k in knobs.CATALOGUE.items()} | r.default_values("h100", "bf16") | over
    return knobs.payload_args(flavour, r, values, gpu="h100", gpus_per_node=8)


def test_a_dense_recipe_spells_no_moe_setting():
    for flavour in ("nemo2", "mbridge"):
        argv = " ".join(_argv("llama3_8b", flavour))
        assert "moe_" not in argv and "expert_tensor" not in argv and "pipeline_stage" not in argv
        assert "expert_model_parallel_size=1" in argv  # ep, as it always was


def test_flex_dispatcher_is_spelled_as_each_payloads_performance_scripts_do():
    nemo2 = _argv("deepseek_v3", "nemo2")
    assert "model.config.moe_token_dispatcher_type=flex" in nemo2 and "model.config.moe_enable_deepep=true" in nemo2
    # pp 8 with vp 4: the uneven split is NVIDIA's layout (dse.facts.knobs.pipeline_layout)
    assert "trainer.strategy.pipeline_model_parallel_layout=Et|" + "tt|" * 30 + "mL" in nemo2
    bridge = _argv("deepseek_v3", "mbridge")
    assert "model.moe_token_dispatcher_type=flex" in bridge
    assert "model.moe_flex_dispatcher_backend=hybridep" in bridge and "model.moe_shared_expert_overlap=false" in bridge
    assert "model.expert_model_parallel_size=64" in bridge and "model.expert_tensor_parallel_size=1" in bridge


def test_a2a_overlap_delays_wgrad():
    bridge = _argv("qwen3_235b_a22b", "mbridge")  # the H100 preset overlaps the all-to-all
    assert "comm_overlap.overlap_moe_expert_parallel_comm=true" in bridge
    assert "comm_overlap.delay_wgrad_compute=true" in bridge
    off = _argv("qwen3_235b_a22b", "mbridge", moe_a2a_overlap=False)
    assert "comm_overlap.overlap_moe_expert_parallel_comm=false" in off and not any("delay_wgrad" in a for a in off)


MOE_FILE = """
name = "tiny_moe"
num_layers = 4
hidden_size = 1024
num_attention_heads = 8
num_query_groups = 8
ffn_hidden_size = 4096
vocab_size = 32000
gated_mlp = true
num_experts = 16
moe_topk = 2
moe_ffn_hidden_size = 512
moe_shared_expert_size = 512
moe_first_dense_layers = 1
moe_router_score = "sigmoid"
kv_lora_rank = 256
qk_rope_head_dim = 32
qk_nope_head_dim = 64
v_head_dim = 64
mtp_layers = 1
"""


def test_model_file_takes_the_moe_and_mla_fields(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(MOE_FILE)
    a = load_model_file(f)
    assert (a.num_experts, a.moe_topk, a.expert_ffn, a.moe_layers, a.kv_lora_rank, a.mtp_layers) == (
        16,
        2,
        512,
        3,
        256,
        1,
    )


@pytest.mark.parametrize(
    "change,field",
    [
        (("moe_topk = 2", "moe_topk = 32"), "moe_topk"),
        (("moe_first_dense_layers = 1", "moe_first_dense_layers = 4"), "moe_first_dense_layers"),
        (("v_head_dim = 64", "v_head_dim = 0"), "kv_lora_rank"),
        (('moe_router_score = "sigmoid"', 'moe_router_score = "relu"'), "moe_router_score"),
    ],
)
def test_model_file_moe_errors_name_the_field(tmp_path, change, field):
    f = tmp_path / "m.toml"
    f.write_text(MOE_FILE.replace(*change))
    with pytest.raises(UserError) as e:
        load_model_file(f)
    assert field in str(e.value)
