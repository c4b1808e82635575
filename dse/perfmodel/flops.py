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


def model_flops_per_step(arch, gbs: int, seq_length: int, convention: str = "causal") -> float:
    """Model FLOPs of one training step (forward and backward) of ``gbs`` sequences of ``seq_length``."""
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


def layer_params(arch) -> int:
    """Parameters of one transformer layer: QKV, output projection, MLP and two norm weights (no biases)."""
    h, a, g = arch.hidden_size, arch.num_attention_heads, arch.num_query_groups
    d = h // a
    return h * (a + 2 * g) * d + a * d * h + mlp_factor(arch) * h * arch.ffn_hidden_size + 2 * h


def embedding_params(arch) -> int:
    """Input embedding (V x h); the output layer has as many (untied, as in Llama 3 and Nemotron 4)."""
    return arch.vocab_size * arch.hidden_size


def total_params(arch) -> int:
    return arch.num_layers * layer_params(arch) + 2 * embedding_params(arch) + arch.hidden_size
