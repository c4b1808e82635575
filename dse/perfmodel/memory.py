"""Memory per GPU: model states (distributed optimizer or FSDP), activations, logits, reserve.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv 2205.05198), section 4: per layer ``sbh(34 + 5as/h)`` bytes without parallelism, divided
by t with tensor and sequence parallelism, ``34·sbh/t`` with selective recompute and the layer input
``2sbh`` with full recompute. :func:`layer_activation_bytes` is their term-by-term count written for
grouped-query attention (g query groups), any FFN size and gated MLPs, so that it reduces to the paper's
closed forms for a GPT-3 layer and serves Llama and Nemotron as well.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dse.perfmodel import moe as _moe
from dse.perfmodel.layout import ModelLayout, Shape, Stages
from dse.perfmodel.stack import Stack, fp8_weight_cache_bytes, logits_peak_bytes
from dse.perfmodel.timing import Params

GIB = float(2**30)


def layer_activation_bytes(
    s: float,
    b: float,
    h: int,
    a: int,
    t: int = 1,
    *,
    sp: bool = True,
    recompute: str = "none",
    g: int | None = None,
    ffn: int | None = None,
    gated: bool = False,
    flash_attention: bool = False,
    dropout: bool = True,
    fp8: bool = False,
    fused_softmax: bool = False,
) -> float:
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


def state_bytes_per_param(d: float, *, fsdp: bool = False, grad_bytes: float = 4, weight_bytes: float = 2) -> float:
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


def offload_kept_layers(layers: float, offloaded: int) -> float:
    """Layers' activations held on the GPU at the peak when ``offloaded`` of ``layers`` go to host memory:
    the others, plus one layer of the offload double buffer (in flight to or from the host)."""
    n = min(offloaded, layers)
    return layers - n + (1.0 if n > 0 else 0.0)


def fsdp_buffer_bytes(layer_params: float, largest_weight: float, weight_b: float, grad_b: float) -> float:
    """Megatron FSDP's unsharded buffers per GPU, as NVIDIA's FSDP recipes set them up.

    ``fsdp_double_buffer=True`` with a communication unit of about one layer
    (``suggested_communication_unit_size`` 800M elements): two layers' gathered weights (one in use, one
    prefetched) and two layers' gradients (one being reduce-scattered, one accumulating).
    ``gradient_accumulation_fusion=False`` (those recipes turn it off for FSDP): each weight gradient is
    first written as its own bf16 tensor and then added to the gradient buffer, so one extra weight-sized
    tensor (the largest weight of a layer) is live during the backward pass.
    """
    return 2.0 * layer_params * (weight_b + grad_b) + 2.0 * largest_weight


def layer_activations(shape: Shape, layout: ModelLayout, fp8: bool, recompute: str = "none") -> float:
    """:func:`layer_activation_bytes` of one layer of ``shape`` under ``layout``'s options. Attention backend
    "unfused" is Transformer Engine's UnfusedDotProductAttention, whose softmax is one fused kernel
    (``fused_softmax``); "local" is Megatron's own, counted as Korthikanti does. A MoE or
    MLA layer: :func:`dse.perfmodel.moe.moe_layer_activation_bytes`."""
    arch = shape.arch
    if _moe.moe_arch(arch):
        return _moe.moe_layer_activation_bytes(shape, layout, fp8, recompute)
    return layer_activation_bytes(
        shape.seq_length / shape.cp,
        shape.mbs,
        arch.hidden_size,
        arch.num_attention_heads,
        shape.tp,
        recompute=recompute,
        sp=layout.sp,
        g=arch.num_query_groups,
        ffn=arch.ffn_hidden_size,
        gated=arch.gated_mlp,
        flash_attention=not layout.unfused_attention,
        dropout=layout.dropout,
        fp8=fp8,
        fused_softmax=layout.attention_backend == "unfused",
    )


def kept_activations(shape: Shape, layout: ModelLayout, fp8: bool, full_layer: float) -> float:
    """Bytes one layer keeps for its backward pass under the layout's recompute, averaged over a model chunk
    (``recompute_num_layers`` of its layers fully recomputed, the others not); ``full_layer`` is one layer's
    activations without recompute."""
    if layout.recompute == "none":
        return full_layer
    if layout.recompute == "selective":
        return layer_activations(shape, layout, fp8, "selective")
    input_only = layer_activations(shape, layout, fp8, "full")
    chunk_layers = shape.arch.num_layers / (shape.pp * shape.vp)
    n = layout.recompute_num_layers
    n_rec = min(n, chunk_layers) if n else chunk_layers
    return (n_rec * input_only + (chunk_layers - n_rec) * full_layer) / chunk_layers


def inflight_layers(shape: Shape, stages: Stages, offloaded: int) -> tuple[float, float]:
    """Layers' activations held at the peak by the first and by the last pipeline stage
    (:func:`inflight_chunks`; the embedding and loss units are not layers), less the offloaded ones."""
    p, v, m = shape.pp, shape.vp, int(shape.microbatches)
    chunk = (stages.first_layers + (1 if stages.accounted else 0)) / v  # layers per model chunk (units when accounted)
    n_first, first_chunk0, n_last, last_chunk_end = _inflight_counts(p, v, m)
    first = n_first * chunk - (first_chunk0 if stages.accounted else 0)
    if p > 1:
        last = n_last * chunk - (last_chunk_end if stages.accounted else 0)
    else:
        last = first
    return offload_kept_layers(first, offloaded), offload_kept_layers(last, offloaded)


@functools.lru_cache(maxsize=4096)
def _inflight_counts(p: int, v: int, m: int) -> tuple[int, int, int, int]:
    """What :func:`inflight_layers` reads of :func:`inflight_chunks` for the first and the last stage: the sum of
    the first's, its first chunk's, the sum of the last's and its last chunk's; once per (p, v, m), since a grid
    has a few hundred and the lists cost more than the rest of the count."""
    counts = inflight_chunks(p, v, m, 0)
    counts_last = inflight_chunks(p, v, m, p - 1)
    return sum(counts), counts[0], sum(counts_last), counts_last[-1]


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """Peak memory of one GPU (GiB) at the larger of the first and the last pipeline stage, and what holds it
    (each part the larger of the two stages', so the parts need not add up to the peak)."""

    peak_gib: float
    states_gib: float
    activations_gib: float
    logits_gib: float
    fsdp_buffers_gib: float
    fp8_weight_cache_gib: float
    reserve_gib: float


@dataclass(slots=True)
class MemoryCounts:
    """The bytes of one GPU's peak that no fitted parameter changes, counted once per layout (:func:`memory_counts`):
    the first and the last stage's model states, FP8 weight cache and FSDP buffers (``fixed_*``), the first stage's
    activations and the last stage's before its logits (``act_first``, ``act_last_layers``), the working set of one
    layer's backward (``work``) and the logit elements on the last stage. :func:`peak_memory` adds what the
    parameters set (fragmentation, bytes per logit, reserve, offset), so that a fit re-evaluates only that."""

    fixed_first: float
    fixed_last: float
    act_first: float
    act_last_layers: float
    work: float
    logits_elements: float
    states_b: float
    states_params: float  # the larger of the first and last stage's parameters, over tp
    fsdp_buf: float
    cache_first: float
    cache_last: float
    expert_states: float = 0.0  # bytes of the routed experts' weights, gradients and optimizer shard (largest stage)

    def peak_gib(self, P: Params, stack: Stack) -> float:
        """The peak (GiB) under ``P``: the larger stage's bytes with fragmentation, plus the reserve and offset."""
        logits_mem = self.logits_elements * logits_peak_bytes(stack, P)
        act_last = self.act_last_layers + max(self.work, logits_mem)
        mem_first = self.fixed_first + self.act_first * (1.0 + P.memory_fragmentation)
        mem_last = self.fixed_last + act_last * (1.0 + P.memory_fragmentation)
        return max(mem_first, mem_last) / GIB + P.memory_reserve_gib + P.memory_offset_gib


def memory_counts(
    shape: Shape, layout: ModelLayout, fp8: bool, stages: Stages, stack: Stack, *, full_layer: float, grad_b: float
) -> MemoryCounts:
    """Model states, the FP8 weight cache, FSDP's buffers and the in-flight activations of the first and the last
    stage, and the last one's logit elements; ``full_layer`` is one layer's activations without recompute."""
    arch, t = shape.arch, shape.tp
    h, a, L = arch.hidden_size, arch.num_attention_heads, arch.num_layers
    act_kept = kept_activations(shape, layout, fp8, full_layer)
    first_layers, last_layers = inflight_layers(shape, stages, min(layout.cpu_offload_layers, L))
    # FP8 recipes gather FP8 weights (fp8_param_gather), one byte per parameter
    weight_b = 1.0 if fp8 and stack.fp8_param_gather else 2.0
    # without fp8_param_gather, Transformer Engine's FP8 copy and transpose of every linear weight of the
    # stage's layers, kept for the whole step (dse.perfmodel.stack)
    lin_layer = h * (shape.qkv_cols + a * shape.head_dim / t + shape.fc1_cols + arch.ffn_hidden_size / t)
    cache_b = fp8_weight_cache_bytes(fp8, stack) * lin_layer
    cache_first = (L if shape.pp == 1 else stages.first_layers) * cache_b
    cache_last = (L if shape.pp == 1 else stages.last_layers) * cache_b
    d_r = shape.data_parallel * shape.cp
    states_b = state_bytes_per_param(d_r if d_r > 1 else 1, fsdp=layout.fsdp, grad_bytes=grad_b, weight_bytes=weight_b)
    fsdp_buf = fsdp_buffer_bytes(stages.layer_params / t, h * shape.fc1_cols, weight_b, grad_b) if layout.fsdp else 0.0
    # the backward pass of one layer needs its full activations and their gradients; unfused attention's
    # backward holds two score-sized gradients besides (dP and dS, bf16: 4 bytes per score element)
    experts = _moe.expert_stages(arch, layout, stages)
    expert_b = state_bytes_per_param(experts.data_parallel, grad_bytes=grad_b, weight_bytes=weight_b)
    s_loc = shape.seq_length / shape.cp
    work = full_layer + (4.0 * shape.mbs * (a / t) * s_loc * s_loc if layout.unfused_attention else 0.0)
    return MemoryCounts(
        fixed_first=stages.first_params / t * states_b + cache_first + fsdp_buf + experts.first * expert_b,
        fixed_last=stages.last_params / t * states_b + cache_last + fsdp_buf + experts.last * expert_b,
        act_first=first_layers * act_kept + work,
        act_last_layers=last_layers * act_kept,
        work=work,
        logits_elements=shape.tokens * arch.vocab_size / t,
        states_b=states_b,
        states_params=max(stages.first_params, stages.last_params) / t,
        fsdp_buf=fsdp_buf,
        cache_first=cache_first,
        cache_last=cache_last,
        expert_states=max(experts.first, experts.last) * expert_b,
    )


def peak_memory(counts: MemoryCounts, P: Params, stack: Stack) -> MemoryUse:
    """The peak and its parts under the parameters ``P``: the counts of :func:`memory_counts`, the last stage's
    logits (bytes per element by the payload's loss), fragmentation of the activations, the reserve and offset.

    The logits live at the end of the forward pass and are gone (the loss's backward) before the first layer's
    backward needs its working set: the last stage peaks at the larger of the two."""
    c = counts
    logits_mem = c.logits_elements * logits_peak_bytes(stack, P)
    act_last = c.act_last_layers + max(c.work, logits_mem)
    return MemoryUse(
        peak_gib=c.peak_gib(P, stack),
        states_gib=(c.states_params * c.states_b + c.expert_states) / GIB,
        activations_gib=max(c.act_first, act_last - logits_mem) / GIB,
        logits_gib=logits_mem / GIB,
        fsdp_buffers_gib=c.fsdp_buf / GIB,
        fp8_weight_cache_gib=max(c.cache_first, c.cache_last) / GIB,
        reserve_gib=P.memory_reserve_gib
        + P.memory_offset_gib
        + max(c.act_first, act_last) * P.memory_fragmentation / GIB,
    )
