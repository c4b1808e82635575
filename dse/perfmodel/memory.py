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
from dse.perfmodel.layout import (
    LOCAL_SCORE_BUFFER_BYTES,
    LOCAL_SOFTMAX_BACKWARD_BYTES,
    NVFP4_ELEMENT_BYTES,
    ModelLayout,
    Shape,
    Stages,
    kept_score_bytes,
)
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
    low_bytes: float = 1.0,
    local_spec: bool = False,
) -> float:
    """Bytes one transformer layer keeps for its backward pass, per GPU, for one micro-batch.

    ``s`` is the sequence length held by this GPU (divide by cp first), ``b`` the micro-batch size.
    Korthikanti's count (16-bit activations, 1-byte dropout masks), term by term:
    layer norms 4sbh; attention 2sbh (QKV input) + Q, K, V + 2sbh (projection input) + sbh (dropout mask)
    + 5as²b (scores, softmax, dropout); MLP 2sbh (fc1 input) + activation input + fc2 input + sbh (mask).
    With flash attention the scores are never stored (only a log-sum-exp per row); with ``fp8`` the GEMM
    inputs that Transformer Engine keeps for the weight gradient are quantised copies of ``low_bytes`` per element
    (1 for FP8; NVFP4's column-wise copy, E2M1 and its block scales, is :data:`NVFP4_ELEMENT_BYTES`: TE's linear
    layers drop the row-wise half before saving it). Without sequence
    parallelism the layer-norm, dropout and GEMM-input tensors are replicated over the tensor-parallel
    ranks (Korthikanti eq. 2: ``sbh(10 + 24/t + 5as/(ht))``).

    ``fused_softmax``: unfused attention whose scale-mask-softmax is one fused kernel (Transformer Engine's
    ``UnfusedDotProductAttention`` with ``scaled_upper_triang_masked_softmax``, Megatron's with
    ``masked_softmax_fusion``): the kernel saves only its bf16 output, the same tensor the P·V GEMM saves, so
    the scores cost 2 bytes per element (TE's ``scaled_upper_triang_masked_softmax_backward``,
    transformer_engine/pytorch/csrc/extensions/softmax.cpp, reads it and works in place on the incoming
    gradient), and the dropout mask and output (3 more) only with attention dropout
    (PyTorch's dropout returns its input unchanged at p = 0). Without it, Korthikanti's 5 bytes stand.

    ``local_spec``: Megatron-Core's local layer spec (``attention_backend=local``; recipes.mcore runs it where
    Transformer Engine is missing), whose modules are PyTorch's own ops, each keeping what its autograd saves:
    the core attention (``DotProductAttention``) upcasts the scores and keeps the fp32 softmax output and the bf16
    probabilities (:func:`dse.perfmodel.layout.kept_score_bytes`, 6 bytes per score element without dropout); with
    grouped-query attention it repeats K and V to every head (``repeat_interleave``) before the two GEMMs, which
    save the copies, so Q, K and V keep ``3·a·d`` elements a token, not ``(a + 2g)·d`` (selective recompute
    checkpoints the core attention on Q, K and V as they come, so there the repeat is recomputed); a gated MLP
    without ``bias_activation_fusion`` runs ``silu(x_glu) * (x_linear + glu_linear_offset)``, whose product saves the
    activation's output and the offset sum, two ffn-sized tensors more (megatron/core/transformer/mlp.py). Its norms
    (``torch.nn.RMSNorm``) keep their input, as the count has it.
    """
    g = a if g is None else g
    ffn = 4 * h if ffn is None else ffn
    d = h / a
    sb = s * b
    if recompute == "full":  # only the layer input is kept (sharded over t with sequence parallelism)
        return 2.0 * sb * h / (t if sp else 1)
    low = low_bytes if fp8 else 2.0  # bytes per element of a saved GEMM input
    mask = 1.0 if dropout else 0.0
    local_gqa = local_spec and g < a and recompute != "selective"  # K and V repeated to every head, and saved
    # replicated over TP ranks unless sequence parallel: norms, QKV and fc1 inputs, dropout masks
    rep = sb * h * (4.0 + low + low + 2.0 * mask)
    # split over TP ranks: Q, K, V, projection input, MLP activation input and fc2 input
    qkv = 2.0 * sb * (3.0 * a * d if local_gqa else a * d + 2.0 * g * d)
    proj = 2.0 * sb * a * d + (low * sb * a * d if (flash_attention and fp8) else 0.0)
    act_in = 2.0 * sb * ffn * (2 if gated else 1) + local_glu_bytes(sb, ffn, gated, local_spec)
    fc2_in = low * sb * ffn
    split = qkv + proj + act_in + fc2_in
    if flash_attention or recompute == "selective":
        scores = 4.0 * sb * a if flash_attention else 0.0  # fp32 log-sum-exp per row and head
    else:  # softmax output (2); with dropout its mask (1) and output (2); unfused softmax Korthikanti's 5as²b
        scores = kept_score_bytes(fused_softmax, dropout, fp32_softmax=local_spec) * a * s * sb
    return (rep / (t if sp else 1)) + (split + scores) / t


