"""``predict``: step time, throughput and peak memory of one resolved trial.

An analytical model of Megatron-Core training (Transformer Engine layers, flash attention, distributed
optimizer or Megatron FSDP), per GPU:

* per layer and micro-batch: GEMMs (roofline sum at a fitted efficiency; FP8 speeds up GEMMs only),
  causal flash attention (bf16; backward 2.5x forward), memory-bound element-wise kernels (with FP8, the
  quantisation of GEMM inputs: :func:`fp8_quant_bytes`, more for MXFP8; with the architecture's dropout,
  hidden dropout's masks: ``HIDDEN_DROPOUT_BYTES``), tensor-parallel
  all-gather / reduce-scatter (sequence parallel) or all-reduce over NVLink, partly hidden by userbuffers,
  context-parallel KV ring partly hidden by attention, recompute (selective: core attention; full: the
  layer's forward);
* per micro-batch on the slowest pipeline stage: its layers, plus the logits GEMM and cross-entropy on the
  last stage;
* per step: ``(m + (p-1)/v)`` micro-batch slots (1F1B / interleaved bubble), pipeline send/recv, the
  data-parallel reduce-scatter + all-gather (distributed optimizer, once per step) or FSDP's per
  micro-batch all-gathers and reduce-scatter, hidden behind compute up to a fitted share, and the
  memory-bound Adam step. Collectives whose group leaves the NVLink domain use the scale-out bandwidth.

Memory (:func:`memory.peak_memory`): model states (:func:`memory.state_bytes_per_param`), activations of the
in-flight micro-batches of the first and last stage (:func:`memory.layer_activation_bytes`,
:func:`memory.inflight_chunks`), logits on the last stage, FSDP's unsharded layer buffers, a fixed reserve and
fragmentation.

Each term is one function below (:func:`layer_time` sums a layer's, :func:`step_time` a step's) of three values
computed once (:mod:`dse.perfmodel.layout`: the layout, one micro-batch's shape on one GPU, the GPU's rates);
a prediction carries them as a typed :class:`Breakdown`, readable by its flat ``time.*`` / ``mem.*`` keys too.

Layer placement: when ``num_layers`` is not divisible by ``pp·vp`` but ``num_layers + 2`` is, the embedding
and the loss count as one layer each (Megatron's ``account_for_embedding_in_pipeline_split`` and
``account_for_loss_in_pipeline_split``, used by NVIDIA's Llama 3.1 405B recipes).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dse.errors import UserError
from dse.facts import knobs
from dse.facts.containers import REFERENCE
from dse.facts.containers import resolve as resolve_container
from dse.facts.hardware import HARDWARE, GpuSpec
from dse.perfmodel import flops as _flops
from dse.perfmodel import moe as _moe
from dse.perfmodel.layout import (
    NVFP4_ELEMENT_BYTES,
    Machine,
    ModelLayout,
    Shape,
    Stages,
    attention_backend_run,
    container_host_factor,
    grad_bytes,
    machine_for,
    stages_of,
    uses_low_precision,
)
from dse.perfmodel.memory import MemoryCounts, MemoryUse, layer_activations, memory_counts, peak_memory
from dse.perfmodel.stack import NVIDIA_RECIPES, Stack, cross_entropy_bytes, payload_stack
from dse.perfmodel.timing import DEFAULT_PARAMS, Params


@dataclass(frozen=True, slots=True)
class StepTime:
    """Where one step's time goes (seconds), summed over its micro-batches on the slowest pipeline stage's
    layers; ``per_microbatch_s`` is one micro-batch slot of the schedule, ``bubble_fraction`` the bubble's share
    of the ideal time. The step time is ``microbatches · per_microbatch_s`` plus the per-step terms (bubble,
    pipeline send/recv, data parallel, optimizer, gradient accumulation, overhead)."""

    layer_compute_s: float
    host_wait_s: float
    tp_exposed_s: float
    ep_exposed_s: float
    cp_exposed_s: float
    recompute_s: float
    logits_s: float
    bubble_s: float
    pp_p2p_s: float
    dp_exposed_s: float
    optimizer_s: float
    grad_accumulation_s: float
    offload_exposed_s: float
    overhead_s: float
    per_microbatch_s: float
    microbatches: float
    bubble_fraction: float

    @property
    def step_s(self) -> float:
        """The step time: every micro-batch slot, then the per-step terms."""
        return (
            self.microbatches * self.per_microbatch_s
            + self.bubble_s
            + self.pp_p2p_s
            + self.dp_exposed_s
            + self.optimizer_s
            + self.grad_accumulation_s
            + self.overhead_s
        )


# The flat keys of a prediction's breakdown (`dse predict` prints them in this order, its JSON and the benches read
# them): (key, part of the breakdown, field)
BREAKDOWN_KEYS: tuple[tuple[str, str, str], ...] = tuple(
    [
        (f"time.{n}", "time", n)
        for n in (
            "layer_compute_s",
            "host_wait_s",
            "tp_exposed_s",
            "ep_exposed_s",
            "cp_exposed_s",
            "recompute_s",
            "logits_s",
            "bubble_s",
            "pp_p2p_s",
            "dp_exposed_s",
            "optimizer_s",
            "grad_accumulation_s",
            "offload_exposed_s",
            "overhead_s",
        )
    ]
    + [
        (f"mem.{n}", "memory", n)
        for n in (
            "states_gib",
            "activations_gib",
            "logits_gib",
            "fsdp_buffers_gib",
            "fp8_weight_cache_gib",
            "cuda_graphs_gib",
            "reserve_gib",
        )
    ]
    + [
        ("time.per_microbatch_s", "time", "per_microbatch_s"),
        ("microbatches", "time", "microbatches"),
        ("bubble_fraction", "time", "bubble_fraction"),
    ]
)
_BY_KEY = {key: (part, name) for key, part, name in BREAKDOWN_KEYS}


@dataclass(frozen=True, slots=True)
class Breakdown(Mapping[str, float]):
    """The typed breakdown of a prediction (``time``, ``memory``), read also as a mapping of the flat keys
    ``time.*``, ``mem.*``, ``microbatches`` and ``bubble_fraction`` (:data:`BREAKDOWN_KEYS`)."""

    time: StepTime
    memory: MemoryUse

    def __getitem__(self, key: str) -> float:
        part, name = _BY_KEY[key]
        return getattr(getattr(self, part), name)

    def __iter__(self) -> Iterator[str]:
        return iter(_BY_KEY)

    def __len__(self) -> int:
        return len(_BY_KEY)


@dataclass(frozen=True)
class Prediction:
    """What the model says about one trial. ``tflops_per_gpu`` is model FLOPs in the chosen convention."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    peak_memory_gib: float
    gpu_memory_gib: float
    fits: bool
    breakdown: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {
            k: getattr(self, k)
            for k in (
                "step_time_s",
                "tokens_per_s_per_gpu",
                "tflops_per_gpu",
                "peak_memory_gib",
                "gpu_memory_gib",
                "fits",
            )
        }
        out["breakdown"] = dict(self.breakdown)
        return out


def _exposed(comm: float, window: float) -> float:
    """The part of ``comm`` seconds of communication that ``window`` seconds of compute do not hide.

    ``comm²/(comm + window)``: nearly all of it when the window is short, about ``comm - window`` when it
    is much shorter than the communication, and a small remainder (first and last bucket) when it is long.
    """
    return comm * comm / (comm + window) if comm > 0.0 else 0.0


