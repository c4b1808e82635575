"""The mixture-of-experts and multi-latent-attention terms of the model: one MoE layer's GEMMs, its token
dispatch and combine (all-to-all, all-gather or the flex kernels), permutation and router, its activations, and
the routed experts' model states sharded over expert parallelism.

How Megatron-Core runs a MoE layer (``megatron/core/transformer/moe/``): the attention part is a dense layer's,
split over the tensor-parallel ranks; the MoE MLP sees the layer's tokens split over TP by sequence parallelism
(``T/tp`` per GPU), routes each to ``k`` experts (``router.py``), permutes them by expert and sends them to the
expert-parallel ranks that hold those experts (``token_dispatcher.py``: dispatch, then combine after the experts,
each forward and backward: four exchanges per layer and micro-batch), where the local experts run as one grouped
GEMM (``experts.py`` ``TEGroupedMLP``) or one GEMM each (``SequentialMLP``). Each GPU holds ``E/ep`` experts,
each split over ``etp`` ranks; under balanced routing it processes ``k·T/tp`` token-expert pairs per micro-batch,
``m = k·(T/tp)·ep·etp/E`` per local expert: small ``m`` is what makes expert GEMMs slower than a dense GEMM of
the same FLOPs (:func:`grouped_gemm_efficiency`). Shared experts are a dense MLP beside the routed ones.

Load balance: NVIDIA's published MoE rows force-balance the router (Megatron-Bridge's performance summaries:
"we force-balance the token distribution among experts and all benchmarks are token-dropless";
``moe_router_force_load_balancing``), so the fitted parameters describe balanced routing, and
``Params.moe_imbalance`` (the busiest expert-parallel rank's tokens over the mean) stays 1 for them: a real
router's imbalance is that parameter, to be set from one's own runs (``dse calibrate``) since no published table
measures it.

Expert states (Megatron-Core's expert-data-parallel group, ``parallel_state``'s ``expert_data_parallel``: the
``world / (pp·ep·etp)`` ranks that hold the same experts): weights and gradients of this GPU's experts, the
distributed optimizer's fp32 state sharded over that group.
"""

from __future__ import annotations

from dataclasses import dataclass

from dse.facts import knobs
from dse.perfmodel.flops import expert_params, mlp_factor
from dse.perfmodel.layout import GRAPH_PART_SHARE, Machine, ModelLayout, Shape, Stages, kept_score_bytes
from dse.recipes.models import ModelArch

ROUTER_BYTES = 24.0  # HBM bytes per token and expert of the router: fp32 logits, scores, top-k, their backward
# HBM bytes per hidden element of one routed copy of a token for permutation and unpermutation, forward and
# backward (bf16): permute reads the token (2) and writes its copy (2), unpermute reads the expert's output (2) and
# the probabilities and adds it into the token (2 + 2), and the backward does the same again: 20. The fused kernels
# (moe_permute_fusion, Transformer Engine's moe_permute / moe_unpermute) fold the index gather and the probability
# scaling into one pass: about half
PERMUTE_BYTES = 20.0
PERMUTE_FUSED_SHARE = 0.5
A2A_PER_LAYER = 4  # dispatch and combine, forward and backward


def moe_arch(arch: ModelArch) -> bool:
    """Whether ``arch`` takes this module's terms (experts or MLA or its own head size); a plain dense GQA model
    keeps the dense layer's formulas exactly."""
    return bool(arch.num_experts or arch.kv_lora_rank or arch.kv_channels is not None)


def attention_weights(arch: ModelArch) -> float:
    """Weight elements of one layer's attention GEMMs per token pass (QKV and output; MLA's down and up
    projections): the forward FLOPs per token are twice this."""
    h, a = arch.hidden_size, arch.num_attention_heads
    if not arch.kv_lora_rank:
        d = arch.head_dim
        return h * (a + 2 * arch.num_query_groups) * d + a * d * h
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    q = h * a * qk if arch.q_lora_rank is None else arch.q_lora_rank * (h + a * qk)
    kv = h * (arch.kv_lora_rank + arch.qk_rope_head_dim) + arch.kv_lora_rank * a * (
        arch.qk_nope_head_dim + arch.v_head_dim
    )
    return q + kv + a * arch.v_head_dim * h


def attention_core_dims(arch: ModelArch) -> tuple[float, float]:
    """(query-key dim, value dim) per head of the core attention: MLA's nope + rope and v head dims, else d."""
    if arch.kv_lora_rank:
        return float(arch.qk_nope_head_dim + arch.qk_rope_head_dim), float(arch.v_head_dim)
    return float(arch.head_dim), float(arch.head_dim)


# the head size at which the fused attention kernels' tensor-core efficiency halves against its value at 128, the
# size they are tuned for: FlashAttention-3 (Shah et al. 2024, H100 BF16 forward, causal, 4k-16k tokens) reaches
# about three quarters of its head-128 rate at head size 64 (the softmax's per-score work and the tiles' loads and
# stores are amortised over half the multiply-adds), which ``d / (d + 64)`` normalised at 128 gives
ATTN_HEAD_HALF = 64.0