def local_glu_bytes(sb: float, ffn: float, gated: bool, local_spec: bool) -> float:
    """What a gated MLP of Megatron-Core's local spec keeps beyond the fc1 output and fc2 input, per GPU before the
    TP split: the activation's output and ``x_linear + glu_linear_offset`` (bf16, ffn elements a token each), which
    the product saves (:func:`layer_activation_bytes`); 0 elsewhere."""
    return 2.0 * 2.0 * sb * ffn if (local_spec and gated) else 0.0


def state_bytes_per_param(
    d: float,
    *,
    fsdp: bool = False,
    grad_bytes: float = 4,
    weight_bytes: float = 2,
    resident_weight_bytes: float = 2,
    master_bytes: float = 4,
) -> float:
    """Bytes per parameter of weights, gradients and Adam state with bf16 weights and fp32 gradients.

    Distributed optimizer (Megatron docs, "distributed optimizer"; Megatron-Bridge's memory estimator uses
    the same byte model): 2 (bf16 weight) + 4 (fp32 gradient) + 12/d (fp32 master weight, Adam m and v
    sharded over the d data-parallel ranks) = 6 + 12/d. Megatron FSDP shards weights and gradients too:
    (2 + 4 + 12)/d, with ``weight_bytes`` 1 when the model keeps FP8 weights (``fp8_param_gather``).
    ``resident_weight_bytes``: what an unsharded weight element holds without FSDP (:func:`resident_weight_bytes`).
    ``master_bytes``: the master weight's bytes in the optimizer shard (2 where only its low 16 bits are kept:
    :attr:`dse.perfmodel.stack.Stack.master_param_bytes`).
    """
    opt = 8.0 + master_bytes
    if fsdp:
        return (weight_bytes + grad_bytes + opt) / d
    return resident_weight_bytes + grad_bytes + opt / d


