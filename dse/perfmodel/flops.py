"""Model FLOPs per step (both conventions) and parameter counts of a dense GQA decoder.

The FLOPs formula is the one Megatron-Bridge and NeMo report (``shared/reference/README.md``):
  FLOPs/step = 6·B·s·[ L·( e·h·F + 2·h·a·d + 2·h·g·d + c·a·d·s ) + h·V ]
with e = 3 for gated MLPs (SwiGLU) and 2 otherwise, c = 1 for the causal convention (the masked upper
triangle of the score and value products is not counted) and c = 2 for the noncausal one. Recompute adds
hardware FLOPs, never model FLOPs.
"""

from __future__ import annotations

CONVENTIONS = ("causal", "noncausal")


def mlp_factor(arch) -> int:
    """e in the formula: weight matrices of size h x F in the MLP (3 for SwiGLU, 2 for plain MLPs)."""
    return 3 if arch.gated_mlp else 2


def model_flops_per_step(arch, gbs: int, seq_length: int, convention: str = "causal") -> float:
    """Model FLOPs of one training step (forward and backward) of ``gbs`` sequences of ``seq_length``."""
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; use one of {', '.join(CONVENTIONS)}")
    c = 1 if convention == "causal" else 2
    h, a, g = arch.hidden_size, arch.num_attention_heads, arch.num_query_groups
    d = h // a
    per_layer = mlp_factor(arch) * h * arch.ffn_hidden_size + 2 * h * a * d + 2 * h * g * d + c * a * d * seq_length
    return 6.0 * gbs * seq_length * (arch.num_layers * per_layer + h * arch.vocab_size)


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