def attention_head_efficiency(arch: ModelArch) -> float:
    """The fused attention's tensor-core efficiency at the model's query-key head size relative to head size 128
    (:data:`ATTN_HEAD_HALF`): below 1 for heads smaller than 128 (GPT-OSS's 64), 1 from 128 up, where the fitted
    attention efficiency of the dense models already stands."""
    d = attention_core_dims(arch)[0]
    if d >= 128.0:
        return 1.0
    return d / (d + ATTN_HEAD_HALF) * (128.0 + ATTN_HEAD_HALF) / 128.0


def local_tokens(shape: Shape) -> float:
    """Tokens of one micro-batch that enter this GPU's MoE layer: the layer's tokens split over TP."""
    return shape.tokens / shape.tp


def imbalance(layout: ModelLayout, machine: Machine) -> float:
    """The busiest expert-parallel rank's token copies over the mean (``Params.moe_imbalance``); 1 without expert
    parallelism, where one rank holds every expert and so every copy, however the router spreads them, and 1 under
    token drop (``moe_token_drop``: capacity factor 1.0, padded), where every expert takes exactly its capacity, the
    balanced count: the surplus of a busy expert is dropped and an idle one is padded."""
    if layout.ep == 1 or layout.moe_token_drop:
        return 1.0
    return machine.params.moe_imbalance


def tokens_per_expert(shape: Shape, layout: ModelLayout) -> float:
    """Token copies each local expert processes per micro-batch under balanced routing."""
    arch = shape.arch
    return arch.moe_topk * local_tokens(shape) * layout.ep * layout.etp / arch.num_experts


def grouped_gemm_efficiency(m: float, m_half: float) -> float:
    """The share of the GEMM rate a grouped expert GEMM of ``m`` rows per expert reaches: ``m / (m + m_half)``,
    ``m_half`` the fitted rows at which it runs at half the rate (tile quantisation and wave tails of small
    per-expert problems; CUTLASS / cuBLASLt grouped GEMMs)."""
    return m / (m + m_half)


def grouped_m_half(layout: ModelLayout, machine: Machine) -> float:
    """The rows per expert at which this layout's grouped expert GEMM runs at half the GEMM rate:
    ``Params.moe_gemm_m_half``, times ``Params.moe_gemm_bf16_blackwell_ratio`` for bf16 on Blackwell, whose
    grouped GEMMs go through cuBLASLt's grouped matmul rather than the fused MXFP8 path."""
    P = machine.params
    if layout.precision == knobs.BF16 and machine.gpu.arch == "blackwell":
        return P.moe_gemm_m_half * P.moe_gemm_bf16_blackwell_ratio
    return P.moe_gemm_m_half


def expert_gemm_forward(shape: Shape, layout: ModelLayout, machine: Machine) -> float:
    """The routed experts' GEMMs of one layer and micro-batch on this GPU, forward: FLOPs at the GEMM rate times
    the grouped efficiency (times the busiest rank's imbalance), plus the local experts' weights and the tokens
    through HBM. Without grouped GEMM (one GEMM per expert) each expert's launches are the host's time, not the GPU's
    (:func:`moe_host_forward_s`)."""
    arch = shape.arch
    h, Fe, e, k = arch.hidden_size, arch.expert_ffn, mlp_factor(arch), arch.moe_topk
    pairs = k * local_tokens(shape) * imbalance(layout, machine)  # token copies through this GPU's experts
    flops = 2.0 * pairs * h * e * Fe
    m = tokens_per_expert(shape, layout) * imbalance(layout, machine)
    eff = grouped_gemm_efficiency(m, grouped_m_half(layout, machine))
    local_experts = arch.num_experts / layout.ep
    weights = local_experts * e * h * Fe / layout.etp
    nbytes = weights * machine.gemm_input_bytes + pairs * (2.0 * h + (e - 1) * Fe) * 2.0
    return flops / (machine.gemm_rate * eff) + nbytes / machine.hbm_Bps


def dense_gemm_forward(shape: Shape, machine: Machine) -> float:
    """The layer's dense GEMMs, forward: attention (GQA or MLA) and the shared experts (or, for a model without
    experts, its MLP), split over TP, at the GEMM rate plus weights and tokens through HBM."""
    arch, t, T = shape.arch, shape.tp, shape.tokens
    h, e = arch.hidden_size, mlp_factor(arch)
    ffn = arch.moe_shared_expert_size if arch.num_experts else arch.ffn_hidden_size
    weights = (attention_weights(arch) + e * h * ffn) / t
    flops = 2.0 * T * weights
    nbytes = weights * machine.gemm_input_bytes + T * (4.0 * h + 2.0 * (e - 1) * ffn / t) * machine.gemm_input_bytes
    return flops / machine.gemm_rate + nbytes / machine.hbm_Bps


def router_time(shape: Shape, machine: Machine) -> float:
    """The router of one layer, forward + backward: its h x E GEMM (fp32 in Megatron-Core) and the element-wise
    score, top-k and auxiliary-loss kernels over the T/tp x E scores."""
    arch = shape.arch
    if not arch.num_experts:
        return 0.0
    T = local_tokens(shape)
    gemm = 3.0 * 2.0 * T * arch.hidden_size * arch.num_experts / (machine.bf16_gemm_rate / 4)
    return gemm + T * arch.num_experts * ROUTER_BYTES * machine.params.elementwise_scale / machine.hbm_Bps