def resident_weight_bytes(fp8_params: bool, fp8_recipe: str, non_tn_fp8_gemm: bool) -> float:
    """Bytes a linear weight element holds on the GPU for the whole step without FSDP, as its model parameter.

    bf16 weights: 2. FP8 weights (``fp8_param_gather``: the parameter is Transformer Engine's FP8 tensor, and
    Megatron-Core's ``param_and_grad_buffer.py`` gives such parameters a uint8 buffer): 1 byte of row-wise data,
    plus a 1-byte transpose where the GEMMs need it. Per-tensor FP8 (delayed, tensorwise) makes the transpose only
    where cuBLAS takes FP8 in the TN layout alone: ``_setup_conditional_transpose_storage`` allocates it when
    ``columnwise_usage and not non_tn_fp8_gemm_supported()``, and ``is_non_tn_fp8_gemm_supported``
    (transformer_engine/pytorch/utils.py) is true on compute capability 10.x and 13+ (B200, B300, GB200, GB300),
    false on Hopper: 1 byte on Blackwell, 2 on Hopper. MXFP8 keeps row-wise and column-wise data, each with its
    own block scales (1 + 1 + 2/32): 2 on every GPU, as blockwise FP8 does (1 + 1). The count applies the byte
    to every parameter of the stage, the embedding and output layer (never FP8) included: on a first or last
    stage that under-counts by their parameters, about 1 GiB for Llama 3.1 405B at TP 2, against a 1-byte
    over-count of all the stage's linear weights (~23 GiB there) before."""
    if not fp8_params:
        return 2.0
    if fp8_recipe in ("delayed", "tensorwise") and non_tn_fp8_gemm:
        return 1.0
    return 2.0


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
    (``fused_softmax``); "local" is Megatron-Core's local layer spec (``local_spec``). A MoE or
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
        sp=bool(layout.sp),
        g=arch.num_query_groups,
        ffn=arch.ffn_hidden_size,
        gated=arch.gated_mlp,
        flash_attention=not layout.unfused_attention,
        dropout=layout.dropout,
        fp8=fp8,
        fused_softmax=layout.attention_backend == "unfused",
        low_bytes=NVFP4_ELEMENT_BYTES if layout.precision == "nvfp4" else 1.0,
        local_spec=layout.attention_backend == "local",
    )


def kept_activations(shape: Shape, layout: ModelLayout, fp8: bool, full_layer: float) -> float:
    """Bytes one layer keeps for its backward pass under the layout's recompute, averaged over a model chunk
    (``recompute_num_layers`` of its layers fully recomputed, the others not); ``full_layer`` is one layer's
    activations without recompute."""
    if layout.recompute == "none":
        return full_layer
    if layout.recompute == "selective":
        return full_layer - selective_saved_bytes(shape, layout, fp8, full_layer)
    input_only = layer_activations(shape, layout, fp8, "full")
    chunk_layers = shape.arch.num_layers / (shape.pp * shape.vp)
    n = layout.recompute_num_layers
    n_rec = min(n, chunk_layers) if n else chunk_layers
    return (n_rec * input_only + (chunk_layers - n_rec) * full_layer) / chunk_layers


def selective_saved_bytes(shape: Shape, layout: ModelLayout, fp8: bool, full_layer: float) -> float:
    """Bytes of one layer's activations that selective recompute does not keep, module by module (Megatron-Core's
    ``recompute_modules``, in the terms of :func:`layer_activation_bytes`).

    ``core_attn``: the attention scores (unfused attention; flash attention keeps none). ``mlp``: the MLP is
    checkpointed on its input (Megatron-Core's ``TransformerLayer`` runs ``self.mlp`` under
    ``tensor_parallel.checkpoint``), which the layer keeps anyway (the norm's input), so what goes is fc1's saved
    input, the activation's input and fc2's input. ``layernorm`` saves nothing on a dense layer: Transformer
    Engine's spec fuses the norms into the next linear, which keeps its own input, and Megatron-Core recomputes
    only a norm that is a module of its own (see :func:`dse.perfmodel.model.selective_recompute_time`). The MoE
    and MLA modules save nothing on a dense model."""
    arch, t = shape.arch, shape.tp
    if _moe.moe_arch(arch):
        kept = _moe.moe_layer_activation_bytes(shape, layout, fp8, "selective", _moe.recomputed_modules(layout))
        return max(0.0, full_layer - kept)
    sb = shape.seq_length / shape.cp * shape.mbs
    low = 1.0 if fp8 else 2.0  # bytes of a saved GEMM input
    rep = t if layout.sp else 1  # the replicated tensors are split over TP with sequence parallelism
    saved = 0.0
    if layout.recomputes("core_attn"):
        saved += full_layer - layer_activations(shape, layout, fp8, "selective")
    if layout.recomputes("mlp"):
        ffn = arch.ffn_hidden_size
        act_in = 2.0 * sb * ffn * (2 if arch.gated_mlp else 1)
        act_in += local_glu_bytes(sb, ffn, arch.gated_mlp, layout.attention_backend == "local")
        saved += low * sb * arch.hidden_size / rep + (act_in + low * sb * ffn) / t
    return saved


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


