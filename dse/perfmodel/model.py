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

Memory: model states (:func:`memory.state_bytes_per_param`), activations of the in-flight micro-batches
of the first and last stage (:func:`memory.layer_activation_bytes`, :func:`memory.inflight_chunks`),
logits on the last stage, FSDP's unsharded layer buffers, a fixed reserve and fragmentation.

Layer placement: when ``num_layers`` is not divisible by ``pp·vp`` but ``num_layers + 2`` is, the embedding
and the loss count as one layer each (Megatron's ``account_for_embedding_in_pipeline_split`` and
``account_for_loss_in_pipeline_split``, used by NVIDIA's Llama 3.1 405B recipes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dse import knobs
from dse.perfmodel import flops as _flops
from dse.hardware import HARDWARE
from dse.perfmodel.memory import GIB, inflight_chunks, layer_activation_bytes, state_bytes_per_param
from dse.perfmodel.stack import (NVIDIA_RECIPES, Stack, cross_entropy_bytes, fp8_weight_cache_bytes, logits_peak_bytes,
                                 payload_stack)
from dse.perfmodel.timing import DEFAULT_PARAMS, Params


@dataclass(frozen=True)
class Prediction:
    """What the model says about one trial. ``tflops_per_gpu`` is model FLOPs in the chosen convention."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    peak_memory_gib: float
    gpu_memory_gib: float
    fits: bool
    breakdown: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
                                             "peak_memory_gib", "gpu_memory_gib", "fits")}
        out["breakdown"] = dict(self.breakdown)
        return out


def stage_layers(num_layers: int, p: int, v: int) -> tuple[float, float, float, bool]:
    """Transformer layers on the (first, middle, last) pipeline stage, and whether the embedding and
    the loss are counted as layers in the split (see the module docstring)."""
    if p <= 1:
        return float(num_layers), float(num_layers), float(num_layers), False
    pv = p * v
    if num_layers % pv and (num_layers + 2) % pv == 0:
        per_stage = (num_layers + 2) / p
        return per_stage - 1, per_stage, per_stage - 1, True
    per_stage = num_layers / p
    return per_stage, per_stage, per_stage, False


def offload_kept_layers(layers: float, offloaded: int) -> float:
    """Layers' activations held on the GPU at the peak when ``offloaded`` of ``layers`` go to host memory:
    the others, plus one layer of the offload double buffer (in flight to or from the host)."""
    n = min(offloaded, layers)
    return layers - n + (1.0 if n > 0 else 0.0)


UNFUSED_BACKENDS = ("unfused", "local")


def unfused_score_bytes(dropout: bool) -> tuple[float, float]:
    """HBM bytes per attention-score element of unfused attention (bf16), forward and backward.

    Forward: QKᵀ writes the scores (2), the fused scale-mask-softmax reads and writes them (4), P·V reads
    the probabilities (2); dropout adds a read, a write and a 1-byte mask (5). Backward: dO·Vᵀ writes dP
    (2), softmax backward reads dP and P and writes dS (6), dS·K and dSᵀ·Q read dS (4), Pᵀ·dO reads P (2);
    dropout backward reads dP and the mask and writes (5). Flash attention keeps all of this in SRAM.
    """
    drop = 5.0 if dropout else 0.0
    return 8.0 + drop, 14.0 + drop


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


def _group_bw(members: float, stride: float, domain: int, nvl_Bps: float, nic_Bps: float) -> float:
    """Bus bandwidth of a ring collective over ``members`` ranks ``stride`` apart.

    Inside one NVLink domain: NVLink. Across domains NCCL runs one ring per NIC, so the inter-domain
    hops carry 1/k of the data where k group members share a domain: ``min(NVLink, k · NIC)``.
    """
    if members * stride <= domain:
        return nvl_Bps
    k = min(members, domain // stride) if stride < domain else 1
    return min(nvl_Bps, max(k, 1) * nic_Bps)


def _exposed(comm: float, window: float) -> float:
    """The part of ``comm`` seconds of communication that ``window`` seconds of compute do not hide.

    ``comm²/(comm + window)``: nearly all of it when the window is short, about ``comm - window`` when it
    is much shorter than the communication, and a small remainder (first and last bucket) when it is long.
    """
    return comm * comm / (comm + window) if comm > 0.0 else 0.0


# HBM bytes per element of the MLP's intermediate (bf16, per token, forward + backward) that NVIDIA's Nemotron
# providers' eager squared ReLU (recipes.models.ModelArch.activation) moves beyond a fused activation's 12:
# forward relu (read 2, write 2) and pow (2, 2) = 8; backward autograd's pow_backward, grad * (2 * r.pow(1)):
# pow (2, 2), scale (2, 2), multiply (4, 2) = 14, and relu's threshold_backward (4, 2) = 6; 28 - 12 = 16. Its
# saved tensors (relu's output, shared by both backward functions) take the place of the fused kernel's input,
# so the activation memory does not change.
SQUARED_RELU_EXTRA_BYTES = 16.0

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

    Per-tensor scaling (``tensorwise``, ``delayed``, ``blockwise``): 4 B, the model's long-standing figure
    (read the bf16 value, 2 B; write one FP8 copy, 1 B; the amax / scale bookkeeping, about 1 B). MXFP8
    scales 32-element blocks along the GEMM's K dimension, so the transposed use of an operand (wgrad,
    dgrad) cannot reuse the row-wise copy: Transformer Engine writes a second, column-wise FP8 copy (1 B)
    and both copies carry E8M0 scales (1 B per 32 elements each).
    """
    if fp8_recipe == "mxfp8":
        return 4.0 + 1.0 + 2.0 / MX_BLOCK
    return 4.0


def predict(trial, *, flops_convention: str = "causal", params: Params = DEFAULT_PARAMS) -> Prediction:
    """The model's prediction for a resolved :class:`dse.trial.TrialConfig`.

    Never raises for a point that breaks a validity rule in a way the formulas survive (non-divisible
    sizes are taken as fractions); callers check ``dse.constraints`` first.
    """
    sysm = trial.system
    # every knob the model reads, by the catalogue's model_arg (dse.knobs): no knob is plumbed by hand here
    return predict_layout(
        trial.recipe.arch, sysm.gpu, num_gpus=trial.values["num_nodes"] * sysm.gpus_per_node,
        **knobs.model_args(trial.values), nvlink_domain=sysm.nvlink_domain,
        scaleout_gbps=sysm.scaleout_gbps, flops_convention=flops_convention, params=params,
        stack=payload_stack(getattr(trial, "payload", None)))


def predict_layout(arch, gpu: str, *, num_gpus: int, tp: int = 1, pp: int = 1, cp: int = 1, vp: int = 1,
                   mbs: int = 1, gbs: int = 128, seq_length: int = 4096, sp: bool | None = None,
                   recompute: str = "none", recompute_num_layers: int = 0, precision: str = "bf16",
                   fp8_recipe: str = "tensorwise", fsdp: bool = False, tp_comm_overlap: bool = False, cpu_offload_layers: int = 0,
                   attention_backend: str = "auto", dropout: bool | None = None,
                   nvlink_domain: int | None = None,
                   scaleout_gbps: float | None = None, flops_convention: str = "causal",
                   params: Params = DEFAULT_PARAMS, stack: Stack = NVIDIA_RECIPES) -> Prediction:
    """The model on plain values (what :func:`predict` reads from a trial). Sizes are per the knob names;
    ``stack`` is what the payload's code does beyond the knobs (:mod:`dse.perfmodel.stack`); ``dropout`` None
    takes the architecture's (``ModelArch.dropout``) on a stack that runs it (``Stack.arch_dropout``)."""
    P = params
    if dropout is None:
        dropout = stack.arch_dropout and arch.dropout > 0.0
    hw = HARDWARE[gpu]
    if sp is None:
        sp = tp > 1
    domain = hw.nvlink_domain if nvlink_domain is None else nvlink_domain
    nic_Bps = (hw.scaleout_gbps if scaleout_gbps is None else scaleout_gbps) * 1e9 / 8 * P.scaleout_eff
    nvl_Bps = hw.nvlink_gbps * 1e9 / 2 * P.nvlink_eff
    hbm_Bps = hw.hbm_gbps * 1e9
    lat = P.collective_latency_s
    fp8 = precision == "fp8" and hw.fp8_tflops is not None
    # NVIDIA's FP8 performance recipes reduce gradients in bf16 (grad_reduce_in_fp32=False); Megatron's
    # bf16 default accumulates and reduces them in fp32, and so does recipes.mcore in FP8 (dse.perfmodel.stack).
    grad_b = 2.0 if precision == "fp8" and not stack.fp8_grad_reduce_in_fp32 else 4.0
    # the tensor cores' sustained rate relative to the quoted dense peak: 1 except on Blackwell Ultra, whose
    # larger power budget keeps the clock up (dse.hardware.GpuSpec.blackwell_ultra; a fitted parameter)
    tensor_ratio = P.ultra_tensor_ratio if hw.blackwell_ultra else 1.0
    bf16_peak = hw.bf16_tflops * 1e12 * tensor_ratio
    attn_eff = {"blackwell": P.attn_eff_blackwell, "ampere": P.attn_eff_ampere}.get(hw.arch, P.attn_eff)
    if fp8:
        eff8 = P.gemm_eff_fp8_blackwell if hw.arch == "blackwell" else P.gemm_eff_fp8
        # MXFP8's GEMMs apply a scale per 32-element block inside the tensor-core pipeline (a fitted rate
        # ratio, Params.mxfp8_gemm_ratio); per-tensor recipes scale once per GEMM
        mx = P.mxfp8_gemm_ratio if fp8_recipe == "mxfp8" else 1.0
        g_rate, g_in = hw.fp8_tflops * 1e12 * tensor_ratio * eff8 * mx, 1.0
    else:
        g_rate, g_in = bf16_peak * P.gemm_eff_bf16, 2.0

    L, h, a, g, F, V = (arch.num_layers, arch.hidden_size, arch.num_attention_heads, arch.num_query_groups,
                        arch.ffn_hidden_size, arch.vocab_size)
    d = h / a
    gated = arch.gated_mlp
    t, p, c, vv, b, s = tp, pp, cp, vp, mbs, seq_length
    dp = num_gpus / (t * p * c)
    if dp < 1:
        dp = 1.0
    m = gbs / (b * dp)
    if m < 1:
        m = 1.0
    T = b * s / c  # tokens per micro-batch on one GPU (before the TP gather)
    h_sp = h / t if sp else h

    # ---- one transformer layer, one micro-batch, this GPU --------------------------------------------
    qkv_n = (a + 2 * g) * d / t
    fc1_n = (2 * F if gated else F) / t
    gemm_flops = 2.0 * T * h * (qkv_n + a * d / t + fc1_n + F / t)
    gemm_bytes = (T * (h + a * d / t + h + F / t) + h * (qkv_n + a * d / t + fc1_n + F / t)) * g_in \
        + 2.0 * T * (qkv_n + h + fc1_n + h)
    gemm_fwd = gemm_flops / g_rate + gemm_bytes / hbm_Bps
    unfused = attention_backend in UNFUSED_BACKENDS
    if unfused:
        # Megatron's unfused / local core attention: two batched GEMMs over the full s×s score matrix (the
        # causal mask is applied after QKᵀ, so nothing is skipped), and the scores go through HBM between
        # kernels: scale-mask-softmax, dropout, and their backward (bytes per score element, UNFUSED_SCORE_BYTES)
        scores = b * (a / t) * s * s / c  # score elements per micro-batch on this GPU
        attn_gemm = 4.0 * T * s * (a / t) * d / (bf16_peak * P.gemm_eff_bf16)
        fwd_b, bwd_b = unfused_score_bytes(dropout)
        attn_fwd = attn_gemm + scores * fwd_b * P.unfused_scores_scale / hbm_Bps
        attn_fb = 3.0 * attn_gemm + scores * (fwd_b + bwd_b) * P.unfused_scores_scale / hbm_Bps
    else:
        attn_tc = 2.0 * T * s * (a / t) * d / (bf16_peak * attn_eff)  # causal: half of 4·T·s·a·d
        # the softmax's exponentials on the special function units, in series with the tensor cores where the
        # GPU table gives their rate: one per causal score element (T·s·a/2t) forward, one more backward
        sfu = hw.sfu_exp_tera_per_s
        attn_exp = 0.5 * T * s * (a / t) / (sfu * 1e12) if sfu else 0.0
        # context parallelism: the ring's per-step partial outputs and gradients, merged through HBM
        merge_fwd = merge_bwd = 0.0
        if c > 1:
            q_fwd_b, q_bwd_b, kv_bwd_b = cp_merge_bytes(c)
            merge_fwd = T * (a / t) * d * q_fwd_b * P.elementwise_scale / hbm_Bps
            merge_bwd = T * d * ((a / t) * q_bwd_b + 2.0 * max(g / t, 1.0) * kv_bwd_b) * P.elementwise_scale / hbm_Bps
        attn_fwd = attn_tc + attn_exp + merge_fwd
        # backward: 2.5x the forward's GEMMs (recomputes the scores)
        attn_fb = 3.5 * attn_tc + 2.0 * attn_exp + merge_fwd + merge_bwd
    elem_bytes = 60.0 * h_sp + 12.0 * (a + g) * d / t + (18.0 if gated else 12.0) * F / t
    if stack.arch_activation and arch.activation == "squared_relu":
        elem_bytes += SQUARED_RELU_EXTRA_BYTES * F / t
    if dropout:  # hidden dropout in the two bias-dropout-add kernels: 1-byte masks (HIDDEN_DROPOUT_BYTES)
        elem_bytes += HIDDEN_DROPOUT_BYTES * h_sp
    if fp8:
        elem_bytes += fp8_quant_bytes(fp8_recipe) * (2 * h_sp + (a * d + F + (a + 2 * g) * d) / t + fc1_n)
    elem = T * elem_bytes * P.elementwise_scale / hbm_Bps  # forward + backward
    compute = 3.0 * gemm_fwd + attn_fb + elem + P.layer_overhead_s

    # tensor parallel: 4 all-gather/reduce-scatter (or 2 all-reduce) forward and as many backward
    tp_bw = nvl_Bps if t <= domain else nic_Bps
    tp_one = (t - 1) / t * T * h * 2.0 / tp_bw + lat if t > 1 else 0.0
    tp_hidden = P.tp_overlap if (tp_comm_overlap and t > 1) else P.tp_overlap_base
    tp_exposed = 8.0 * tp_one * (1.0 - tp_hidden)

    # context parallel: K and V go round the ring forward; K, V and their gradients backward
    if c > 1:
        cp_bw = nvl_Bps if t * c <= domain else nic_Bps
        kv_bytes = T * 2.0 * max(g / t, 1.0) * d * 2.0
        cp_comm = 3.0 * (c - 1) * (kv_bytes / cp_bw + lat)
        cp_exposed = _exposed(cp_comm, P.cp_overlap * attn_fb)
    else:
        cp_exposed = 0.0

    # recompute
    if recompute == "selective":
        rec = attn_fwd
    elif recompute == "full":
        chunk_layers = L / (p * vv)
        frac = min(recompute_num_layers / chunk_layers, 1.0) if recompute_num_layers else 1.0
        rec = frac * (gemm_fwd + attn_fwd + elem / 3.0 + 4.0 * tp_one * (1.0 - tp_hidden))
    else:
        rec = 0.0
    t_layer = compute + tp_exposed + cp_exposed + rec
    # the host: every kernel of a layer is launched by Python (TE's modules, autograd, Megatron's hooks), and the GPU
    # cannot run ahead of its launches, so a layer takes at least the host's time for it. Grace costs ~2.75x an x86
    # host per PyTorch op (TransformerEngine issue 2053: 37.08 vs 13.48 µs on a Xeon 8480C); on x86 the host
    # time stays under the layers the model is used for (the H200 TE runs, bench/h200_te_runs.py, are within 6.2% at
    # 3.4 ms layers), so the term applies to Grace hosts only, and not to a CUDA-graphed step (Stack.cuda_graphs)
    host = P.host_layer_s_grace if hw.grace_host and not stack.cuda_graphs else 0.0
    host_wait = max(0.0, host - t_layer)
    t_layer += host_wait

    # activation offloading (Megatron-Core cpu_offloading; pp=1 and no recompute, see dse.constraints): each
    # offloaded layer's activations go to host memory during its forward and come back during its backward,
    # one layer ahead (Transformer Engine's double-buffered offload handler), behind that layer's compute
    # attention_backend "unfused" is Transformer Engine's UnfusedDotProductAttention, whose softmax is one fused
    # kernel (memory.layer_activation_bytes, fused_softmax); "local" is Megatron's own, counted as Korthikanti does
    act_kw = dict(sp=sp, g=g, ffn=F, gated=gated, flash_attention=not unfused, dropout=dropout, fp8=fp8,
                  fused_softmax=attention_backend == "unfused")
    act_layer = layer_activation_bytes(s / c, b, h, a, t, recompute="none", **act_kw)
    n_off = min(cpu_offload_layers, L)
    t_copy = act_layer / (hw.host_link_gbps * 1e9 * P.host_link_eff)
    t_offload = n_off * (max(0.0, t_copy - P.offload_overlap * t_layer / 3.0)
                         + max(0.0, t_copy - P.offload_overlap * 2.0 * t_layer / 3.0))

    # ---- stages -------------------------------------------------------------------------------------
    first_l, mid_l, last_l, accounted = stage_layers(L, p, vv)
    logits_flops = 2.0 * T * h * V / t
    logits_gemm = logits_flops / (bf16_peak * P.gemm_eff_bf16) \
        + ((T * h + h * V / t) * 2.0 + 2.0 * T * V / t) / hbm_Bps
    ce = T * V / t * cross_entropy_bytes(stack) * P.elementwise_scale / hbm_Bps  # the payload's loss
    t_logits = 3.0 * logits_gemm + ce + (2.0 * tp_one if sp and t > 1 else 0.0)
    t_mb = max(mid_l * t_layer, last_l * t_layer + t_logits, first_l * t_layer + t_offload)
    if p == 1:
        t_mb = L * t_layer + t_logits + t_offload

    # ---- pipeline -----------------------------------------------------------------------------------
    bubble = (p - 1) / vv * t_mb
    t_pipe = m * t_mb + bubble
    if p > 1:
        stride = t * c * dp
        pp_bw = nvl_Bps if stride < domain else nic_Bps  # one send/recv pair: one link or one NIC
        t_p2p = T * h_sp * 2.0 / pp_bw + lat
        # 1F1B sends and receives between micro-batches (blocking); the interleaved schedule overlaps
        # them with the next chunk's compute (Megatron's overlap_p2p_comm), hiding all but a remainder.
        per = _exposed(t_p2p, t_mb / (3.0 * vv)) if vv > 1 else t_p2p
        pp_comm = 2.0 * m * vv * per + 2.0 * (p - 1) * t_p2p
    else:
        pp_comm = 0.0

    # ---- data parallel and optimizer ----------------------------------------------------------------
    lp = _flops.layer_params(arch)
    emb = V * h
    if p == 1:
        stage_params = L * lp + 2 * emb
        first_params = last_params = stage_params
    else:
        first_params = first_l * lp + emb
        last_params = last_l * lp + emb
        stage_params = max(first_params, mid_l * lp, last_params)
    p_local = stage_params / t
    d_r = dp * c
    dp_bw = _group_bw(d_r, t, domain, nvl_Bps, nic_Bps)
    if d_r > 1:
        frac_r = (d_r - 1) / d_r
        if fsdp:  # all-gather weights (bf16) forward and backward, reduce-scatter gradients, per micro-batch
            comm_mb = frac_r * p_local * (4.0 + grad_b) / dp_bw + 3 * L / p * lat
            dp_exposed = m * _exposed(comm_mb, P.dp_overlap * t_mb)
        else:  # reduce-scatter gradients and all-gather bf16 weights, once per step
            comm = frac_r * p_local * (2.0 + grad_b) / dp_bw + 2 * lat
            dp_exposed = _exposed(comm, P.dp_overlap * t_mb)
    else:
        dp_exposed = 0.0
    t_opt = p_local / d_r * 36.0 / (hbm_Bps * P.optimizer_bw_eff)
    # without gradient-accumulation fusion (recipes.mcore, dse.perfmodel.stack) every weight gradient of every
    # micro-batch is written as its own bf16 tensor (2 B) and then added to the gradient buffer by Megatron's
    # DDP hook (param.main_grad.add_(param.grad): read 2, read and write grad_b each), memory-bound like Adam,
    # on the slowest stage's parameters; NVIDIA's recipes fuse it into the wgrad GEMM (no term)
    t_gacc = 0.0 if stack.grad_accumulation_fusion else \
        m * p_local * (4.0 + 2.0 * grad_b) / (hbm_Bps * P.optimizer_bw_eff)
    step = t_pipe + pp_comm + dp_exposed + t_opt + t_gacc + P.step_overhead_s

    # ---- memory -------------------------------------------------------------------------------------
    s_loc = s / c
    if recompute == "none":
        act_kept = act_layer
    elif recompute == "selective":
        act_kept = layer_activation_bytes(s_loc, b, h, a, t, recompute="selective", **act_kw)
    else:
        full_l = layer_activation_bytes(s_loc, b, h, a, t, recompute="full", **act_kw)
        chunk_layers = L / (p * vv)
        n_rec = min(recompute_num_layers, chunk_layers) if recompute_num_layers else chunk_layers
        act_kept = (n_rec * full_l + (chunk_layers - n_rec) * act_layer) / chunk_layers
    mi = int(m)
    chunk_l = (first_l + (1 if accounted else 0)) / vv  # layers per model chunk (units when accounted)
    counts = inflight_chunks(p, vv, mi, 0)
    first_layers = sum(counts) * chunk_l - (counts[0] if accounted else 0)
    if p > 1:
        counts_last = inflight_chunks(p, vv, mi, p - 1)
        last_layers = sum(counts_last) * chunk_l - (counts_last[-1] if accounted else 0)
    else:
        last_layers = first_layers
    first_layers, last_layers = (offload_kept_layers(x, n_off) for x in (first_layers, last_layers))
    logits_mem = T * V / t * logits_peak_bytes(stack, P)
    # FP8 recipes gather FP8 weights (fp8_param_gather), one byte per parameter
    weight_b = 1.0 if fp8 and stack.fp8_param_gather else 2.0
    # without fp8_param_gather, Transformer Engine's FP8 copy and transpose of every linear weight of the
    # stage's layers, kept for the whole step (dse.perfmodel.stack)
    lin_layer = h * (qkv_n + a * d / t + fc1_n + F / t)  # linear weight elements of one layer on this GPU
    cache_b = fp8_weight_cache_bytes(fp8, stack) * lin_layer
    cache_first = (L if p == 1 else first_l) * cache_b
    cache_last = (L if p == 1 else last_l) * cache_b
    states_b = state_bytes_per_param(d_r if d_r > 1 else 1, fsdp=fsdp, grad_bytes=grad_b, weight_bytes=weight_b)
    fsdp_buf = fsdp_buffer_bytes(lp / t, h * fc1_n, weight_b, grad_b) if fsdp else 0.0
    # the backward pass of one layer needs its full activations and their gradients; unfused attention's
    # backward holds two score-sized gradients besides (dP and dS, bf16: 4 bytes per score element)
    work = act_layer + (4.0 * b * (a / t) * s_loc * s_loc if unfused else 0.0)
    # The logits live at the end of the forward pass and are gone (the loss's backward) before the first
    # layer's backward needs its working set: the last stage peaks at the larger of the two.
    act_first = first_layers * act_kept + work
    act_last = last_layers * act_kept + max(work, logits_mem)
    mem_first = first_params / t * states_b + cache_first + fsdp_buf + act_first * (1.0 + P.memory_fragmentation)
    mem_last = last_params / t * states_b + cache_last + fsdp_buf + act_last * (1.0 + P.memory_fragmentation)
    peak_b = max(mem_first, mem_last)
    peak = peak_b / GIB + P.memory_reserve_gib + P.memory_offset_gib
    cap = hw.memory_gib

    tokens = gbs * s / (step * num_gpus)
    mf = _flops.model_flops_per_step(arch, gbs, s, flops_convention)
    breakdown = {
        "time.layer_compute_s": m * (first_l if p == 1 else mid_l) * compute,
        "time.host_wait_s": m * (first_l if p == 1 else mid_l) * host_wait,
        "time.tp_exposed_s": m * mid_l * tp_exposed,
        "time.cp_exposed_s": m * mid_l * cp_exposed,
        "time.recompute_s": m * mid_l * rec,
        "time.logits_s": m * t_logits,
        "time.bubble_s": bubble,
        "time.pp_p2p_s": pp_comm,
        "time.dp_exposed_s": dp_exposed,
        "time.optimizer_s": t_opt,
        "time.grad_accumulation_s": t_gacc,
        "time.offload_exposed_s": m * t_offload,
        "time.overhead_s": P.step_overhead_s,
        "mem.states_gib": max(first_params, last_params) / t * states_b / GIB,
        "mem.activations_gib": max(act_first, act_last - logits_mem) / GIB,
        "mem.logits_gib": logits_mem / GIB,
        "mem.fsdp_buffers_gib": fsdp_buf / GIB,
        "mem.fp8_weight_cache_gib": max(cache_first, cache_last) / GIB,
        "mem.reserve_gib": P.memory_reserve_gib + P.memory_offset_gib + max(act_first, act_last) * P.memory_fragmentation / GIB,
        "time.per_microbatch_s": t_mb,
        "microbatches": m,
        "bubble_fraction": (p - 1) / (vv * m),
    }
    return Prediction(step_time_s=step, tokens_per_s_per_gpu=tokens, tflops_per_gpu=mf / (step * num_gpus) / 1e12,
                      peak_memory_gib=peak, gpu_memory_gib=cap, fits=peak <= cap, breakdown=breakdown)