def permute_time(shape: Shape, layout: ModelLayout, machine: Machine) -> float:
    """Permutation and unpermutation of the routed token copies, forward + backward (:data:`PERMUTE_BYTES`)."""
    arch = shape.arch
    if not arch.num_experts:
        return 0.0
    share = PERMUTE_FUSED_SHARE if layout.moe_permute_fusion else 1.0
    copies = arch.moe_topk * local_tokens(shape) * imbalance(layout, machine)
    return copies * arch.hidden_size * PERMUTE_BYTES * share * machine.params.elementwise_scale / machine.hbm_Bps


# the graph scopes that capture a whole MoE layer's own launches, and those that capture part of them
MOE_GRAPH_WHOLE = frozenset({"full", "full_iteration", "moe"})
MOE_GRAPH_PARTS = ("moe_router", "moe_preprocess")


def moe_overhead_graphed_share(layout: ModelLayout) -> float:
    """The share of a MoE layer's own small kernels (``moe_layer_overhead_s``: the router's gating GEMM, top-k and
    auxiliary loss, the dispatcher's preprocessing metadata, the permutation's bookkeeping and the exchange's
    launches) that a CUDA graph replays without launch gaps: all of them under a whole-layer or whole-MoE scope;
    under ``moe_router`` / ``moe_preprocess`` (Megatron-Core's ``cuda_graph_scope``, NVIDIA's MoE presets) those
    parts' share of the MoE block's launches, as :data:`dse.perfmodel.layout.GRAPH_PART_SHARE` counts them (0.15 +
    0.1 of the block's 0.5: a half); the token exchange and the permutation, outside those graphs, keep theirs."""
    if layout.cuda_graph == "none":
        return 0.0
    scope = set(layout.cuda_graph_scope.split(","))
    if scope & MOE_GRAPH_WHOLE:
        return 1.0
    parts = sum(GRAPH_PART_SHARE[p] for p in MOE_GRAPH_PARTS if p in scope)
    return min(1.0, parts / GRAPH_PART_SHARE["moe"])


def moe_elementwise_time(shape: Shape, layout: ModelLayout, machine: Machine) -> float:
    """The element-wise kernels of a MoE / MLA layer, forward + backward: the dense layer's norms, residuals and
    RoPE (60 bytes per hidden element, as :func:`dse.perfmodel.model.elementwise_time`), the attention inputs,
    the activation of the shared and the routed experts (18 or 12 bytes per FFN element) and FP8's quantisation
    of the GEMM inputs (4 bytes each)."""
    arch, t = shape.arch, shape.tp
    h, h_sp = arch.hidden_size, shape.hidden_sp
    qk, v = attention_core_dims(arch)
    a = arch.num_attention_heads
    act = 18.0 if arch.gated_mlp else 12.0
    if arch.num_experts:
        mlp_elems = (arch.moe_shared_expert_size + arch.moe_topk * arch.expert_ffn * imbalance(layout, machine)) / t
    else:
        mlp_elems = arch.ffn_hidden_size / t
    attn_elems = a * (2.0 * qk + v) / t
    nbytes = 60.0 * h_sp + 12.0 * attn_elems + act * mlp_elems
    if machine.fp8:
        nbytes += 4.0 * (2.0 * h_sp + attn_elems + mlp_elems * mlp_factor(arch) / 2.0 + h / t)
    return shape.tokens * nbytes * machine.params.elementwise_scale / machine.hbm_Bps


def remote_domains(k: int, domains: float) -> float:
    """The NVLink domains other than its own that a token routed to ``k`` uniformly chosen experts spread over
    ``domains`` domains reaches, on average: ``(D - 1)·(1 - (1 - 1/D)^k)``. The flex dispatcher's kernels (DeepEP's
    internode mode, HybridEP) send a token once per remote domain and fan it out over NVLink there, where the
    all-to-all sends one copy per remote expert."""
    if domains <= 1.0:
        return 0.0
    return (domains - 1.0) * (1.0 - (1.0 - 1.0 / domains) ** k)


def a2a_nic_Bps(machine: Machine) -> float:
    """The NIC's bandwidth one GPU's all-to-all can use: the NIC's line rate (at NCCL's bus-bandwidth share,
    ``scaleout_eff``), but at most one network plane's (``moe_a2a_nic_plane_gbps``). A ConnectX-8 (B300, GB300)
    reaches its 800 Gb/s as two 400 Gb/s planes: "800Gb/s or XDR IB or 2 x 400GbE link speeds", "800GbE link
    speed is not supported on a single port", "uses planarized topology network to reach XDR performance"
    (NVIDIA ConnectX-8 SuperNIC firmware release notes 40.44.0208); on an Ethernet fabric its users "must split
    cx8 to 2*400Gbps" (NVIDIA/nccl issue 2035, 16 nodes of 8 B300 + 8 CX8); and NCCL's all-to-all "cannot
    aggregate the bandwidth of multiple NICs", so it sees one port's rate (NVIDIA/nccl-tests issue 267, NCCL's
    maintainer). Whether NCCL's ring collectives use both planes is not published; the data-parallel terms keep
    the NIC's full rate, as the dense rows were fitted with it."""
    P = machine.params
    return min(machine.nic_Bps, P.moe_a2a_nic_plane_gbps * 1e9 / 8 * P.scaleout_eff)