def first_dense_saving(shape: Shape, layout: ModelLayout, fp8: bool, stages: Stages, act_kept: float) -> float:
    """Bytes by which the first stage's in-flight activations fall short of counting every layer as a MoE layer:
    the model's first dense layers (``moe_first_dense_layers``: DeepSeek-V3's three, in Megatron-Core's
    ``moe_layer_freq`` pattern) sit in the first model chunk of the first stage and keep a dense layer's
    activations, smaller than a MoE layer's ``act_kept`` (no routed copies, router scores or shared experts; and
    ``mlp`` recomputes their MLP, which Megatron-Core's ``TransformerLayer`` does for a dense MLP only), under the
    layout's recompute as the MoE layers are: selective recompute of ``core_attn`` drops their unfused scores too
    (counted with the scores, a dense layer of DeepSeek-V3 on the local spec kept more than a MoE layer and saved
    nothing; the H100 probes of its 8-layer slice, bench/probe_compare.py, measured 44.3 GiB of activations on the
    first stage where that count gave 49.1 and this one 44.5). That chunk
    is in flight :func:`inflight_chunks` ``[0]`` times at the peak. 0 under full recompute (every layer keeps its
    input only), with activation offloading, or for a model without first dense layers."""
    arch = shape.arch
    dense = arch.moe_first_dense_layers
    if not dense or not arch.num_experts or layout.recompute == "full" or layout.cpu_offload_layers:
        return 0.0
    modules = _moe.recomputed_modules(layout)
    kept_dense = _moe.moe_layer_activation_bytes(shape, layout, fp8, layout.recompute, modules, dense=True)
    unit = 1.0 if stages.accounted else 0.0  # the embedding counts as a layer of the first chunk
    chunk0_layers = (stages.first_layers + unit) / shape.vp - unit
    in_flight = _inflight_counts(shape.pp, shape.vp, int(shape.microbatches))[1]
    return in_flight * min(float(dense), max(chunk0_layers, 0.0)) * max(0.0, act_kept - kept_dense)


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
    """Peak memory of one GPU (GiB) at the largest of the first, the second (:func:`mid_stage_counts`) and the last
    pipeline stage, and what holds it (each part the largest stage's, so the parts need not add up to the peak)."""

    peak_gib: float
    states_gib: float
    activations_gib: float
    logits_gib: float
    fsdp_buffers_gib: float
    fp8_weight_cache_gib: float
    cuda_graphs_gib: float
    reserve_gib: float


