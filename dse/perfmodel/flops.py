"""Model FLOPs per step (both conventions) and parameter counts of a dense GQA decoder.

The FLOPs formula is the controller-payload contract's (:func:`recipes.contract.model_flops_per_step`), so
the parser's TFLOP/s, the simulated run's and the megatron-core payload's own log use one convention.
"""

from __future__ import annotations

from dse.recipes import contract

CONVENTIONS = contract.FLOPS_CONVENTIONS


def mlp_factor(arch) -> int:
    """e in the formula: weight matrices of size h x F in the MLP (3 for SwiGLU, 2 for plain MLPs)."""
    return 3 if arch.gated_mlp else 2


def uses_moe_count(arch) -> bool:
    """Whether ``arch`` needs the MoE / MLA / sliding-window count (:func:`recipes.contract.moe_model_flops_per_step`)
    rather than the dense GQA formula."""
    return bool(arch.num_experts or arch.kv_lora_rank or arch.sliding_window or arch.mtp_layers or arch.kv_channels)


def model_flops_per_step(arch, gbs: int, seq_length: int, convention: str = "causal") -> float:
    """Model FLOPs of one training step (forward and backward) of ``gbs`` sequences of ``seq_length``."""
    if uses_moe_count(arch):
        return contract.moe_model_flops_per_step(arch, gbs=gbs, seq_length=seq_length, convention=convention)
    return contract.model_flops_per_step(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        ffn_hidden_size=arch.ffn_hidden_size,
        vocab_size=arch.vocab_size,
        gated_mlp=arch.gated_mlp,
        gbs=gbs,
        seq_length=seq_length,
        convention=convention,
    )


def attention_params(arch) -> int:
    """Parameters of one layer's attention: QKV and output projections (GQA), or MLA's down- and up-projections
    with their norms (Megatron-Core's MLASelfAttention: linear_q_down/up_proj, linear_kv_down/up_proj)."""
    h, a, g = arch.hidden_size, arch.num_attention_heads, arch.num_query_groups
    if not arch.kv_lora_rank:
        d = arch.head_dim
        return h * (a + 2 * g) * d + a * d * h
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    q = h * a * qk if arch.q_lora_rank is None else arch.q_lora_rank * (h + a * qk + 1)
    kv = h * (arch.kv_lora_rank + arch.qk_rope_head_dim) + arch.kv_lora_rank * (
        a * (arch.qk_nope_head_dim + arch.v_head_dim) + 1
    )
    return q + kv + a * arch.v_head_dim * h


def expert_params(arch) -> int:
    """Parameters of one MoE layer's routed experts (all of them; 0 for a dense model)."""
    return arch.num_experts * mlp_factor(arch) * arch.hidden_size * arch.expert_ffn if arch.num_experts else 0


def layer_params(arch) -> float:
    """Parameters of one transformer layer that are not routed experts: attention, MLP and two norm weights (no
    biases). A MoE model's is the average over its layers: the first dense layers' MLP, the MoE layers' shared
    experts and router (the routed experts: :func:`expert_params`, sharded over expert parallelism)."""
    h = arch.hidden_size
    if not arch.num_experts and not arch.kv_lora_rank and arch.kv_channels is None:
        a, g = arch.num_attention_heads, arch.num_query_groups
        d = h // a
        return h * (a + 2 * g) * d + a * d * h + mlp_factor(arch) * h * arch.ffn_hidden_size + 2 * h
    e, L = mlp_factor(arch), arch.num_layers
    if arch.num_experts:
        moe = arch.moe_layers
        mlp = (
            e * h * arch.ffn_hidden_size * (L - moe)
            + (e * h * arch.moe_shared_expert_size + h * arch.num_experts) * moe
        ) / L
    else:
        mlp = e * h * arch.ffn_hidden_size
    return attention_params(arch) + mlp + 2 * h


def embedding_params(arch) -> int:
    """Input embedding (V x h); the output layer has as many (untied, as in Llama 3 and Nemotron 4)."""
    return arch.vocab_size * arch.hidden_size


def total_params(arch) -> float:
    """All parameters (the routed experts included; the MTP layers not)."""
    return (
        arch.num_layers * layer_params(arch)
        + arch.moe_layers * expert_params(arch)
        + 2 * embedding_params(arch)
        + arch.hidden_size
    )