def a2a_time(shape: Shape, layout: ModelLayout, machine: Machine) -> float:
    """The token exchanges of one MoE layer and micro-batch (:data:`A2A_PER_LAYER`), before any overlap.

    All-to-all and flex: each exchange sends this GPU's ``k·T/tp`` token copies (bf16) to the ``ep`` ranks of its
    expert-parallel group, ``(ep-1)/ep`` of them away; the group's ranks are ``etp`` apart (Megatron-Core's expert
    rank order), so the peers within the NVLink domain are reached over NVLink and the others through this GPU's
    NIC, both at once: NVLink at the fitted all-to-all efficiency (many small messages), the NIC at its own
    (``moe_a2a_nic_eff``: fewer, larger messages, bandwidth-bound), the flex kernels (DeepEP / HybridEP) at
    ``moe_flex_speedup`` times either (at most the NIC's line rate), sending a token once per remote NVLink domain
    (:func:`remote_domains`).
    All-gather: every rank gathers the group's tokens and reduce-scatters the result, ``2(ep-1)·T/tp`` tokens.
    """
    arch, ep, P = shape.arch, layout.ep, machine.params
    if not arch.num_experts or ep <= 1:
        return 0.0
    h, T = arch.hidden_size, local_tokens(shape)
    in_domain = max(1.0, min(float(ep), machine.nvlink_domain / max(layout.etp, 1)))
    if layout.moe_dispatcher == "allgather":
        nbytes = (ep - 1) * T * h * 2.0
        near, far = (in_domain - 1) / (ep - 1), (ep - in_domain) / (ep - 1)
    else:
        nbytes = arch.moe_topk * T * h * 2.0 * imbalance(layout, machine)
        near, far = (in_domain - 1) / ep, (ep - in_domain) / ep
        if layout.moe_dispatcher == "flex":
            far = remote_domains(arch.moe_topk, ep / in_domain) / arch.moe_topk
    flex = P.moe_flex_speedup if layout.moe_dispatcher == "flex" else 1.0
    nvlink = nbytes * near / (machine.nvlink_Bps * P.moe_a2a_eff * flex)
    nic = nbytes * far / (a2a_nic_Bps(machine) * min(1.0, P.moe_a2a_nic_eff * flex))
    one = max(nvlink, nic) + P.collective_latency_s
    return A2A_PER_LAYER * one


def unpaired_share(shape: Shape) -> float:
    """The share of a stage's micro-batch passes that the combined 1F1B schedule runs alone, with no pass of
    another micro-batch to overlap: the warm-up forwards and the cool-down backwards of the first stage, ``2(pp-1) +
    (vp-1)·pp`` model chunks of ``m·vp`` with interleaving, ``pp-1`` of ``m`` without (Megatron-Core's
    ``get_pp_rank_microbatches``), and at least the first forward and the last backward (one of ``m``)."""
    p, v, m = shape.pp, shape.vp, max(shape.microbatches, 1.0)
    warmup = 2.0 * (p - 1) + (v - 1) * p if v > 1 else p - 1.0
    return min(1.0, max(warmup, 1.0) / (m * v))


def a2a_exposed(shape: Shape, layout: ModelLayout, machine: Machine) -> float:
    """The exchanges' time not hidden. Without ``moe_a2a_overlap`` all of :func:`a2a_time` is on the critical path.

    With it (Megatron-Core's ``overlap_moe_expert_parallel_comm``), the combined 1F1B schedule runs one micro-batch's
    forward layer beside another's backward, each exchange on a communication stream beside a compute phase of the
    other micro-batch (``TransformerLayerSchedulePlan.run``, ``megatron/core/models/common/
    model_chunk_schedule_plan.py``: "comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd | combine_fwd" beside
    "comp_stream: attn_fwd | mlp_bwd->mlp_bwd_dw->mlp_fwd | attn_bwd"). The fitted ``moe_a2a_overlap`` is the share
    hidden where a pass has a partner; the warm-up forwards and cool-down backwards have none
    (:func:`unpaired_share`). Capping each exchange at the compute phase beside it made the held-out rows worse
    (13.9% to 14.5% after a refit), so the share stays one figure."""
    t = a2a_time(shape, layout, machine)
    if not layout.moe_a2a_overlap:
        return t
    return t * (1.0 - machine.params.moe_a2a_overlap * (1.0 - unpaired_share(shape)))


