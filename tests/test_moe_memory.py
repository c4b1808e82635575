"""MoE memory: the port of Megatron-Bridge's theoretical memory estimator (bench/moe_memory.py) reproduces the
figures Bridge's own unit tests state, and dse's memory terms place what Megatron-Core places: the first dense
layers on the first stage, the MTP stage's embedding copy and projection, the expert-heavy middle stages of an
uneven split."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.moe_memory import RefConfig, ref_estimate
from dse.perfmodel import DEFAULT_PARAMS
from dse.perfmodel.flops import attention_params, expert_params, layer_params
from dse.perfmodel.layout import ModelLayout, Stages
from dse.perfmodel.memory import GIB
from dse.perfmodel.moe import expert_stages
from dse.perfmodel.stack import NVIDIA_RECIPES
from dse.recipes.models import RECIPES

# Megatron-Bridge tests/unit_tests/training/utils/test_theoretical_memory_utils.py at f43e405af (PR 5077): its
# ``_make_config`` defaults (micro_batch_size 2, data_parallel_size 4, the distributed optimizer)
BRIDGE_TEST = RefConfig(
    num_layers=4,
    hidden_size=16,
    seq_length=8,
    ffn_hidden_size=64,
    num_attention_heads=4,
    kv_channels=4,
    vocab_size=32,
    make_vocab_size_divisible_by=1,
    should_pad_vocab=False,
    share_embeddings_and_output_weights=True,
    tensor_model_parallel_size=2,
    pipeline_model_parallel_size=2,
    micro_batch_size=2,
    data_parallel_size=4,
)


def test_the_reference_port_reproduces_bridges_dense_figures():
    est = ref_estimate(BRIDGE_TEST)  # test_dense_model_state_estimate_matches_legacy_arithmetic
    assert est.dense_param_count == 13088
    assert est.dense_params == 3400
    assert est.dense_bytes_per_param == 9
    assert est.states_bytes == 30600
    uneven = replace(  # test_dense_model_state_estimate_uses_heaviest_uneven_pipeline_stage
        BRIDGE_TEST,
        num_layers=8,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=4,
        num_layers_in_first_pipeline_stage=1,
        num_layers_in_last_pipeline_stage=3,
        share_embeddings_and_output_weights=False,
    )
    est = ref_estimate(uneven)
    assert est.dense_params == 9952
    assert est.dense_bytes == 89568


def test_the_reference_port_reproduces_bridges_moe_figures():
    uneven = replace(  # test_moe_model_state_estimate_uses_layer_pattern_on_uneven_pipeline_stages
        BRIDGE_TEST,
        num_layers=8,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=4,
        num_layers_in_first_pipeline_stage=1,
        num_layers_in_last_pipeline_stage=3,
        share_embeddings_and_output_weights=False,
        num_moe_experts=2,
        moe_layer_freq=(0, 1, 0, 0, 1, 0, 1, 1),
        moe_ffn_hidden_size=32,
    )
    est = ref_estimate(uneven)
    assert (est.dense_params, est.expert_params) == (5856, 4096)
    ep = replace(  # test_moe_estimate_accounts_for_expert_parallel_sharding
        BRIDGE_TEST,
        pipeline_model_parallel_size=1,
        context_parallel_size=2,
        num_moe_experts=8,
        moe_layer_freq=2,
        moe_ffn_hidden_size=32,
        expert_model_parallel_size=4,
        data_parallel_size=8,
    )
    est = ref_estimate(ep)
    assert (est.dense_param_count, est.dense_params, est.dense_bytes_per_param, est.dense_bytes) == (
        8992,
        4496,
        6.75,
        30348,
    )
    assert (est.expert_param_count, est.expert_params, est.expert_bytes_per_param, est.expert_bytes) == (
        16384,
        4096,
        7.5,
        30720,
    )
    assert est.states_bytes == 61068
    mtp = replace(  # test_moe_list_pattern_shared_expert_latent_and_mtp_counts
        BRIDGE_TEST,
        pipeline_model_parallel_size=1,
        num_moe_experts=4,
        moe_layer_freq=(0, 1, 0, 1),
        moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=8,
        moe_latent_size=4,
        mtp_num_layers=1,
    )
    est = ref_estimate(mtp)
    assert (est.dense_param_count, est.dense_params, est.expert_param_count, est.expert_params) == (
        11232,
        5616,
        3072,
        3072,
    )


def test_the_reference_port_reproduces_bridges_activation_figures():
    # test_activation_estimate_is_partitioned_by_tensor_and_context_parallelism
    est = ref_estimate(replace(BRIDGE_TEST, pipeline_model_parallel_size=1, context_parallel_size=2), 1)
    assert est.activation_bytes == 9568
    # test_activation_estimate_applies_virtual_pipeline_penalty
    assert ref_estimate(replace(BRIDGE_TEST, virtual_pipeline_model_parallel_size=2), 4).activation_bytes == 22240


def _moe_layer_params(arch) -> float:
    """A MoE layer's parameters without the routed experts: attention, shared experts, router, two norms."""
    h = arch.hidden_size
    return attention_params(arch) + 3 * h * arch.moe_shared_expert_size + h * arch.num_experts + 2 * h


