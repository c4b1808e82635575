"""MoE memory: the port of Megatron-Bridge's theoretical memory estimator (bench/moe_memory.py) reproduces the
figures Bridge's own unit tests state."""

from __future__ import annotations

from dataclasses import replace

from bench.moe_memory import RefConfig, ref_estimate

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