@dataclass(slots=True)
class MemoryCounts:
    """The bytes of one GPU's peak that no fitted parameter changes, counted once per layout (:func:`memory_counts`):
    the first, the last and the second stage's model states, FP8 weight cache and FSDP buffers (``fixed_*``), the
    first and the second stage's activations and the last stage's before its logits (``act_first``, ``act_mid``,
    ``act_last_layers``), the working set of one layer's backward (``work``) and the logit elements on the last
    stage. :func:`peak_memory` adds what the parameters set (fragmentation, bytes per logit, reserve, offset), so
    that a fit re-evaluates only that."""

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
    graph_static: float = 0.0  # CUDA graphs' static input/output buffers (in fixed_*), :func:`graph_static_bytes`
    graphed: float = 0.0  # 1 when CUDA graphs capture the layers: their private pool (Params.cuda_graph_pool_share)
    nccl_ub: bool = False  # NCCL-registered DP buffers: Params.nccl_ub_memory_gib more
    expert_states: float = 0.0  # bytes of the routed experts' weights, gradients and optimizer shard (largest stage)
    fixed_mid: float = 0.0  # the most loaded middle stage's (:func:`mid_stage_counts`); 0 for p < 3
    act_mid: float = 0.0
    outside_extra_gib: float = 0.0  # the payload's measured memory outside PyTorch's allocator beyond the reserve
    # (fixed, act) of each middle stage 1 .. p - 2 where they are counted (:func:`middle_stages`); the heaviest is
    # (fixed_mid, act_mid), which the peak reads; a probe of a middle stage reads its own.
    mid_stages: tuple[tuple[float, float], ...] = ()

    def slack(self, P: Params) -> float:
        """The share of the activations the allocator cannot reuse: fragmentation, and the CUDA graphs' pool."""
        return P.memory_fragmentation + self.graphed * P.cuda_graph_pool_share

    def stage_gib(self, P: Params, stack: Stack, *, middle: bool = False) -> dict[str, float]:
        """Each stage's peak (GiB) under ``P``, as :meth:`peak_gib` counts it: ``first``, ``last`` and ``mid`` (the
        heaviest middle stage where :func:`mid_stage_counts` counts them, else 0), each with the reserve and offset;
        with ``middle``, also ``stageK`` for each middle stage K (1 .. p - 2): what a probe of that stage is compared
        with."""
        logits_mem = self.logits_elements * logits_peak_bytes(stack, P)
        act_last = self.act_last_layers + max(self.work, logits_mem)
        extra = self.outside_gib(P) + P.memory_offset_gib
        grow = 1.0 + self.slack(P)
        mem = {
            "first": self.fixed_first + self.act_first * grow,
            "last": self.fixed_last + act_last * grow,
            "mid": self.fixed_mid + self.act_mid * grow,
        }
        if middle:
            mem.update({f"stage{k}": fixed + act * grow for k, (fixed, act) in enumerate(self.mid_stages, 1)})
        return {k: (v / GIB + extra if v else 0.0) for k, v in mem.items()}

    def peak_gib(self, P: Params, stack: Stack) -> float:
        """The peak (GiB) under ``P``: the larger stage's bytes with fragmentation, plus the reserve and offset."""
        return max(self.stage_gib(P, stack).values())

    def registered_gib(self, P: Params) -> float:
        """What NCCL user-buffer registration holds beyond the buffers themselves (GiB)."""
        return P.nccl_ub_memory_gib if self.nccl_ub else 0.0

    def outside_gib(self, P: Params) -> float:
        """What the process holds outside PyTorch's caching allocator (GiB): the reserve (CUDA context, NCCL and
        library workspaces), NCCL user-buffer registration, and what the payload's runs were measured to hold beyond
        the reserve (:attr:`dse.perfmodel.stack.Stack.outside_extra_gib`)."""
        return P.memory_reserve_gib + self.registered_gib(P) + self.outside_extra_gib


def graph_static_bytes(shape: Shape, layout: ModelLayout, graphs: float) -> float:
    """The static buffers of per-layer CUDA graphs: a captured graph reads its input from and writes its output to
    fixed addresses, so each graph keeps an input and an output buffer of the micro-batch's hidden states (bf16,
    split over TP with sequence parallelism) for its lifetime. Megatron-Core's local graphs
    (``megatron/core/transformer/cuda_graphs.py``: a ``CudaGraphManager`` per layer records a new runner whenever
    every runner it has is between its forward and its backward; with pipeline parallelism one per micro-batch,
    whose buffers go back to a shared reuse pool once its backward has run) keep one set live per layer and
    micro-batch in flight: ``graphs`` is that count, the stage's in-flight layers (:func:`inflight_layers`). A partial scope keeps
    buffers for each part it captures (at most two a layer). A ``full_iteration`` graph's inputs are the batch's
    token ids, labels, mask and positions: nothing next to the activations."""
    if layout.graph_share == 0.0 or layout.cuda_graph_scope == "full_iteration":
        return 0.0
    parts = 1 if layout.cuda_graph_scope == "full" else min(2, len(layout.cuda_graph_scope.split(",")))
    return graphs * parts * 2.0 * shape.tokens * shape.hidden_sp * 2.0