def moe_host_forward_s(shape: Shape, layout: ModelLayout, machine: Machine) -> float:
    """The host's time to launch one MoE layer's forward pass for one micro-batch: ``Params.moe_host_fwd_s`` plus,
    per expert this GPU holds, ``Params.moe_host_expert_fwd_s`` (a grouped GEMM still hands each local expert's
    weights and row count to its kernels from Python) or, without grouped GEMM, two ``Params.moe_gemm_launch_s``
    (Megatron-Core's SequentialMLP: a Python loop that slices each expert's tokens and runs its fc1, activation and
    fc2; the backward's four at ``Params.moe_host_bwd_ratio``), on an x86 host; ``Params.moe_host_grace_ratio`` times
    it on Grace, less the share a CUDA graph's scope replays (``ModelLayout.graph_share``); none under a whole-layer
    graph, which needs no host sync (it pads the experts' inputs to a static capacity). The loop's launches were the
    GPU's time before (a launch gap per expert GEMM): the layer's other host time then hid behind them, where the host
    makes both, one after the other."""
    if layout.graph_share >= 1.0:
        return 0.0
    P = machine.params
    ratio = P.moe_host_grace_ratio if machine.gpu.grace_host else 1.0
    local_experts = shape.arch.num_experts / layout.ep
    per_expert = P.moe_host_expert_fwd_s if layout.moe_grouped_gemm else 2.0 * P.moe_gemm_launch_s
    return (P.moe_host_fwd_s + local_experts * per_expert) * ratio * (1.0 - layout.graph_share)


def recompute_host_share(layout: ModelLayout) -> float:
    """The forward host time a MoE layer's backward pass launches again under recompute, as a share of the
    forward's (:func:`moe_host_forward_s`): full recompute replays the whole forward (one-GPU runs of the small MoE:
    8.0 ms more per layer and micro-batch on the local spec, one forward's host time; bench/moe_gpu_runs.py's
    host_split), the ``moe`` module the MoE block's half of the launches (:data:`GRAPH_PART_SHARE`); the other
    selective modules are a few kernels each (none counted)."""
    if layout.recompute == "full":
        return 1.0
    return GRAPH_PART_SHARE["moe"] if layout.recomputes("moe") else 0.0


def moe_host_passes_s(shape: Shape, layout: ModelLayout, machine: Machine) -> tuple[float, float]:
    """The host's time to launch one MoE layer's forward and backward passes for one micro-batch (seconds): the
    forward's (:func:`moe_host_forward_s`) and ``Params.moe_host_bwd_ratio`` times it for the backward, plus what
    recompute launches again there (:func:`recompute_host_share`)."""
    fwd = moe_host_forward_s(shape, layout, machine)
    return fwd, (machine.params.moe_host_bwd_ratio + recompute_host_share(layout)) * fwd


def moe_sync_wait(shape: Shape, layout: ModelLayout, machine: Machine, forward_busy: float) -> float:
    """What one MoE layer's forward pass waits for its host beyond its GPU time ``forward_busy``, per micro-batch.

    A dropless MoE layer's dispatcher copies the tokens per expert to the host and waits for them once per forward
    pass: the all-to-all dispatcher needs the exchange's split sizes and the grouped GEMM's per-expert rows as host
    integers (Megatron-Core ``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``: ``_maybe_dtoh_and_synchronize``
    at ``cuda_sync_point`` "before_ep_alltoall"), and HybridEP sizes its output from ``tokens_per_expert.sum()``
    ("HybridEP sizes buffers dynamically (CPU sync in dispatch)") unless a capacity is set, which NVIDIA's dropless
    presets do not. At that sync the GPU's queue is empty, so the host cannot run ahead of the GPU across layers
    as it does elsewhere: each layer's forward takes at least the host's time to launch it
    (:func:`moe_host_forward_s`). The backward pass (autograd, no sync) lets the host run ahead, but not faster
    than it launches (:func:`moe_backward_host_wait`). The wait is largest
    where a layer's forward GPU time is short: a small model at a small micro-batch. Under token drop
    (``moe_token_drop``) the padded experts' shapes are static and the dispatcher copies nothing to the host
    (Megatron-Core's ``MoEAlltoAllTokenDispatcher.preprocess``: under ``drop_and_pad`` the per-expert counts are the
    capacity, made on the host with ``torch.full``, where a capacity without padding still syncs for the
    permutation's size): no wait here; :func:`moe_host_layer_wait` bounds the layer instead."""
    if layout.moe_token_drop:
        return 0.0
    return max(0.0, moe_host_forward_s(shape, layout, machine) - forward_busy)


def moe_backward_host_wait(shape: Shape, layout: ModelLayout, machine: Machine, backward_busy: float) -> float:
    """What one MoE layer's backward pass waits for its host beyond its GPU time ``backward_busy``, per
    micro-batch. The backward has no host sync, so the host runs ahead of the GPU there, but it starts from the
    empty queue the forward's last sync left (:func:`moe_sync_wait`) and cannot issue the backward's launches
    faster than it makes them: a backward pass takes at least the host's time for it,
    ``Params.moe_host_bwd_ratio`` times the forward's (:func:`moe_host_forward_s`). One-GPU runs of a small MoE
    on an H200 step at 27% GPU busy with 12.1 ms of host time per MoE layer and micro-batch, 3.6 ms of it the
    forward's (bench/moe_gpu_runs.py). Under token drop no sync empties the queue (:func:`moe_sync_wait`): no
    wait here."""
    if layout.moe_token_drop:
        return 0.0
    return max(0.0, moe_host_passes_s(shape, layout, machine)[1] - backward_busy)