def _group_bw(members: float, stride: float, domain: int, nvl_Bps: float, nic_Bps: float) -> float:
    """Bus bandwidth of a ring collective over ``members`` ranks ``stride`` apart.

    Inside one NVLink domain: NVLink. Across domains NCCL runs one ring per NIC, so the inter-domain
    hops carry 1/k of the data where k group members share a domain: ``min(NVLink, k · NIC)``.
    """
    if members * stride <= domain:
        return nvl_Bps
    k = min(members, domain // stride) if stride < domain else 1
    return min(nvl_Bps, max(k, 1) * nic_Bps)


def unfused_score_bytes(dropout: bool) -> tuple[float, float]:
    """HBM bytes per attention-score element of unfused attention (bf16), forward and backward.

    Forward: QKᵀ writes the scores (2), the fused scale-mask-softmax reads and writes them (4), P·V reads
    the probabilities (2); dropout adds a read, a write and a 1-byte mask (5). Backward: dO·Vᵀ writes dP
    (2), softmax backward reads dP and P and writes dS (6), dS·K and dSᵀ·Q read dS (4), Pᵀ·dO reads P (2);
    dropout backward reads dP and the mask and writes (5). Flash attention keeps all of this in SRAM.
    """
    drop = 5.0 if dropout else 0.0
    return 8.0 + drop, 14.0 + drop


def local_score_bytes(dropout: bool) -> tuple[float, float]:
    """HBM bytes per attention-score element of Megatron's local attention (``attention_backend=local``:
    ``DotProductAttention`` and ``FusedScaleMaskSoftmax.forward_torch_softmax``, each step its own PyTorch kernel),
    forward and backward.

    Forward: Q·Kᵀ writes the bf16 scores (2), ``.float()`` reads them and writes fp32 (6), the in-place
    ``masked_fill_`` reads and writes (8), ``torch.softmax`` reads and writes fp32 (8), ``.bfloat16()`` reads fp32
    and writes bf16 (6), P·V reads the probabilities (2): 32. Backward: dO·Vᵀ writes dP and Pᵀ·dO reads P (4), the
    cast's backward reads bf16 and writes fp32 (6), the softmax's backward reads the gradient and the output and
    writes (12), ``masked_fill``'s backward reads and writes (8), the upcast's backward reads fp32 and writes bf16
    (6), dS·K and dSᵀ·Q read dS (4): 40. Attention dropout adds PyTorch's ``native_dropout`` on the probabilities
    (read, write, 1-byte mask: 5) and its backward (5)."""
    drop = 5.0 if dropout else 0.0
    return 32.0 + drop, 40.0 + drop


# HBM bytes per element of the MLP's intermediate (bf16, per token, forward + backward) that NVIDIA's Nemotron
# providers' eager squared ReLU (recipes.models.ModelArch.activation) moves beyond a fused activation's 12:
# forward relu (read 2, write 2) and pow (2, 2) = 8; backward autograd's pow_backward, grad * (2 * r.pow(1)):
# pow (2, 2), scale (2, 2), multiply (4, 2) = 14, and relu's threshold_backward (4, 2) = 6; 28 - 12 = 16. Its
# saved tensors (relu's output, shared by both backward functions) take the place of the fused kernel's input,
# so the activation memory does not change.
SQUARED_RELU_EXTRA_BYTES = 16.0


def local_spec_bytes(shape: Shape) -> float:
    """HBM bytes per token of one layer, forward + backward, that Megatron-Core's local layer spec
    (``get_gpt_layer_local_spec``, ``attention_backend=local``; the fusions off, as recipes.mcore builds it) moves
    beyond the fused kernels :func:`elementwise_time` counts, bf16 throughout; the scores are
    :func:`local_score_bytes`.

    - RMSNorm (``torch.nn.RMSNorm``): PyTorch's own fused kernel (``_fused_rms_norm``; it accumulates in fp32 in
      registers, nothing fp32 goes through HBM), whose backward computes the weight gradient in a second kernel that
      reads the gradient and the input again: 4 per hidden element, two norms.
    - RoPE on q and k (``_apply_rotary_pos_emb_bshd``, eager): forward ``t * cos`` (read 2, write 2), the rotated
      half's negation (2 per element of t), its ``cat`` (4), ``* sin`` (4), the sum (read 4, write 2) and the final
      ``cat`` with the empty pass-through part (4) = 24; backward the two products (4 + 4), the negation (2), the
      chunk's ``cat`` (4), the two gradients summed (6), the slice's zero-filled gradient and copy (6) = 26; 50 less
      a fused kernel's 8 (read 2, write 2 each way): 42 per element of q and of k.
    - SwiGLU (``silu(x1) * x2`` over ``torch.chunk``): forward silu (4) and the product (6) = 10; backward the
      product's two gradients (6 + 6), silu's (6) and the chunk's ``cat`` into the fc1 gradient (8) = 26; 36 less a
      fused kernel's 16: 20 per element of the intermediate. GeLU is one eager kernel, as fused: 0.
    - Grouped-query attention: K and V repeated to every head (``repeat_interleave``: read 2 per group element,
      write 2 per head element) and its backward (zero-fill 2 per group element, read 2 per head element, add into
      the groups: read 2, write 2): 4 per head element and 8 per group element, for K and for V.
    - The context's ``permute(...).contiguous()`` and the gradient's copy back: 8 per head element.
    """
    arch, t = shape.arch, shape.tp
    a, d = arch.num_attention_heads / t, shape.head_dim
    g = shape.kv_groups
    nbytes = 2.0 * 4.0 * shape.hidden_sp + 42.0 * (a + g) * d + 8.0 * a * d
    if arch.gated_mlp:
        nbytes += 20.0 * arch.ffn_hidden_size / t
    if g < a:
        nbytes += 2.0 * (4.0 * a * d + 8.0 * g * d)
    return nbytes


# HBM bytes per hidden element per token that hidden dropout (ModelArch.dropout > 0) adds to a layer's forward +
# backward: each of the two fused bias-dropout-add kernels writes a 1-byte mask forward and its backward reads it
# (2 x (1 + 1)); attention dropout is priced where the scores go through HBM (unfused_score_bytes) and not inside
# flash attention, whose kernels draw the mask in SRAM from a Philox generator
HIDDEN_DROPOUT_BYTES = 4.0


def cp_merge_bytes(c: int) -> tuple[float, float, float]:
    """HBM bytes that Transformer Engine's context-parallel P2P ring attention (``AttnFuncWithCPAndKVP2P``,
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) moves beyond one flash
    attention call, for ``c`` ring steps: (forward per element of Q / O, backward per element of Q, backward per
    element of K and of V), bf16.

    Forward: each step's kernel writes its own partial output (2 B, c - 1 more than one call); the first is
    rescaled by its log-sum-exp into ``out`` (``flash_attn_fwd_out_correction_init``: read 2, write 2) and each
    later one added to it (``flash_attn_fwd_out_correction``: read 2 + 2, write 2): 8(c-1) + 4. Backward: each
    step's kernel reads Q, O and dO again (6) and writes its dQ (2), which is copied into the dQ buffer (4) and
    then added (``dq.add_``: 6): 14(c-1) + 4; dK and dV likewise: written per step (2) and accumulated
    (4, then 6): 8(c-1) + 4. Every step is counted at full size: the causal split makes the later steps of the
    low ranks half-size, but the last rank's are all full, and the ring waits for it. Nothing for c = 1.
    """
    if c <= 1:
        return 0.0, 0.0, 0.0
    return 8.0 * (c - 1) + 4.0, 14.0 * (c - 1) + 4.0, 8.0 * (c - 1) + 4.0


MX_BLOCK = 32  # MXFP8 (OCP Microscaling spec v1.0): one E8M0 scale byte per 32 elements along K


def fp8_quant_bytes(fp8_recipe: str) -> float:
    """HBM bytes per GEMM input element that FP8 quantisation adds to a layer's forward + backward.

    Delayed scaling (``delayed``) and FP8 block scaling (``blockwise``): 4 B, the model's long-standing figure (read
    the bf16 value, 2 B; write one FP8 copy, 1 B; the amax / scale bookkeeping, about 1 B): the cast kernel takes the
    scale from the amax history and records the new amax as it casts, or scales each block from its own values, in
    one pass. Per-tensor current scaling (``tensorwise``) needs the tensor's amax before it can cast: Transformer
    Engine's ``Float8CurrentScalingQuantizer`` runs ``nvte_compute_amax`` over the input, then the cast
    (``nvte_quantize_v2``), so the bf16 input is read once more, 2 B (transformer_engine/pytorch/csrc/quantizer.cpp,
    ``quantize_impl``; a norm or activation that computes the amax as it writes its bf16 output still writes it and
    has it read back, the same 2 B more than writing FP8 directly). MXFP8 scales 32-element blocks along the GEMM's
    K dimension, so the transposed use of an operand (wgrad, dgrad) cannot reuse the row-wise copy: Transformer
    Engine writes a second, column-wise FP8 copy (1 B) and both copies carry E8M0 scales (1 B per 32 elements each).
    """
    if fp8_recipe == "mxfp8":
        return 4.0 + 1.0 + 2.0 / MX_BLOCK
    if fp8_recipe == "tensorwise":
        return 4.0 + CURRENT_SCALING_AMAX_BYTES
    return 4.0


# the current-scaling amax pass: one more read of each bf16 GEMM input (fp8_quant_bytes)
CURRENT_SCALING_AMAX_BYTES = 2.0


def nvfp4_quant_bytes() -> float:
    """HBM bytes per GEMM input element that NVFP4 quantisation adds to a layer's forward + backward (Transformer
    Engine's NVFP4BlockScaling, docs/features/low_precision_training/nvfp4): its global scale is a current-scaling
    amax, so each bf16 input is read once for the amax (2 B) and once by the row-wise cast (2 B), which writes the
    E2M1 values and 16-element E4M3 scales (:data:`NVFP4_ELEMENT_BYTES`); the wgrad GEMM takes a separate column-wise
    copy through the 16x16 random Hadamard transform, with its own amax: read twice more (4 B) and written once.
    Stochastic rounding (gradients) and 2D 16x16 weight scales change no byte count; the Hadamard transform's 16-wide
    products are folded into its pass (they run at a small fraction of the tensor-core rate)."""
    return 2.0 * 2.0 + NVFP4_ELEMENT_BYTES + 2.0 * 2.0 + NVFP4_ELEMENT_BYTES


def quant_bytes(layout: ModelLayout, machine: Machine) -> float:
    """HBM bytes per GEMM input element of the layout's quantisation: NVFP4's or its FP8 recipe's."""
    return nvfp4_quant_bytes() if machine.fp4 else fp8_quant_bytes(layout.fp8_recipe)


# ---- one transformer layer, one micro-batch, on this GPU ---------------------------------------------------------


# The output tile of one thread block of a training GEMM, square: 128 x 128, CUTLASS 3.x's default tile for its sm90
# warp-specialised GEMMs (cuBLAS picks among several tiles per shape; one tile for all is the model's simplification).
# Chosen with the published rows in view: a 128 x 256 tile fits them worse (bench/README.md has both)
GEMM_TILE = 128.0


def wave_utilisation(rows: float, cols: float, sms: int) -> float:
    """The share of the GPU's SMs a GEMM with a ``rows`` x ``cols`` output keeps busy: its output tiles
    (:data:`GEMM_TILE` square) run one per SM at a time, in waves, so a GEMM of few tiles, or of a tile count just past
    a multiple of the SMs, leaves SMs idle in its last wave (132 SMs on H100: 36 tiles use 27% of them, 140 tiles 53%).
    1 for a GPU whose SM count is unknown (``GpuSpec.sms`` 0)."""
    if sms <= 0:
        return 1.0
    tiles = math.ceil(rows / GEMM_TILE) * math.ceil(cols / GEMM_TILE)
    return tiles / (math.ceil(tiles / sms) * sms)


def linear_shapes(shape: Shape) -> tuple[tuple[float, float, bool], ...]:
    """The layer's four linear layers on this GPU, QKV, projection, fc1, fc2, as (K, N, whether the gradient of the
    output is all-gathered before the dgrad GEMM): the row-parallel projection and fc2 reduce-scatter their output
    under sequence parallelism, so their output gradient is gathered; the column-parallel QKV and fc1 gather their
    input instead."""
    arch, t, h = shape.arch, shape.tp, shape.arch.hidden_size
    a, d, F = arch.num_attention_heads, shape.head_dim, arch.ffn_hidden_size
    return ((h, shape.qkv_cols, False), (a * d / t, h, True), (h, shape.fc1_cols, False), (F / t, h, True))


def gemm_chunk_rows(shape: Shape, layout: ModelLayout) -> float:
    """The rows of one GEMM call of a pass that overlaps a TP collective: with userbuffers (``tp_comm_overlap``)
    Transformer Engine splits each all-gather + GEMM and GEMM + reduce-scatter into one GEMM per TP rank's chunk of
    the tokens (the ring-exchange overlap of NeMo's and Megatron-Bridge's presets; their pipelined reduce-scatters
    split into 4, taken as TP chunks too), T / tp rows each; otherwise one GEMM over the micro-batch's T tokens."""
    t = shape.tp
    return shape.tokens / t if (layout.tp_comm_overlap and t > 1) else shape.tokens


def _gemm_bytes(shape: Shape, machine: Machine, linears: tuple[tuple[float, float, bool], ...]) -> float:
    """One pass's HBM bytes of ``linears``: their inputs and weights at the GEMM's input width, bf16 outputs."""
    T, g_in = shape.tokens, machine.gemm_input_bytes
    return sum((T * k + k * n) * g_in + 2.0 * T * n for k, n, _ in linears)


# cached: the waves depend on the shapes and the GPU alone, and a fit or a grid evaluates the same layer many times
@functools.lru_cache(maxsize=4096)
def _wave_flops(
    T: float, rows: float, sms: int, linears: tuple[tuple[float, float, bool], ...], backward: bool
) -> float:
    """The FLOPs of ``linears`` over ``T`` tokens, each GEMM's divided by the share of the SMs its waves keep busy
    (:func:`wave_utilisation`): forward their ``rows`` x N outputs; backward the dgrad's (``rows`` x K where the
    output gradient is gathered by a TP overlap, else T x K) and the wgrad's K x N."""
    if not backward:
        return sum(2.0 * T * k * n / wave_utilisation(rows, n, sms) for k, n, _ in linears)
    flops = 0.0
    for k, n, gathered in linears:
        flops += 2.0 * T * k * n / wave_utilisation(rows if gathered else T, k, sms)
        flops += 2.0 * T * k * n / wave_utilisation(k, n, sms)
    return flops


def gemm_forward_time(shape: Shape, machine: Machine, chunk_rows: float | None = None, mlp_only: bool = False) -> float:
    """The layer's four GEMMs (QKV, projection, fc1, fc2), or with ``mlp_only`` fc1 and fc2, forward: FLOPs at the
    GEMM rate over the SMs their waves keep busy (:func:`wave_utilisation` of a ``chunk_rows`` x N output, the
    micro-batch's tokens unless a TP overlap splits them: :func:`gemm_chunk_rows`) plus their inputs, weights and
    outputs through HBM (a roofline sum)."""
    rows = shape.tokens if chunk_rows is None else chunk_rows
    linears = linear_shapes(shape)[2:] if mlp_only else linear_shapes(shape)
    flops = _wave_flops(shape.tokens, rows, machine.gpu.sms, linears, False)
    return flops / machine.gemm_rate + _gemm_bytes(shape, machine, linears) / machine.hbm_Bps


def gemm_backward_time(shape: Shape, machine: Machine, chunk_rows: float | None = None) -> float:
    """The layer's GEMMs backward: per linear layer the dgrad (output T x K; split into ``chunk_rows`` chunks where
    the output gradient is gathered by a TP overlap) and the wgrad (output K x N, summed over the tokens), each as
    many FLOPs as the forward, over the SMs their waves keep busy; twice the forward's bytes through HBM."""
    rows = shape.tokens if chunk_rows is None else chunk_rows
    linears = linear_shapes(shape)
    flops = _wave_flops(shape.tokens, rows, machine.gpu.sms, linears, True)
    return flops / machine.gemm_rate + 2.0 * _gemm_bytes(shape, machine, linears) / machine.hbm_Bps


def unfused_attention_time(shape: Shape, layout: ModelLayout, machine: Machine) -> tuple[float, float]:
    """Megatron's unfused / local core attention, (forward, forward + backward): two batched GEMMs over the full
    s×s score matrix (the causal mask is applied after QKᵀ, so nothing is skipped), and the scores go through HBM
    between kernels: scale-mask-softmax, dropout, and their backward (bytes per score element,
    :func:`unfused_score_bytes` for Transformer Engine's fused softmax kernel; :func:`local_score_bytes` for the
    local spec's step-by-step PyTorch ops, generic element-wise kernels that move their bytes at the rate the
    model's other element-wise kernels do, ``elementwise_scale``)."""
    P, t, T, s = machine.params, shape.tp, shape.tokens, shape.seq_length
    a, d = shape.arch.num_attention_heads, shape.head_dim
    scores = shape.mbs * (a / t) * s * s / shape.cp  # score elements per micro-batch on this GPU
    attn_gemm = 4.0 * T * s * (a / t) * d / machine.bf16_gemm_rate
    if layout.attention_backend == "local":
        fwd_b, bwd_b = local_score_bytes(layout.dropout)
        scale = P.unfused_scores_scale * P.elementwise_scale
    else:
        fwd_b, bwd_b = unfused_score_bytes(layout.dropout)
        scale = P.unfused_scores_scale
    forward = attn_gemm + scores * fwd_b * scale / machine.hbm_Bps
    return forward, 3.0 * attn_gemm + scores * (fwd_b + bwd_b) * scale / machine.hbm_Bps


def flash_attention_time(shape: Shape, machine: Machine) -> tuple[float, float]:
    """Causal flash attention, (forward, forward + backward): the tensor cores at the fitted attention efficiency
    (times :func:`dse.perfmodel.moe.attention_head_efficiency` for heads below 128, as GPT-OSS's 64)
    (backward 2.5x the forward's GEMMs: it recomputes the scores), the softmax's exponentials on the special
    function units, and with context parallelism the ring's partial outputs and gradients merged through HBM
    (:func:`cp_merge_bytes`)."""
    P, t, T, s, c = machine.params, shape.tp, shape.tokens, shape.seq_length, shape.cp
    a, d, hbm = shape.arch.num_attention_heads, shape.head_dim, machine.hbm_Bps
    # causal: half of 4·T·s·a·d, at the fitted efficiency times that of the model's head size
    eff = machine.attn_eff * _moe.attention_head_efficiency(shape.arch)
    attn_tc = 2.0 * T * s * (a / t) * d / (machine.bf16_peak * eff)
    # the softmax's exponentials on the special function units, in series with the tensor cores where the
    # GPU table gives their rate: one per causal score element (T·s·a/2t) forward, one more backward
    sfu = machine.gpu.sfu_exp_tera_per_s
    attn_exp = 0.5 * T * s * (a / t) / (sfu * 1e12) if sfu else 0.0
    merge_fwd = merge_bwd = 0.0
    if c > 1:
        q_fwd_b, q_bwd_b, kv_bwd_b = cp_merge_bytes(c)
        merge_fwd = T * (a / t) * d * q_fwd_b * P.elementwise_scale / hbm
        merge_bwd = T * d * ((a / t) * q_bwd_b + 2.0 * shape.kv_groups * kv_bwd_b) * P.elementwise_scale / hbm
    return attn_tc + attn_exp + merge_fwd, 3.5 * attn_tc + 2.0 * attn_exp + merge_fwd + merge_bwd


def attention_time(shape: Shape, layout: ModelLayout, machine: Machine) -> tuple[float, float]:
    """Core attention of one layer, (forward, forward + backward), by the layout's attention backend."""
    if layout.unfused_attention:
        return unfused_attention_time(shape, layout, machine)
    return flash_attention_time(shape, machine)


def elementwise_time(shape: Shape, layout: ModelLayout, machine: Machine, stack: Stack) -> float:
    """Memory-bound element-wise kernels of one layer, forward + backward: norms, RoPE, the activation, casts,
    residual adds; the eager squared ReLU's extra passes, hidden dropout's masks, the local layer spec's eager
    kernels (:func:`local_spec_bytes`) and FP8's quantisation of the GEMM inputs where they run."""
    arch, t = shape.arch, shape.tp
    a, g, d, F = arch.num_attention_heads, arch.num_query_groups, shape.head_dim, arch.ffn_hidden_size
    h_sp = shape.hidden_sp
    elem_bytes = 60.0 * h_sp + 12.0 * (a + g) * d / t + (18.0 if arch.gated_mlp else 12.0) * F / t
    if stack.arch_activation and arch.activation == "squared_relu":
        elem_bytes += SQUARED_RELU_EXTRA_BYTES * F / t
    if layout.attention_backend == "local":  # the local layer spec's eager RoPE, SwiGLU, GQA repeat
        elem_bytes += local_spec_bytes(shape)
    if layout.dropout:  # hidden dropout in the two bias-dropout-add kernels: 1-byte masks (HIDDEN_DROPOUT_BYTES)
        elem_bytes += HIDDEN_DROPOUT_BYTES * h_sp
    if machine.fp8:
        gemm_inputs = 2 * h_sp + (a * d + F + (a + 2 * g) * d) / t + shape.fc1_cols
        elem_bytes += quant_bytes(layout, machine) * gemm_inputs
    return shape.tokens * elem_bytes * machine.params.elementwise_scale / machine.hbm_Bps


def tp_collective_time(shape: Shape, machine: Machine) -> float:
    """One tensor-parallel all-gather or reduce-scatter (sequence parallel) of the layer's activations, or half
    an all-reduce; 0 without tensor parallelism."""
    t = shape.tp
    if t <= 1:
        return 0.0
    return (t - 1) / t * shape.tokens * shape.arch.hidden_size * 2.0 / machine.link_Bps(t) + machine.latency_s


def tp_hidden_share(layout: ModelLayout, params: Params) -> float:
    """The share of TP communication hidden behind GEMMs: userbuffers' (``tp_comm_overlap``) or Megatron's own
    overlap of the backward all-gather / dgrad reduce with wgrad."""
    return params.tp_overlap if (layout.tp_comm_overlap and layout.tp > 1) else params.tp_overlap_base


def cp_exposed_time(shape: Shape, machine: Machine, attention_fwd_bwd: float) -> float:
    """The context-parallel ring's exposed time: K and V go round the ring forward; K, V and their gradients
    backward, partly hidden behind attention; 0 without context parallelism."""
    c = shape.cp
    if c <= 1:
        return 0.0
    kv_bytes = shape.tokens * 2.0 * shape.kv_groups * shape.head_dim * 2.0
    cp_comm = 3.0 * (c - 1) * (kv_bytes / machine.link_Bps(shape.tp * c) + machine.latency_s)
    return _exposed(cp_comm, machine.params.cp_overlap * attention_fwd_bwd)


def mlp_gemm_forward_time(shape: Shape, machine: Machine, chunk_rows: float | None = None) -> float:
    """The MLP's two GEMMs (fc1, fc2), forward: the fc1/fc2 part of :func:`gemm_forward_time`."""
    return gemm_forward_time(shape, machine, chunk_rows, mlp_only=True)


def selective_recompute_time(
    shape: Shape, layout: ModelLayout, machine: Machine, attention_fwd: float, tp_one: float, tp_hidden: float
) -> float:
    """What selective recompute repeats in the backward pass, module by module (Megatron-Core's
    ``recompute_modules``): ``core_attn`` core attention's forward; ``mlp`` the MLP's forward (its two GEMMs, the
    activation through HBM, with FP8 the requantisation of their inputs, and with sequence parallelism its
    all-gather and reduce-scatter, hidden as the layer's are). ``layernorm`` costs nothing on a dense layer:
    Transformer Engine's layer spec fuses both norms into the next linear (``input_layernorm`` and
    ``pre_mlp_layernorm`` are ``IdentityOp``), and Megatron-Core recomputes a norm only when it is a module of its
    own (``TransformerLayer.__init__``: ``if not isinstance(self.input_layernorm, IdentityOp)``); NVIDIA's scripts
    use it on MoE models, whose pre-MLP norm feeds the router. The MoE modules (``moe_act``, ``moe``,
    ``shared_experts``) and ``mla_up_proj`` recompute parts of MoE and MLA layers: a dense model has none, so they
    cost nothing here (the constraints refuse them on a dense model)."""
    P, T, t = machine.params, shape.tokens, shape.tp
    F = shape.arch.ffn_hidden_size
    total = attention_fwd if layout.recomputes("core_attn") else 0.0
    if layout.recomputes("mlp") and not shape.arch.num_experts:  # Megatron-Core recomputes no MoE layer for "mlp"
        act_bytes = (6.0 if shape.arch.gated_mlp else 4.0) * F / t  # SwiGLU reads 2F, writes F; else F in, F out
        if machine.fp8:
            act_bytes += 3.0 * (shape.hidden_sp + F / t)  # fc1 and fc2 inputs cast again (read 2, write 1)
        collectives = 2.0 * tp_one * (1.0 - tp_hidden) if layout.sp else 0.0
        total += mlp_gemm_forward_time(shape, machine, gemm_chunk_rows(shape, layout))
        total += T * act_bytes * P.elementwise_scale / machine.hbm_Bps
        total += collectives
    return total


def recompute_time(
    shape: Shape,
    layout: ModelLayout,
    machine: Machine,
    gemm_fwd: float,
    attention_fwd: float,
    elementwise: float,
    tp_one: float,
    tp_hidden: float,
) -> float:
    """The forward work that recompute repeats in the backward pass: the selected modules (selective,
    :func:`selective_recompute_time`), or the layer's forward (full) for ``recompute_num_layers`` of a model
    chunk's layers (all when 0)."""
    if layout.recompute == "selective":
        return selective_recompute_time(shape, layout, machine, attention_fwd, tp_one, tp_hidden)
    if layout.recompute != "full":
        return 0.0
    chunk_layers = shape.arch.num_layers / (shape.pp * shape.vp)
    n = layout.recompute_num_layers
    frac = min(n / chunk_layers, 1.0) if n else 1.0
    return frac * (gemm_fwd + attention_fwd + elementwise / 3.0 + 4.0 * tp_one * (1.0 - tp_hidden))


def host_layer_time(machine: Machine, layout: ModelLayout) -> float:
    """The host's (CPU's) time to launch one layer's kernels for one micro-batch, outside CUDA graphs.

    Every kernel of a layer is launched by Python (TE's modules, autograd, Megatron's hooks), and the GPU cannot
    run ahead of its launches, so a layer takes at least the host's time for it. Grace costs ~2.75x an x86 host
    per PyTorch op (TransformerEngine issue 2053: 37.08 vs 13.48 µs on a Xeon 8480C); on x86 the host time stays
    under the layers the model is used for (the H200 TE runs, bench/h200_te_runs.py, are within 6.2% at 3.4 ms
    layers), so the term applies to Grace hosts only. A CUDA graph replays its captured launches in one call: the
    share of the layer that the graph's scope captures (``ModelLayout.graph_share``: the knobs ``cuda_graph`` and
    ``cuda_graph_scope``) costs the host nothing. The container family scales the time (``container_host_factor``:
    a newer Transformer Engine / Megatron-Core issues fewer launches and less Python per layer).
    """
    if not machine.gpu.grace_host:
        return 0.0
    factor = container_host_factor(machine.params, layout.container)
    return machine.params.host_layer_s_grace * factor * (1.0 - layout.graph_share)


@dataclass(slots=True)
class LayerTime:
    """One transformer layer, one micro-batch, on this GPU (seconds). ``compute``: the GEMMs forward and backward,
    attention, element-wise kernels and a fixed overhead; ``tp_collective``: one TP collective, of which
    ``tp_hidden`` is hidden; ``host_wait``: what the layer waits for the host beyond its GPU time."""

    gemm_forward: float
    attention_forward: float
    attention_forward_backward: float
    elementwise: float
    compute: float
    tp_collective: float
    tp_hidden: float
    tp_exposed: float
    cp_exposed: float
    recompute: float
    host_wait: float
    ep_exposed: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.tp_exposed + self.cp_exposed + self.recompute + self.host_wait + self.ep_exposed


def moe_layer_time(shape: Shape, layout: ModelLayout, machine: Machine, stack: Stack) -> LayerTime:
    """The terms of one MoE / MLA layer (:mod:`dse.perfmodel.moe`): the dense layer's with the GEMMs and
    element-wise kernels of attention (GQA or MLA), shared and routed experts, plus the router, the permutation,
    a MoE layer's fixed overhead, the MoE / MLA recompute modules (:func:`dse.perfmodel.moe.moe_recompute_forward`)
    and the token exchanges left exposed (``ep_exposed``)."""
    P = machine.params
    m = _moe.moe_layer_time(shape, layout, machine)
    attn_fwd, attn_fb = attention_time(shape, layout, machine)
    # the launch gaps a CUDA graph's scope captures (attn, moe_router, moe_preprocess: ModelLayout.graph_share)
    # run back to back, as on a dense layer; of the MoE layer's own small kernels, the router's and the
    # dispatcher's preprocessing share (moe.moe_overhead_graphed_share), not the exchange's or the permutation's
    overhead = P.layer_overhead_s * (1.0 - layout.graph_share)
    compute = 3.0 * m.gemm_forward + attn_fb + m.elementwise + m.router + m.permute + overhead
    if shape.arch.num_experts:
        compute += P.moe_layer_overhead_s * (1.0 - _moe.moe_overhead_graphed_share(layout))
    tp_one = tp_collective_time(shape, machine)
    tp_hidden = tp_hidden_share(layout, P)
    tp_exposed = _moe.tp_collectives_per_layer(shape.arch) * tp_one * (1.0 - tp_hidden)
    cp_exposed = cp_exposed_time(shape, machine, attn_fb)
    rec = recompute_time(shape, layout, machine, m.gemm_forward, attn_fwd, m.elementwise, tp_one, tp_hidden)
    rec += _moe.moe_recompute_forward(shape, layout, machine)
    busy = compute + tp_exposed + cp_exposed + rec + m.a2a_exposed
    host_wait = max(0.0, host_layer_time(machine, layout) - busy)
    if shape.arch.num_experts:
        # the forward's share of the layer: its GEMMs and attention, a third of the rest, half the exchanges
        fwd = m.gemm_forward + attn_fwd + (compute - 3.0 * m.gemm_forward - attn_fb) / 3.0
        fwd += (tp_exposed + m.a2a_exposed) / 2.0 + cp_exposed / 3.0
        bwd_wait = _moe.moe_backward_host_wait(shape, layout, machine, busy - fwd)
        host_wait = max(host_wait, _moe.moe_sync_wait(shape, layout, machine, fwd) + bwd_wait)
        host_wait = max(host_wait, _moe.moe_host_layer_wait(shape, layout, machine, busy))
    return LayerTime(
        m.gemm_forward,
        attn_fwd,
        attn_fb,
        m.elementwise,
        compute,
        tp_one,
        tp_hidden,
        tp_exposed,
        cp_exposed,
        rec,
        host_wait,
        m.a2a_exposed,
    )


def layer_time(shape: Shape, layout: ModelLayout, machine: Machine, stack: Stack) -> LayerTime:
    """The terms of one layer: compute, TP and CP communication left exposed, recompute, and the wait for the host."""
    if _moe.moe_arch(shape.arch):
        return moe_layer_time(shape, layout, machine, stack)
    P = machine.params
    rows = gemm_chunk_rows(shape, layout)
    gemm_fwd = gemm_forward_time(shape, machine, rows)
    gemm_bwd = gemm_backward_time(shape, machine, rows)
    attn_fwd, attn_fb = attention_time(shape, layout, machine)
    elem = elementwise_time(shape, layout, machine, stack)
    # the fixed per-layer overhead is launch gaps and small kernels: a graph replays the part it captures back to back
    compute = gemm_fwd + gemm_bwd + attn_fb + elem + P.layer_overhead_s * (1.0 - layout.graph_share)
    # tensor parallel: 4 all-gather/reduce-scatter (or 2 all-reduce) forward and as many backward
    tp_one = tp_collective_time(shape, machine)
    tp_hidden = tp_hidden_share(layout, P)
    tp_exposed = 8.0 * tp_one * (1.0 - tp_hidden)
    cp_exposed = cp_exposed_time(shape, machine, attn_fb)
    rec = recompute_time(shape, layout, machine, gemm_fwd, attn_fwd, elem, tp_one, tp_hidden)
    host_wait = max(0.0, host_layer_time(machine, layout) - (compute + tp_exposed + cp_exposed + rec))
    return LayerTime(
        gemm_fwd, attn_fwd, attn_fb, elem, compute, tp_one, tp_hidden, tp_exposed, cp_exposed, rec, host_wait
    )


def offload_time(shape: Shape, layout: ModelLayout, machine: Machine, layer_s: float, layer_bytes: float) -> float:
    """Activation offloading's exposed copy time per micro-batch (Megatron-Core cpu_offloading; pp=1 and no
    recompute, see dse.rules.constraints): each offloaded layer's activations (``layer_bytes``) go to host memory during
    its forward and come back during its backward, one layer ahead (Transformer Engine's double-buffered offload
    handler), behind that layer's compute (``layer_s``)."""
    P = machine.params
    n_off = min(layout.cpu_offload_layers, shape.arch.num_layers)
    t_copy = layer_bytes / (machine.gpu.host_link_gbps * 1e9 * P.host_link_eff)
    return n_off * (
        max(0.0, t_copy - P.offload_overlap * layer_s / 3.0)
        + max(0.0, t_copy - P.offload_overlap * 2.0 * layer_s / 3.0)
    )


# ---- stages, pipeline, data parallel and optimizer, per step -----------------------------------------------------


def logits_time(shape: Shape, layout: ModelLayout, machine: Machine, stack: Stack, tp_one: float) -> float:
    """The last stage's output layer per micro-batch: the logits GEMM (bf16, forward and backward), the payload's
    loss through HBM, and with sequence parallelism the gather of its input and the scatter of its gradient."""
    arch, t, T, P = shape.arch, shape.tp, shape.tokens, machine.params
    h, V = arch.hidden_size, arch.vocab_size
    logits_flops = 2.0 * T * h * V / t
    logits_gemm = (
        logits_flops / machine.bf16_gemm_rate + ((T * h + h * V / t) * 2.0 + 2.0 * T * V / t) / machine.hbm_Bps
    )
    ce = T * V / t * cross_entropy_bytes(stack) * P.elementwise_scale / machine.hbm_Bps  # the payload's loss
    return 3.0 * logits_gemm + ce + (2.0 * tp_one if layout.sp and t > 1 else 0.0)


def microbatch_time(shape: Shape, stages: Stages, layer_s: float, logits_s: float, offload_s: float) -> float:
    """One micro-batch slot of the schedule: the slowest stage's layers, with the logits on the last stage and the
    offload copies (pp=1 only) on the first."""
    if shape.pp == 1:
        return stages.first_layers * layer_s + logits_s + offload_s
    return max(
        stages.mid_layers * layer_s, stages.last_layers * layer_s + logits_s, stages.first_layers * layer_s + offload_s
    )


def pipeline_p2p_time(shape: Shape, machine: Machine, microbatch_s: float) -> float:
    """Pipeline send/recv per step: 1F1B sends and receives between micro-batches (blocking); the interleaved
    schedule overlaps them with the next chunk's compute (Megatron's overlap_p2p_comm), hiding all but a
    remainder; plus the warm-up and cool-down hops."""
    p, v, m = shape.pp, shape.vp, shape.microbatches
    if p <= 1:
        return 0.0
    stride = shape.tp * shape.cp * shape.data_parallel
    pp_bw = machine.nvlink_Bps if stride < machine.nvlink_domain else machine.nic_Bps  # one link or one NIC
    t_p2p = shape.tokens * shape.hidden_sp * 2.0 / pp_bw + machine.latency_s
    per = _exposed(t_p2p, microbatch_s / (3.0 * v)) if v > 1 else t_p2p
    return 2.0 * m * v * per + 2.0 * (p - 1) * t_p2p


def dp_exposed_time(
    shape: Shape, layout: ModelLayout, machine: Machine, stages: Stages, microbatch_s: float, grad_b: float
) -> float:
    """Data-parallel communication left exposed per step, over the data- and context-parallel ranks: with the
    distributed optimizer a reduce-scatter of gradients and an all-gather of bf16 weights once per step; with
    FSDP all-gathers of the weights forward and backward and a reduce-scatter per micro-batch; hidden behind
    compute up to a fitted share (Params.dp_overlap), the distributed optimizer's weight all-gather only with
    ``overlap_param_gather``. With ``nccl_ub`` a group inside one NVLink domain runs at
    NVLink SHARP's bandwidth (Params.nccl_ub_nvls_gain)."""
    d_r = shape.data_parallel * shape.cp
    if d_r <= 1:
        return 0.0
    P, t, lat = machine.params, shape.tp, machine.latency_s
    p_local = stages.stage_params / t
    dp_bw = _group_bw(d_r, t, machine.nvlink_domain, machine.nvlink_Bps, machine.nic_Bps)
    if layout.nccl_ub and d_r * t <= machine.nvlink_domain:  # registered buffers: NVLink SHARP inside the domain
        dp_bw *= P.nccl_ub_nvls_gain
    # seconds per byte of a GPU's share: the ring at the group's bandwidth, plus what crossing pods adds
    per_byte = (d_r - 1) / d_r / dp_bw + pod_crossing_s_per_byte(shape, layout, machine, d_r)
    if layout.fsdp:
        comm_mb = per_byte * p_local * (4.0 + grad_b) + 3 * shape.arch.num_layers / shape.pp * lat
        return shape.microbatches * _exposed(comm_mb, P.dp_overlap * microbatch_s)
    comm = per_byte * p_local * (2.0 + grad_b) + 2 * lat
    comm += expert_dp_time(shape, layout, machine, stages, grad_b)
    if layout.overlap_param_gather:
        return _exposed(comm, P.dp_overlap * microbatch_s)
    # Without overlap_param_gather Megatron-Core's distributed optimizer all-gathers the updated weights right after
    # its step, before the next forward can start (DistributedOptimizer.step_with_ready_grads, megatron/core/
    # optimizer/distrib_optimizer.py: "If not overlapping all-gather for parameters, launch synchronous all-gather
    # communication calls here"; with it, the next forward's pre-hooks launch them bucket by bucket): the weights'
    # share of the traffic, 2 of each parameter's 2 + grad_b bytes, is exposed whole.
    gather = comm * 2.0 / (2.0 + grad_b)
    return _exposed(comm - gather, P.dp_overlap * microbatch_s) + gather


def expert_dp_time(shape: Shape, layout: ModelLayout, machine: Machine, stages: Stages, grad_b: float) -> float:
    """The routed experts' gradient reduce-scatter and weight all-gather over the expert-data-parallel group
    (``world / (pp·ep·etp)`` ranks, ``ep·etp`` apart), once per step; 0 for a dense model."""
    experts = _moe.expert_stages(shape.arch, layout, stages)
    d_e = experts.data_parallel
    if not experts.largest or d_e <= 1:
        return 0.0
    stride = layout.ep * layout.etp
    bw = _group_bw(d_e, stride, machine.nvlink_domain, machine.nvlink_Bps, machine.nic_Bps)
    return (d_e - 1) / d_e * experts.largest * (2.0 + grad_b) / bw + 2 * machine.latency_s


def dp_group_span(shape: Shape, layout: ModelLayout) -> float:
    """Consecutive GPUs one data-parallel group (with its context-parallel ranks) spans: ``tp·cp·dp`` under
    Megatron-Core's default order ``tp-cp-dp-pp`` (the pipeline stages outermost: each stage's group lies in
    ``num_gpus / pp`` GPUs), the whole job under ``tp-cp-pp-dp`` (data parallelism outermost, Meta's order)."""
    if layout.rank_order == "tp-cp-pp-dp":
        return float(layout.num_gpus)
    return shape.tp * shape.cp * shape.data_parallel


def pod_crossing_s_per_byte(shape: Shape, layout: ModelLayout, machine: Machine, d_r: float) -> float:
    """Seconds per byte of a GPU's gradient (or weight) share that a data-parallel collective spread over several
    pods of an oversubscribed fabric adds to the ring's time.

    The bandwidth-optimal reduce-scatter (and all-gather) over ``P`` pods of ``n`` members each is a reduce-scatter
    inside each pod and one across pods among the ``P`` members holding the same shard: each GPU sends ``(P-1)/P``
    of its ``1/n`` shard out of its pod. Every GPU of a pod does so at once (each is in some data-parallel group),
    so the pod's uplinks, ``pod_gpus · NIC / oversubscription``, give each GPU ``NIC / oversubscription``; at 1 (a
    non-blocking fabric) the phase costs what the ring already counts, so only ``oversubscription - 1`` of it is
    added. The Llama 3 paper (arXiv 2407.21783, section 3.3.1) describes the fabric this prices: pods of 3,072 H100
    with full bisection, 1:7 oversubscribed between pods."""
    pod, over = layout.pod_gpus, layout.pod_oversubscription
    if pod is None or over <= 1.0:
        return 0.0
    pods = math.ceil(dp_group_span(shape, layout) / pod)
    if pods <= 1:
        return 0.0
    members = d_r / pods
    return (over - 1.0) * (pods - 1) / pods / members / machine.nic_Bps


def optimizer_time(shape: Shape, machine: Machine, stages: Stages, layout: ModelLayout, stack: Stack) -> float:
    """The memory-bound Adam step over this GPU's shard of the slowest stage's parameters (``Stack.optimizer_bytes``
    each: 36 for a fused Adam), the routed experts' shard (over the expert-data-parallel group) included."""
    d_r = shape.data_parallel * shape.cp
    local = stages.stage_params / shape.tp / d_r
    if shape.arch.num_experts:
        experts = _moe.expert_stages(shape.arch, layout, stages)
        local += experts.largest / experts.data_parallel
    return local * stack.optimizer_bytes / (machine.hbm_Bps * machine.params.optimizer_bw_eff)


def grad_accumulation_time(
    shape: Shape, machine: Machine, stages: Stages, stack: Stack, grad_b: float, layout: ModelLayout
) -> float:
    """Without gradient-accumulation fusion (recipes.mcore, dse.perfmodel.stack) every weight gradient of every
    micro-batch is written as its own bf16 tensor (2 B) and then added to the gradient buffer by Megatron's DDP
    hook (param.main_grad.add_(param.grad): read 2, read and write grad_b each), memory-bound like Adam, on the
    slowest stage's parameters, the routed experts this GPU holds included (SequentialMLP's linears and TE's
    GroupedLinear take the same ``gradient_accumulation_fusion``); NVIDIA's recipes fuse it into the wgrad GEMM (no
    term)."""
    if stack.grad_accumulation_fusion:
        return 0.0
    p_local = stages.stage_params / shape.tp
    if shape.arch.num_experts:
        p_local += _moe.expert_stages(shape.arch, layout, stages).largest
    return shape.microbatches * p_local * (4.0 + 2.0 * grad_b) / (machine.hbm_Bps * machine.params.optimizer_bw_eff)


def step_time(
    shape: Shape, layout: ModelLayout, machine: Machine, stages: Stages, stack: Stack, layer_bytes: float
) -> StepTime:
    """The terms of one step; ``layer_bytes`` are one layer's activations (what offloading copies)."""
    P, m, p, v = machine.params, shape.microbatches, shape.pp, shape.vp
    grad_b = grad_bytes(layout.precision, stack)
    layer = layer_time(shape, layout, machine, stack)
    t_layer = layer.total
    t_offload = offload_time(shape, layout, machine, t_layer, layer_bytes)
    # each multi-token-prediction layer has its own output layer and loss
    t_logits = logits_time(shape, layout, machine, stack, layer.tp_collective) * (1 + shape.arch.mtp_layers)
    t_mb = microbatch_time(shape, stages, t_layer, t_logits, t_offload)
    layers = stages.first_layers if p == 1 else stages.mid_layers
    return StepTime(
        layer_compute_s=m * layers * layer.compute,
        host_wait_s=m * layers * layer.host_wait,
        tp_exposed_s=m * stages.mid_layers * layer.tp_exposed,
        ep_exposed_s=m * stages.mid_layers * layer.ep_exposed,
        cp_exposed_s=m * stages.mid_layers * layer.cp_exposed,
        recompute_s=m * stages.mid_layers * layer.recompute,
        logits_s=m * t_logits,
        bubble_s=(p - 1) / v * t_mb,
        pp_p2p_s=pipeline_p2p_time(shape, machine, t_mb),
        dp_exposed_s=dp_exposed_time(shape, layout, machine, stages, t_mb, grad_b),
        optimizer_s=optimizer_time(shape, machine, stages, layout, stack),
        grad_accumulation_s=grad_accumulation_time(shape, machine, stages, stack, grad_b, layout),
        offload_exposed_s=m * t_offload,
        overhead_s=P.step_overhead_s,
        per_microbatch_s=t_mb,
        microbatches=m,
        bubble_fraction=(p - 1) / (v * m),
    )


def predict(trial, *, flops_convention: str = "causal", params: Params = DEFAULT_PARAMS) -> Prediction:
    """The model's prediction for a resolved :class:`dse.rules.trial.TrialConfig`.

    Never raises for a point that breaks a validity rule in a way the formulas survive (non-divisible
    sizes are taken as fractions); callers check ``dse.rules.constraints`` first.
    """
    return prepare(trial, flops_convention=flops_convention).predict(params)


def prepare(trial, *, flops_convention: str = "causal") -> Prepared:
    """What of ``trial``'s prediction no parameter changes (:class:`Prepared`): :func:`predict` is
    ``prepare(trial).predict(params)``, and a fit prepares each run once and evaluates it under many parameters."""
    sysm, arch = trial.system, trial.recipe.arch
    stack = payload_stack(getattr(trial, "payload", None))
    # every knob the model reads, by the catalogue's model_arg (dse.facts.knobs): no knob is plumbed by hand here
    layout = ModelLayout(
        num_gpus=trial.values["num_nodes"] * sysm.gpus_per_node,
        **knobs.model_args(trial.values),
        dropout=_dropout(arch, stack, None),
        nvlink_domain=sysm.nvlink_domain,
        scaleout_gbps=sysm.scaleout_gbps,
        container=model_family(sysm.container),
        pod_gpus=sysm.pod_gpus,
        pod_oversubscription=sysm.pod_oversubscription,
        rank_order=sysm.rank_order,
    )
    return Prepared.of(arch, sysm.gpu, layout, stack, flops_convention)


@functools.lru_cache(maxsize=64)  # once per tag: a study predicts thousands of points in one container
def model_family(tag: str) -> str:
    """The container family (dse.facts.containers) whose efficiencies the model applies for container ``tag``: its
    family, the newest for a newer tag; the reference family for a tag no family knows (an older or malformed one,
    which a space's preflight and ``dse predict --container`` refuse before any prediction)."""
    try:
        return resolve_container(tag).family.name
    except UserError:
        return REFERENCE


def _dropout(arch, stack: Stack, dropout: bool | None) -> bool:
    """Dropout: None takes the architecture's (``ModelArch.dropout``) on a stack that runs it (``Stack.arch_dropout``)."""
    return stack.arch_dropout and arch.dropout > 0.0 if dropout is None else dropout


def predict_layout(
    arch,
    gpu: str,
    *,
    params: Params = DEFAULT_PARAMS,
    flops_convention: str = "causal",
    stack: Stack = NVIDIA_RECIPES,
    dropout: bool | None = None,
    **layout: Any,
) -> Prediction:
    """The model on plain values (what :func:`predict` reads from a trial): ``layout`` is
    :class:`dse.perfmodel.layout.ModelLayout`'s fields (the knobs the model reads, by the catalogue's names and
    with its defaults, and the system's links and fabric and the container), beside the FLOPs convention and the
    payload's ``stack``; ``dropout`` None takes the architecture's (``ModelArch.dropout``) on a stack that runs it
    (``Stack.arch_dropout``)."""
    model_layout = ModelLayout(**layout, dropout=_dropout(arch, stack, dropout))
    return Prepared.of(arch, gpu, model_layout, stack, flops_convention).predict(params)


def predict_model_layout(
    arch,
    gpu: str,
    layout: ModelLayout,
    *,
    flops_convention: str = "causal",
    params: Params = DEFAULT_PARAMS,
    stack: Stack = NVIDIA_RECIPES,
) -> Prediction:
    """The model for a :class:`ModelLayout`: the step's time terms (:func:`step_time`) and the peak memory
    (:func:`dse.perfmodel.memory.peak_memory`) of ``arch`` on ``gpu`` (a :data:`dse.facts.hardware.HARDWARE` name)."""
    return Prepared.of(arch, gpu, layout, stack, flops_convention).predict(params)


@dataclass(slots=True)
class Prepared:
    """One prediction's values that no fitted parameter changes: the layout, one micro-batch's shape on one GPU,
    the pipeline stages, one layer's activations, the memory's byte counts and the model FLOPs of a step. Built
    once per point (:func:`prepare`); :meth:`predict` adds the GPU's rates under the parameters and the time
    terms. A fit (``dse calibrate``) prepares each run once and asks only for the figure it fits
    (:meth:`step_time_s`, :meth:`peak_memory_gib`) under each parameter set it tries."""

    hw: GpuSpec
    layout: ModelLayout
    stack: Stack
    shape: Shape
    stages: Stages
    layer_bytes: float
    memory: MemoryCounts
    model_flops: float

    @classmethod
    def of(cls, arch, gpu: str, layout: ModelLayout, stack: Stack, flops_convention: str = "causal") -> Prepared:
        """The prepared values of ``arch`` on ``gpu`` (a :data:`dse.facts.hardware.HARDWARE` name) under ``layout``."""
        hw = HARDWARE[gpu]
        backend = attention_backend_run(arch, hw, layout)
        if backend != layout.attention_backend:
            layout = replace(layout, attention_backend=backend)
        fp8 = uses_low_precision(hw, layout)
        shape = Shape.of(arch, layout)
        stages = stages_of(arch, layout.pp, layout.vp, layout.pp_first_layers, layout.pp_last_layers)
        layer_bytes = layer_activations(shape, layout, fp8)
        grad_b = grad_bytes(layout.precision, stack)
        memory = memory_counts(
            shape, layout, fp8, stages, stack, full_layer=layer_bytes, grad_b=grad_b, non_tn_fp8_gemm=hw.sm100_or_newer
        )
        mf = _flops.model_flops_per_step(arch, layout.gbs, layout.seq_length, flops_convention)
        return cls(hw, layout, stack, shape, stages, layer_bytes, memory, mf)

    def step_time(self, params: Params) -> StepTime:
        """The step's time terms under ``params``."""
        machine = machine_for(self.hw, params, self.layout)
        return step_time(self.shape, self.layout, machine, self.stages, self.stack, self.layer_bytes)

    def step_time_s(self, params: Params) -> float:
        """The step time (s) under ``params``: :meth:`predict`'s ``step_time_s`` without the rest."""
        return self.step_time(params).step_s

    def probe_step_s(self, params: Params, stage: str) -> float:
        """What a probe of one rank of pipeline stage ``stage`` ("first", "last", "mid" or "stageK") measures as its step
        time (s): the stage's own compute under a fake process group, no communication and no waiting. Every
        micro-batch through the stage's layers (their kernels, recompute and host time; no tensor-, expert- or
        context-parallel collective), the output layer and loss on the last stage (without its sequence-parallel
        gather), the offload copies of a one-stage layout, then the optimizer step, the gradient accumulation and
        the step's overhead; no pipeline bubble, send or receive, no data-parallel traffic; the experts' tokens
        spread evenly (the payload forces an even routing in a probe: no ``moe_imbalance``)."""
        params = params.with_values(moe_imbalance=1.0)  # a probe routes evenly (recipes.mcore under its fake group)
        machine = machine_for(self.hw, params, self.layout)
        shape, stages, m = self.shape, self.stages, self.shape.microbatches
        t = step_time(shape, self.layout, machine, stages, self.stack, self.layer_bytes)
        layer = layer_time(shape, self.layout, machine, self.stack)
        layer_s = layer.compute + layer.recompute + layer.host_wait
        layers = {"first": stages.first_layers, "last": stages.last_layers}.get(stage, stages.mid_layers)
        if shape.pp == 1:
            layers = stages.first_layers
        mb = layers * layer_s
        if stage == "last" or shape.pp == 1:
            mb += logits_time(shape, self.layout, machine, self.stack, 0.0) * (1 + shape.arch.mtp_layers)
        return m * mb + t.offload_exposed_s + t.optimizer_s + t.grad_accumulation_s + t.overhead_s

    def peak_memory_gib(self, params: Params) -> float:
        """The peak memory (GiB) under ``params``: :meth:`predict`'s ``peak_memory_gib`` without the rest."""
        return self.memory.peak_gib(params, self.stack)

    def predict(self, params: Params = DEFAULT_PARAMS) -> Prediction:
        """The prediction under ``params``: step time and its terms, throughput, peak memory and its parts."""
        time = self.step_time(params)
        memory = peak_memory(self.memory, params, self.stack)
        step, num_gpus, layout, hw = time.step_s, self.layout.num_gpus, self.layout, self.hw
        return Prediction(
            step_time_s=step,
            tokens_per_s_per_gpu=layout.gbs * layout.seq_length / (step * num_gpus),
            tflops_per_gpu=self.model_flops / (step * num_gpus) / 1e12,
            peak_memory_gib=memory.peak_gib,
            gpu_memory_gib=hw.memory_gib,
            fits=memory.peak_gib <= hw.memory_gib,
            breakdown=Breakdown(time, memory),
        )