def weight_bytes(shape: Shape, layout: ModelLayout, fp8: bool, stack: Stack) -> tuple[float, float]:
    """Bytes per parameter of the weights the optimizer gathers, and bytes per layer of the low-precision weight
    cache Transformer Engine keeps for the whole step."""
    arch, t = shape.arch, shape.tp
    nvfp4 = fp8 and layout.precision == "nvfp4"
    # FP8 recipes gather FP8 weights (fp8_param_gather), one byte per parameter; NVFP4 keeps bf16 weights
    # (bf16_with_nvfp4_mixed sets fp8_param_gather=False: Megatron-Core has no FP4 parameter gather)
    weight_b = 1.0 if fp8 and stack.fp8_param_gather and not nvfp4 else 2.0
    # without fp8_param_gather, Transformer Engine's FP8 copy and transpose of every linear weight of the
    # stage's layers, kept for the whole step (dse.perfmodel.stack); NVFP4's row-wise and column-wise copies
    lin_layer = arch.hidden_size * (
        shape.qkv_cols + arch.num_attention_heads * shape.head_dim / t + shape.fc1_cols + arch.ffn_hidden_size / t
    )
    cache_b = (2.0 * NVFP4_ELEMENT_BYTES if nvfp4 else fp8_weight_cache_bytes(fp8, stack)) * lin_layer
    return weight_b, cache_b


def memory_counts(
    shape: Shape,
    layout: ModelLayout,
    fp8: bool,
    stages: Stages,
    stack: Stack,
    *,
    full_layer: float,
    grad_b: float,
    non_tn_fp8_gemm: bool = False,
) -> MemoryCounts:
    """Model states, the FP8 weight cache, FSDP's buffers and the in-flight activations of the first and the last
    stage, and the last one's logit elements; ``full_layer`` is one layer's activations without recompute,
    ``non_tn_fp8_gemm`` whether the GPU's FP8 GEMMs take any layout (Blackwell; :func:`resident_weight_bytes`)."""
    arch, t = shape.arch, shape.tp
    h, L = arch.hidden_size, arch.num_layers
    act_kept = kept_activations(shape, layout, fp8, full_layer)
    first_layers, last_layers = inflight_layers(shape, stages, min(layout.cpu_offload_layers, L))
    dense_saving = first_dense_saving(shape, layout, fp8, stages, act_kept)
    weight_b, cache_b = weight_bytes(shape, layout, fp8, stack)
    cache_first = (L if shape.pp == 1 else stages.first_layers) * cache_b
    cache_last = (L if shape.pp == 1 else stages.last_layers) * cache_b
    d_r = shape.data_parallel * shape.cp
    resident_b = resident_weight_bytes(weight_b == 1.0, layout.fp8_recipe, non_tn_fp8_gemm)
    states_b = state_bytes_per_param(
        d_r if d_r > 1 else 1,
        fsdp=layout.fsdp,
        grad_bytes=grad_b,
        weight_bytes=weight_b,
        resident_weight_bytes=resident_b,
        master_bytes=stack.master_param_bytes,
    )
    fsdp_buf = fsdp_buffer_bytes(stages.layer_params / t, h * shape.fc1_cols, weight_b, grad_b) if layout.fsdp else 0.0
    experts = _moe.expert_stages(arch, layout, stages)
    expert_b = state_bytes_per_param(
        experts.data_parallel, grad_bytes=grad_b, weight_bytes=weight_b, master_bytes=stack.master_param_bytes
    )
    work = backward_work_bytes(shape, layout, full_layer, act_kept)
    score_buffer = local_score_buffer_bytes(shape, layout)
    graph_first = graph_static_bytes(shape, layout, first_layers)
    graph_last = graph_static_bytes(shape, layout, last_layers)
    mids = middle_stages(shape, layout, stages, act_kept, work, (cache_b, states_b), fp8)
    # the second stage's experts (its MoE layers: :func:`dse.perfmodel.moe.mid_dense_layers`), a later one's
    mid_experts = [experts.mid if k == 0 else experts.later for k in range(len(mids))]
    mids = tuple(
        (fixed + fsdp_buf + n * expert_b + score_buffer, act) for (fixed, act), n in zip(mids, mid_experts, strict=True)
    )
    fixed_mid, act_mid = max(mids, key=lambda m: m[0] + m[1]) if mids else (0.0, 0.0)
    return MemoryCounts(
        fixed_first=stages.first_params / t * states_b
        + cache_first
        + fsdp_buf
        + graph_first
        + experts.first * expert_b
        + score_buffer,
        fixed_last=stages.last_params / t * states_b
        + cache_last
        + fsdp_buf
        + graph_last
        + experts.last * expert_b
        + score_buffer,
        act_first=first_layers * act_kept - dense_saving + work,
        act_last_layers=last_layers * act_kept - (dense_saving if shape.pp == 1 else 0.0),
        work=work,
        logits_elements=shape.tokens * arch.vocab_size / t,
        states_b=states_b,
        states_params=max(stages.first_params, stages.last_params, stages.mid_params if fixed_mid else 0.0) / t,
        fsdp_buf=fsdp_buf,
        cache_first=cache_first,
        cache_last=cache_last,
        graph_static=max(graph_first, graph_last),
        graphed=1.0 if layout.graph_share > 0.0 else 0.0,
        nccl_ub=layout.nccl_ub,
        expert_states=(experts.largest if fixed_mid else max(experts.first, experts.last)) * expert_b,
        fixed_mid=fixed_mid,
        act_mid=act_mid,
        mid_stages=mids,
        outside_extra_gib=stack.outside_extra_gib,
    )