def moe_host_layer_wait(shape: Shape, layout: ModelLayout, machine: Machine, busy: float) -> float:
    """What a MoE layer waits for its host beyond its GPU time ``busy`` (forward and backward), per micro-batch,
    where the two passes' launches are pooled: the host runs ahead of the GPU but cannot launch faster than it makes
    the launches, forward (:func:`moe_host_forward_s`) and backward (``Params.moe_host_bwd_ratio`` times it). Two
    cases, 0 otherwise (the dropless layer's sync, :func:`moe_sync_wait` and :func:`moe_backward_host_wait`):

    - ``moe_a2a_overlap``: the combined 1F1B schedule issues one micro-batch's forward layer and another's backward
      layer together, from the schedule's Python thread (``TransformerLayerSchedulePlan.run``,
      ``megatron/core/models/common/model_chunk_schedule_plan.py``), so the forward's host sync also holds the
      backward's launches, which autograd would otherwise issue ahead: the pair takes at least both passes' host time;
    - ``moe_token_drop``: no sync serialises the passes, and this is the whole host bound of the layer."""
    if not (layout.moe_a2a_overlap or layout.moe_token_drop):
        return 0.0
    return max(0.0, sum(moe_host_passes_s(shape, layout, machine)) - busy)


@dataclass(slots=True)
class MoeLayerTime:
    """One MoE / MLA layer's terms beyond attention's core, for one micro-batch (seconds): ``gemm_forward`` the
    dense and expert GEMMs forward, ``elementwise`` / ``router`` / ``permute`` forward + backward,
    ``a2a_exposed`` the token exchanges left on the critical path."""

    gemm_forward: float
    elementwise: float
    router: float
    permute: float
    a2a_exposed: float


def moe_layer_time(shape: Shape, layout: ModelLayout, machine: Machine) -> MoeLayerTime:
    """The terms of one MoE / MLA layer that replace a dense layer's GEMM and element-wise terms."""
    arch = shape.arch
    gemm = dense_gemm_forward(shape, machine)
    if arch.num_experts:
        gemm += expert_gemm_forward(shape, layout, machine)
    return MoeLayerTime(
        gemm,
        moe_elementwise_time(shape, layout, machine),
        router_time(shape, machine),
        permute_time(shape, layout, machine),
        a2a_exposed(shape, layout, machine),
    )


def recomputed_modules(layout: ModelLayout) -> frozenset[str]:
    """The recompute modules whose forward selective recompute repeats (none unless ``recompute`` is selective)."""
    if layout.recompute != "selective":
        return frozenset()
    return frozenset(layout.recompute_modules.split(","))


def mla_up_proj_forward(shape: Shape, machine: Machine) -> float:
    """MLA's up-projections of one layer and micro-batch, forward: the query up-projection (``q_lora -> a·d_qk``)
    and the key-value one (``kv_lora -> a·(d_nope + d_v)``), split over TP, at the GEMM rate plus their outputs
    through HBM; what ``mla_up_proj`` repeats in the backward pass (Megatron-Core's ``MLASelfAttention``
    checkpoints ``linear_q_up_proj`` / ``linear_kv_up_proj`` on the latents it keeps)."""
    arch, t, T = shape.arch, shape.tp, shape.tokens
    if not arch.kv_lora_rank:
        return 0.0
    a = arch.num_attention_heads
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    q_up = (arch.q_lora_rank or 0) * a * qk
    kv_up = arch.kv_lora_rank * a * (arch.qk_nope_head_dim + arch.v_head_dim)
    weights = (q_up + kv_up) / t
    out = T * a * (qk + arch.qk_nope_head_dim + arch.v_head_dim) / t * 2.0
    return 2.0 * T * weights / machine.gemm_rate + (weights * machine.gemm_input_bytes + out) / machine.hbm_Bps


def moe_recompute_forward(shape: Shape, layout: ModelLayout, machine: Machine) -> float:
    """What selective recompute repeats of a MoE / MLA layer's modules in the backward pass (Megatron-Core's
    ``recompute_modules``, ``TransformerConfig``), one micro-batch: ``layernorm`` the two norms (read and write the
    hidden states, 8 bytes per element: with MoE the pre-MLP norm is a module of its own since it feeds the
    router); ``moe_act`` the routed copies' activation (SwiGLU reads ``2·F_e`` and writes ``F_e``, bf16);
    ``mla_up_proj`` MLA's up-projections (:func:`mla_up_proj_forward`); ``shared_experts`` the shared experts'
    GEMMs (``mlp`` recomputes a dense layer's MLP only, none of a MoE layer's); ``moe`` the whole MoE block's forward: the routed experts' GEMMs, the
    permutation's and the router's forward share and the forward token exchanges (dispatch and combine, half of
    :func:`a2a_time`, not overlapped). ``core_attn`` is priced with the dense layer's attention."""
    mods = recomputed_modules(layout)
    if not mods or mods == {"core_attn"}:
        return 0.0
    arch, P, T, t = shape.arch, machine.params, shape.tokens, shape.tp
    scale = P.elementwise_scale / machine.hbm_Bps
    total = 0.0
    if "layernorm" in mods:
        total += 2.0 * T * shape.hidden_sp * 8.0 * scale
    if "mla_up_proj" in mods:
        total += mla_up_proj_forward(shape, machine)
    if arch.num_experts and "shared_experts" in mods and arch.moe_shared_expert_size:
        total += 2.0 * T * mlp_factor(arch) * arch.hidden_size * arch.moe_shared_expert_size / t / machine.gemm_rate
    if not arch.num_experts:
        return total
    if "moe" in mods:
        fwd = expert_gemm_forward(shape, layout, machine) + 0.5 * a2a_time(shape, layout, machine)
        return total + fwd + (permute_time(shape, layout, machine) + router_time(shape, machine)) / 3.0
    if "moe_act" in mods:
        copies = arch.moe_topk * local_tokens(shape) * imbalance(layout, machine)
        total += copies * arch.expert_ffn * (6.0 if arch.gated_mlp else 4.0) * scale
    return total


