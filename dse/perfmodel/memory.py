"""Memory per GPU: model states (distributed optimizer or FSDP), activations, logits, reserve.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv 2205.05198), section 4: per layer ``sbh(34 + 5as/h)`` bytes without parallelism, divided
by t with tensor and sequence parallelism, ``34·sbh/t`` with selective recompute and the layer input
``2sbh`` with full recompute. :func:`layer_activation_bytes` is their term-by-term count written for
grouped-query attention (g query groups), any FFN size and gated MLPs, so that it reduces to the paper's
closed forms for a GPT-3 layer and serves Llama and Nemotron as well.
"""

from __future__ import annotations

GIB = float(2**30)


def layer_activation_bytes(s: float, b: float, h: int, a: int, t: int = 1, *, sp: bool = True,
                           recompute: str = "none", g: int | None = None, ffn: int | None = None,
                           gated: bool = False, flash_attention: bool = False, dropout: bool = True,
                           fp8: bool = False, fused_softmax: bool = False) -> float:
    """Bytes one transformer layer keeps for its backward pass, per GPU, for one micro-batch.

    ``s`` is the sequence length held by this GPU (divide by cp first), ``b`` the micro-batch size.
    Korthikanti's count (16-bit activations, 1-byte dropout masks), term by term:
    layer norms 4sbh; attention 2sbh (QKV input) + Q, K, V + 2sbh (projection input) + sbh (dropout mask)
    + 5as²b (scores, softmax, dropout); MLP 2sbh (fc1 input) + activation input + fc2 input + sbh (mask).
    With flash attention the scores are never stored (only a log-sum-exp per row); with ``fp8`` the GEMM
    inputs that Transformer Engine keeps for the weight gradient are 1-byte copies. Without sequence
    parallelism the layer-norm, dropout and GEMM-input tensors are replicated over the tensor-parallel
    ranks (Korthikanti eq. 2: ``sbh(10 + 24/t + 5as/(ht))``).

    ``fused_softmax``: unfused attention whose scale-mask-softmax is one fused kernel (Transformer Engine's
    ``UnfusedDotProductAttention`` with ``scaled_upper_triang_masked_softmax``, Megatron's with
    ``masked_softmax_fusion``): the kernel saves only its bf16 output, the same tensor the P·V GEMM saves, so
    the scores cost 2 bytes per element (TE's ``scaled_upper_triang_masked_softmax_backward``,
    transformer_engine/pytorch/csrc/extensions/softmax.cpp, reads it and works in place on the incoming
    gradient), and the dropout mask and output (3 more) only with attention dropout
    (PyTorch's dropout returns its input unchanged at p = 0). Without it, Korthikanti's 5 bytes stand (recipes.mcore's
    local layer spec: an fp32 softmax output and the bf16 probabilities, about as much; bench/h200_real_runs.py).
    """
    g = a if g is None else g
    ffn = 4 * h if ffn is None else ffn
    d = h / a
    sb = s * b
    if recompute == "full":  # only the layer input is kept (sharded over t with sequence parallelism)
        return 2.0 * sb * h / (t if sp else 1)
    low = 1.0 if fp8 else 2.0  # bytes per element of a saved GEMM input
    mask = 1.0 if dropout else 0.0
    # replicated over TP ranks unless sequence parallel: norms, QKV and fc1 inputs, dropout masks
    rep = sb * h * (4.0 + low + low + 2.0 * mask)
    # split over TP ranks: Q, K, V, projection input, MLP activation input and fc2 input
    qkv = 2.0 * sb * (a * d + 2.0 * g * d)
    proj = 2.0 * sb * a * d + (low * sb * a * d if (flash_attention and fp8) else 0.0)
    act_in = 2.0 * sb * ffn * (2 if gated else 1)
    fc2_in = low * sb * ffn
    split = qkv + proj + act_in + fc2_in
    if flash_attention or recompute == "selective":
        scores = 4.0 * sb * a if flash_attention else 0.0  # fp32 log-sum-exp per row and head
    elif fused_softmax:
        scores = (2.0 + 3.0 * mask) * a * s * sb  # softmax output (2); with dropout its mask (1) and output (2)
    else:
        scores = 5.0 * a * s * sb  # softmax output (2), its dropout mask (1) and output (2): 5as²b
    return (rep / (t if sp else 1)) + (split + scores) / t


def state_bytes_per_param(d: int, *, fsdp: bool = False, grad_bytes: float = 4, weight_bytes: float = 2) -> float:
    """Bytes per parameter of weights, gradients and Adam state with bf16 weights and fp32 gradients.

    Distributed optimizer (Megatron docs, "distributed optimizer"; Megatron-Bridge's memory estimator uses
    the same byte model): 2 (bf16 weight) + 4 (fp32 gradient) + 12/d (fp32 master weight, Adam m and v
    sharded over the d data-parallel ranks) = 6 + 12/d. Megatron FSDP shards weights and gradients too:
    (2 + 4 + 12)/d, with ``weight_bytes`` 1 when the model keeps FP8 weights (``fp8_param_gather``).
    """
    if fsdp:
        return (weight_bytes + grad_bytes + 12.0) / d
    return 2.0 + grad_bytes + 12.0 / d


def inflight_chunks(p: int, v: int, m: int, rank: int = 0) -> list[int]:
    """Micro-batches whose activations pipeline stage ``rank`` holds at its peak, per model chunk.

    Megatron's 1F1B schedule (Narayanan et al. 2021) runs ``p - rank - 1`` warm-up forwards before the
    first backward; the interleaved schedule ``2(p - rank - 1) + (v - 1)p``, visiting chunks in groups of
    p micro-batches. The peak is just after the first steady-state forward. For the first stage this is
    Korthikanti's "L layers' activations" (1F1B) times ``1 + (p-1)/(p·v)`` (interleaved).
    """
    m = max(int(m), 1)
    if v <= 1:
        return [min(p - rank, m)]
    n = min(2 * (p - rank - 1) + (v - 1) * p + 1, m * v)
    rounds, rest = divmod(n, p * v)
    return [p * rounds + min(p, max(0, rest - c * p)) for c in range(v)]