def backward_work_bytes(shape: Shape, layout: ModelLayout, full_layer: float, act_kept: float) -> float:
    """Bytes the backward pass of one layer holds at its peak beyond what the in-flight layers keep (``act_kept``
    each; ``full_layer``: one layer's activations without recompute).

    The Transformer Engine stack: the layer's full activations and their gradients, and unfused attention's two
    score-sized gradients besides (dP and dS, bf16: 4 bytes per score element). Megatron-Core's local layer spec
    (``attention_backend=local``) is counted op by op and measured (:data:`dse.perfmodel.layout.
    LOCAL_SOFTMAX_BACKWARD_BYTES`): the peak is its core attention's softmax backward, where the layer holds the
    activations recompute had dropped (``full_layer - act_kept``: the scores under selective, the layer under
    full recompute) and the softmax's working set of 16 bytes per score element, of which it keeps 6 in any case;
    the activation gradients are smaller than the MLP's saved tensors, freed by then, and are not counted."""
    a, t = shape.arch.num_attention_heads, shape.tp
    s_loc = shape.seq_length / shape.cp
    scores = shape.mbs * (a / t) * s_loc * s_loc
    if layout.attention_backend == "local":
        kept = kept_score_bytes(False, layout.dropout, fp32_softmax=True)
        return max(0.0, full_layer - act_kept) + (LOCAL_SOFTMAX_BACKWARD_BYTES - kept) * scores
    return full_layer + (4.0 * scores if layout.unfused_attention else 0.0)


def local_score_buffer_bytes(shape: Shape, layout: ModelLayout) -> float:
    """Megatron's preallocated Q·K^T buffer under the local spec (:data:`dse.perfmodel.layout.
    LOCAL_SCORE_BUFFER_BYTES`: one layer's bf16 scores of one micro-batch, kept for the whole run); 0 elsewhere."""
    if layout.attention_backend != "local":
        return 0.0
    s_loc = shape.seq_length / shape.cp
    return LOCAL_SCORE_BUFFER_BYTES * shape.mbs * (shape.arch.num_attention_heads / shape.tp) * s_loc * s_loc


def middle_stages(
    shape: Shape,
    layout: ModelLayout,
    stages: Stages,
    act_kept: float,
    work: float,
    bytes_b: tuple[float, float],
    fp8: bool = False,
) -> tuple[tuple[float, float], ...]:
    """:func:`mid_stage_counts` of each middle pipeline stage, 1 .. p - 2 (``bytes_b``: the FP8 weight cache's bytes
    per layer and the states' bytes per parameter); empty where the second stage is not counted."""
    out = []
    for k in range(1, shape.pp - 1):
        fixed, act = mid_stage_counts(shape, layout, stages, act_kept, work, *bytes_b, fp8, stage=k)
        if not fixed:
            return ()
        out.append((fixed, act))
    return tuple(out)