def tp_collectives_per_layer(arch: ModelArch) -> float:
    """Tensor-parallel all-gathers / reduce-scatters of one layer, forward and backward: 8 for a dense layer (the
    attention's and the MLP's); a MoE layer's routed experts take their tokens from the sequence-parallel split
    (no TP collective), so only attention and the shared experts' TP MLP have them."""
    if not arch.num_experts:
        return 8.0
    return 8.0 if arch.moe_shared_expert_size else 4.0


# ---- memory ------------------------------------------------------------------------------------------------


# Megatron-Core's recompute_modules (TransformerConfig.recompute_modules, selective granularity) and the saved
# tensors each one gives up in a MoE / MLA layer (moe_layer_activation_bytes); core_attn gives up nothing under
# flash attention, which saves no scores
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")


def attention_kept_bytes(
    shape: Shape, layout: ModelLayout, recompute: str, modules: frozenset[str], split_in: float
) -> float:
    """The attention part of :func:`moe_layer_activation_bytes` (bytes per GPU and micro-batch): Q, K, V and the
    projection's input (MLA: its ``a·(2·d_qk + d_v)`` and the compressed latents, which ``mla_up_proj`` keeps alone),
    and flash attention's fp32 log-sum-exp per row and head, or unfused attention's s x s scores."""
    arch, t = shape.arch, shape.tp
    sb = shape.seq_length / shape.cp * shape.mbs
    a = arch.num_attention_heads
    qk, v = attention_core_dims(arch)
    if arch.kv_lora_rank:
        latents = 2.0 * sb * ((arch.q_lora_rank or 0) + arch.kv_lora_rank + arch.qk_rope_head_dim)
        qkv = 0.0 if "mla_up_proj" in modules else 2.0 * sb * a * (2.0 * qk + v) / t
        attn = qkv + 2.0 * sb * a * v / t + latents / split_in
    else:
        g = arch.num_query_groups
        attn = 2.0 * sb * (a + 2.0 * g) * qk / t + 2.0 * sb * a * v / t
    if not layout.unfused_attention:
        return attn + 4.0 * sb * a / t  # flash attention's fp32 log-sum-exp per row and head
    if recompute == "selective" and (not modules or "core_attn" in modules):
        return attn  # selective recompute of core attention gives the scores up
    local = layout.attention_backend == "local"
    if local and not arch.kv_lora_rank:  # the local spec's K and V repeated to every head (see memory.py)
        attn += 2.0 * sb * 2.0 * (a - arch.num_query_groups) * qk / t
    # unfused attention keeps the s x s scores, counted as a dense layer's are
    s = shape.seq_length / shape.cp
    kept = kept_score_bytes(layout.attention_backend == "unfused", layout.dropout, fp32_softmax=local)
    return attn + kept * a * s * sb / t