def test_the_first_stage_holds_the_first_dense_layers_and_the_last_the_mtp_extras():
    """DeepSeek-V3 on 16 stages (NVIDIA's 4 layers on the first, 1 on the last): the first stage's parameters are its
    three dense layers, one MoE layer and the embedding, more than four average layers; the last stage's are its
    MoE layer, the MTP layer with its ``eh_proj`` and norms, the output layer and the embedding copy Megatron-Core
    builds on the MTP stage."""
    arch = RECIPES["deepseek_v3"].arch
    h, emb = arch.hidden_size, arch.vocab_size * arch.hidden_size
    dense_layer = attention_params(arch) + 3 * h * arch.ffn_hidden_size + 2 * h
    moe_layer = _moe_layer_params(arch)
    st = Stages.of(arch, 16, 1, 4, 1)
    assert st.first_params == pytest.approx(3 * dense_layer + moe_layer + emb, rel=1e-9)
    assert st.first_params > 4 * layer_params(arch) + emb
    assert st.mid_params == pytest.approx(4 * moe_layer, rel=1e-9)
    assert st.last_params == pytest.approx(2 * moe_layer + 2 * emb + 2 * h * h + 2 * h, rel=1e-9)
    # one stage: one embedding for the model and its MTP layer, the dense layers counted once
    one = Stages.of(arch, 1, 1)
    total = 3 * dense_layer + 59 * moe_layer + 2 * emb + 2 * h * h + 2 * h
    assert one.first_params == pytest.approx(total, rel=1e-9)


def test_the_mtp_layers_experts_are_counted_once():
    arch = RECIPES["deepseek_v3_2node"].arch  # 8 layers on 2 stages, one MTP layer on the last
    layout = ModelLayout(num_gpus=16, tp=2, pp=2, ep=8, gbs=128, seq_length=4096)
    experts = expert_stages(arch, layout, Stages.of(arch, 2, 1))
    assert experts.last == pytest.approx(5 * expert_params(arch) / 8)
    assert experts.first == pytest.approx(3 * expert_params(arch) / 8)  # its first layer is dense


def _counts(model: str, gpu: str, num_gpus: int, **kw):
    from dse.perfmodel.model import Prepared

    r = RECIPES[model]
    layout = ModelLayout(num_gpus=num_gpus, seq_length=r.seq_length, **kw)
    return Prepared.of(r.arch, gpu, layout, NVIDIA_RECIPES).memory


def test_an_expert_heavy_middle_stage_sets_the_peak():
    """DeepSeek-V3 on 16 B200 stages of 4 / 4 x 14 / 1+MTP layers: each middle stage holds four MoE layers' experts
    against the first stage's one, so the second stage (the most micro-batches in flight of the middle ones) holds
    the most states and sets the peak; without a middle stage nothing changes."""
    c = _counts("deepseek_v3", "b200", 256, pp=16, ep=8, gbs=4096, pp_first_layers=4, pp_last_layers=1)
    assert c.fixed_mid > 2 * c.fixed_first > 0
    slack = 1.0 + c.slack(DEFAULT_PARAMS)
    mid_gib = (c.fixed_mid + c.act_mid * slack) / GIB
    first_gib = (c.fixed_first + c.act_first * slack) / GIB
    assert mid_gib > first_gib
    extra = DEFAULT_PARAMS.memory_reserve_gib + DEFAULT_PARAMS.memory_offset_gib + c.registered_gib(DEFAULT_PARAMS)
    assert c.peak_gib(DEFAULT_PARAMS, NVIDIA_RECIPES) == pytest.approx(mid_gib + extra)
    # experts: the middle stage's four layers, bf16 weights + fp32 gradients + Adam over 256 / (16 * 8) = 2 ranks
    assert c.expert_states == pytest.approx(4 * expert_params(RECIPES["deepseek_v3"].arch) / 8 * (6 + 12 / 2))
    two = _counts("qwen3_30b_a3b", "h100", 16, pp=2, ep=8, gbs=512)
    assert two.fixed_mid == two.act_mid == 0.0


def test_a_dense_model_keeps_its_stages():
    arch = RECIPES["llama3_70b"].arch
    st = Stages.of(arch, 4, 1)
    emb = arch.vocab_size * arch.hidden_size
    assert st.first_params == st.last_params == pytest.approx(20 * layer_params(arch) + emb)
    assert st.mid_params == pytest.approx(20 * layer_params(arch))


def test_a_dense_embedding_accounted_split_keeps_its_first_stage_peak():
    """Llama 3.1 405B on 16 stages counts the embedding and the loss as layers; the second stage is not counted for
    a dense model (Meta's published runs of this layout fit where it would not), unless the split is set by hand."""
    c = _counts("llama3_405b", "h100", 1024, tp=8, pp=16, vp=8, gbs=512, precision="fp8")
    assert c.fixed_mid == c.act_mid == 0.0
    uneven = _counts("llama3_405b", "h100", 1024, tp=8, pp=16, gbs=512, pp_first_layers=7, pp_last_layers=7)
    assert uneven.fixed_mid > 0.0 and uneven.act_mid > 0.0


def test_dse_and_the_reference_place_deepseek_v3s_experts_alike():
    """NVIDIA's DeepSeek-V3 layout on 256 B200 (16 stages of 4 / 4 x 14 / 1 + MTP layers, ep 8): the most loaded GPU
    holds a middle stage's four MoE layers' experts over ep in dse and in Megatron-Bridge's estimator alike."""
    from bench.moe_memory import dse_memory, ref_config
    from dse.perfmodel.trials import make_trial

    r = RECIPES["deepseek_v3"]
    trial = make_trial(r, "b200", 256, pp=16, vp=1, ep=8, pp_first_layers=4, pp_last_layers=1, gbs=4096)
    ref = ref_estimate(ref_config(trial), trial.num_microbatches)
    assert dse_memory(trial).expert_params == pytest.approx(ref.expert_params, rel=1e-9)
    assert ref.expert_params == pytest.approx(4 * expert_params(r.arch) / 8, rel=1e-9)