def mid_stage_counts(
    shape: Shape,
    layout: ModelLayout,
    stages: Stages,
    act_kept: float,
    work: float,
    cache_b: float,
    states_b: float,
    fp8: bool = False,
    stage: int = 1,
) -> tuple[float, float]:
    """A middle pipeline stage's bytes beside the experts' and FSDP's (its states, FP8 weight cache and CUDA
    graphs' buffers) and its in-flight activations with one layer's backward working set; (0, 0) with fewer than
    three stages. ``stage`` (1 .. p - 2) is the second by default: it holds the same layers as the later middle
    stages and the most micro-batches in flight (:func:`inflight_chunks` of rank 1), but the first dense layers
    that overflow the first stage (below); a probe of a stage is compared with its own count. The middle stages
    are the peak where the first and last stages are made lighter
    (``pp_first_layers`` / ``pp_last_layers``: DeepSeek-V3 on 16 stages puts 4 layers, three of them dense, on the
    first and 1 and the MTP layer on the last, so each middle stage holds 4 MoE layers' experts), and with the
    embedding counted as a layer (``account_for_embedding_in_pipeline_split``) in a MoE model, whose middle stages
    then hold one more layer's experts than the first. The first dense layers that do not fit the first stage's first
    chunk sit in the second stage's (:func:`dse.perfmodel.moe.mid_dense_layers`) and keep a dense layer's
    activations, as :func:`first_dense_saving` counts them on the first stage.

    Counted for a MoE model and for any split with ``pp_first_layers`` / ``pp_last_layers`` set, not for a dense
    model's even or embedding-accounted split: there the second stage holds a full chunk where the first holds the
    embedding, with nearly as many micro-batches in flight (Llama 3.1 405B, tp 8 pp 16 vp 8: 141 layers' activations
    against 112), which would put Meta's published 405B runs on 8K and 16K H100 (their own pipeline schedule) at
    95 GiB of 80 where they trained; that question stays open (docs/moe.md, "Memory")."""
    p, v = shape.pp, shape.vp
    if p < 3 or not (shape.arch.num_experts or layout.pp_first_layers or layout.pp_last_layers):
        return 0.0, 0.0
    layers = min(layout.cpu_offload_layers, shape.arch.num_layers)
    in_flight = offload_kept_layers(
        sum(inflight_chunks(p, v, int(shape.microbatches), stage)) * stages.mid_layers / v, layers
    )
    fixed = stages.mid_params / shape.tp * states_b + stages.mid_layers * cache_b
    fixed += graph_static_bytes(shape, layout, in_flight)
    # the first dense layers the second stage holds (its first chunk's) keep a dense layer's activations
    dense = _moe.mid_dense_layers(shape.arch, layout, stages) if stage == 1 else 0.0
    saving = 0.0
    if dense and layout.recompute != "full" and not layout.cpu_offload_layers:
        modules = _moe.recomputed_modules(layout)
        kept_dense = _moe.moe_layer_activation_bytes(shape, layout, fp8, layout.recompute, modules, dense=True)
        saving = inflight_chunks(p, v, int(shape.microbatches), stage)[0] * dense * max(0.0, act_kept - kept_dense)
    return fixed, in_flight * act_kept - saving + work


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
        activations_gib=max(c.act_first, act_last - logits_mem, c.act_mid) / GIB,
        logits_gib=logits_mem / GIB,
        fsdp_buffers_gib=c.fsdp_buf / GIB,
        fp8_weight_cache_gib=max(c.cache_first, c.cache_last) / GIB,
        cuda_graphs_gib=(c.graph_static + max(c.act_first, act_last, c.act_mid) * c.graphed * P.cuda_graph_pool_share)
        / GIB,
        reserve_gib=c.outside_gib(P)
        + P.memory_offset_gib
        + max(c.act_first, act_last, c.act_mid) * P.memory_fragmentation / GIB,
    )