def moe_layer_activation_bytes(
    shape: Shape,
    layout: ModelLayout,
    fp8: bool,
    recompute: str = "none",
    modules: frozenset[str] = frozenset(),
    dense: bool = False,
) -> float:
    """Bytes one MoE / MLA layer keeps for its backward pass per GPU and micro-batch, counted as
    :func:`dse.perfmodel.memory.layer_activation_bytes` counts a dense one (Korthikanti et al. 2022), with
    flash attention: norms and GEMM inputs (split over TP with sequence parallelism), Q, K, V and the projection
    input (MLA: its ``a·(2·d_qk + d_v)`` and the compressed latents ``q_lora + kv_lora + d_rope``), the shared
    experts' MLP as a dense one, and per routed token copy (``k·T/tp`` of them) the expert input, the activation
    input, the fc2 input and its routing probability; the router's fp32 logits and scores (8 bytes per token and expert). Full recompute
    keeps the layer input only; selective keeps all but core attention's (the s x s scores of unfused attention;
    flash attention keeps only its log-sum-exp). ``modules`` are the
    recompute modules (:data:`RECOMPUTE_MODULES`) whose saved tensors are recomputed instead: ``layernorm`` the two
    norms' outputs (the GEMM inputs they feed), ``mla_up_proj`` MLA's Q, K and V (the latents stay),
    ``moe_act`` each routed copy's activation output, ``shared_experts`` the shared experts' MLP (``mlp`` a model
    without experts' MLP: Megatron-Core recomputes no MoE layer for it), ``moe`` the whole MoE MLP but its input.
    ``dense``: one of the model's first dense layers (``moe_first_dense_layers``, DeepSeek's three): its attention
    with a dense MLP of ``ffn_hidden_size``, which ``mlp`` recomputes."""
    arch, t = shape.arch, shape.tp
    sb = shape.seq_length / shape.cp * shape.mbs
    h = arch.hidden_size
    split_in = t if layout.sp else 1
    if recompute == "full":
        return 2.0 * sb * h / split_in
    low = 1.0 if fp8 else 2.0
    mask = 1.0 if layout.dropout else 0.0
    norms_out = 0.0 if "layernorm" in modules else low + low
    rep = sb * h * (4.0 + norms_out + 2.0 * mask) / split_in
    attn = attention_kept_bytes(shape, layout, recompute, modules, split_in)
    gate = 2.0 if arch.gated_mlp else 1.0
    # Megatron-Core's local layer spec (attention_backend "local") runs each MLP's activation as eager ops
    # (bias_activation_fusion off): a gated MLP keeps the SiLU's output and ``x_linear + glu_linear_offset`` besides
    # (2 bytes an element each; dse.perfmodel.memory.local_glu_bytes, the dense layers' count)
    local = layout.attention_backend == "local"
    eager_b = 4.0 if (local and arch.gated_mlp) else 0.0  # per element of the MLP's width
    mlp_b = 2.0 * gate + low + eager_b
    if dense or not arch.num_experts:
        return rep + attn + (0.0 if "mlp" in modules else sb * arch.ffn_hidden_size * mlp_b / t)
    # "mlp" recomputes only a dense layer's MLP (Megatron-Core's TransformerLayer: ``if not isinstance(self.mlp,
    # MoELayer): self.recompute_mlp = True``); a MoE layer's shared experts are "shared_experts"
    Fs, Fe = arch.moe_shared_expert_size, arch.expert_ffn
    shared = 0.0 if "shared_experts" in modules else sb * Fs * mlp_b / t
    if "moe" in modules:
        return rep + attn + shared
    copies = arch.moe_topk * sb / t
    act_out = 0.0 if "moe_act" in modules else low * Fe
    # Megatron-Core's experts (megatron/core/transformer/moe/experts.py, ``activation_func_with_probs``) weight each
    # copy by its routing probability inside the activation, so the unpermutation keeps no expert output: the
    # activation keeps its input and the copy's fp32 probability instead. On the local spec each expert is an MLP
    # (SequentialMLP) that multiplies its eager activation's output by the copy's fp32 probability (``per_token_scale``)
    # and casts the product back for fc2: the multiplication keeps that output too, so a copy keeps 3 bf16 tensors of
    # Fe elements beyond the fused kernel's (1 without a gate), unless "moe_act" recomputes the activation
    if local and "moe_act" not in modules:
        act_out += (eager_b + 2.0) * Fe
    routed = copies * (low * h + 2.0 * Fe * gate + act_out + 4.0)
    router = 8.0 * sb / t * arch.num_experts
    return rep + attn + shared + routed + router


@dataclass(slots=True)
class ExpertStages:
    """The routed experts' parameters on this GPU for the first, a middle and the last pipeline stage, and the
    expert-data-parallel size their optimizer state is sharded over."""

    first: float
    mid: float  # the second stage's
    last: float
    data_parallel: float
    later: float = 0.0  # a middle stage's after the second (no first dense layers there)

    @property
    def largest(self) -> float:
        return max(self.first, self.mid, self.later, self.last)


def mid_dense_layers(arch: ModelArch, layout: ModelLayout, stages: Stages) -> float:
    """The first dense layers (``moe_first_dense_layers``) that the second pipeline stage holds: those the first
    stage's first chunk has no room for, in the second stage's first chunk (Megatron-Core assigns the layers to the
    chunks in order: layers ``0 .. L/(p·v) - 1`` to the first stage's first chunk, the next ones to the second's).
    DeepSeek-V3's 8-layer slice on 4 stages holds layers 0 and 1 on the first and layer 2 (dense) and 3 on the
    second."""
    if not arch.num_experts or layout.pp < 3:
        return 0.0
    v = layout.vp
    return min(max(arch.moe_first_dense_layers - stages.first_layers / v, 0.0), stages.mid_layers / v)


def expert_stages(arch: ModelArch, layout: ModelLayout, stages: Stages) -> ExpertStages:
    """This GPU's routed-expert parameters per stage: the stage's MoE layers (the first dense layers sit on the
    first stage; the MTP layers on the last, where :meth:`dse.perfmodel.layout.Stages.of` already counts them in
    ``last_layers``) times one layer's experts over ``ep·etp``; and the expert-data-parallel size
    ``world / (pp·ep·etp)``."""
    if not arch.num_experts:
        return ExpertStages(0.0, 0.0, 0.0, 1.0)
    per_layer = expert_params(arch) / (layout.ep * layout.etp)
    dense = arch.moe_first_dense_layers
    if layout.pp == 1:
        n = arch.moe_layers + arch.mtp_layers
        first = mid = later = last = n * per_layer
    else:
        first = max(stages.first_layers - dense, 0.0) * per_layer
        mid = (stages.mid_layers - mid_dense_layers(arch, layout, stages)) * per_layer
        later = stages.mid_layers * per_layer
        last = stages.last_layers * per_layer
    d_e = layout.num_gpus / (layout.pp * layout.ep * layout.etp)
    return ExpertStages(first, mid, last, max(d_e, 1.0), later)
