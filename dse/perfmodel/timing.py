"""Time terms of a Megatron-style training step, and the physical parameters they depend on.

The parameters in :data:`DEFAULT_PARAMS` marked "fitted" come from ``bench/model_accuracy.py --fit``
(a least-squares fit in log space of tokens/s/GPU over ``bench/data/published_perf_calibration.tsv`` and four
held-out rows, ``FIT_EXTRA`` in that script: two long-context rows, one GB300 row and one MXFP8 row,
with priors that keep each parameter physical); the model never refits at import. The others are
fixed from measurements or documentation, as their comments say.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Params:
    """Efficiencies, overlap fractions and overheads shared by every GPU, model and layout."""

    # GEMMs: time = FLOPs / (peak · eff) + bytes / HBM bandwidth (a roofline sum, so that small GEMMs
    # such as those of high-TP layouts run at a lower fraction of peak).
    gemm_eff_bf16: float = 0.80  # fixed: 790 TFLOP/s of 989 for a large bf16 matmul measured on one H200
    gemm_eff_fp8: float = 0.609  # fitted: fraction of the dense FP8 peak that large FP8 GEMMs reach (Hopper)
    gemm_eff_fp8_blackwell: float = 0.548  # fitted: the same on Blackwell (B200, GB200, GB300)
    # flash attention (bf16): fraction of the bf16 peak over forward + backward (causal FLOPs, backward 2.5x the
    # forward), per architecture, since the kernels differ: Transformer Engine runs cuDNN's fused attention or
    # FlashAttention-3 on Hopper, cuDNN's Blackwell kernels on B200/GB200/GB300, FlashAttention-2 on Ampere
    attn_eff: float = 0.378  # fitted: Hopper
    # fitted: Blackwell, the tensor-core part only (the softmax exponentials are priced at the GPU table's
    # special-function-unit rate, so Blackwell Ultra's doubled SFUs speed GB300 up)
    attn_eff_blackwell: float = 0.52
    # fixed: FlashAttention-2 on A100 (Dao 2023, arXiv 2307.08691): forward + backward at 50-73% of the peak,
    # causal attention toward the low-middle of that range
    attn_eff_ampere: float = 0.56
    # fitted: Blackwell Ultra's (GB300) sustained tensor-core rate over GB200's at the same quoted dense peaks
    # (dse.hardware.GpuSpec.blackwell_ultra); fitted with one GB300 row (bench/model_accuracy.py FIT_EXTRA)
    ultra_tensor_ratio: float = 1.158
    # fitted: MXFP8 GEMMs' rate over per-tensor-scaled FP8 GEMMs' (Blackwell); fitted with one MXFP8 row (FIT_EXTRA)
    mxfp8_gemm_ratio: float = 0.944
    elementwise_scale: float = 1.51  # fitted: HBM traffic of norms, RoPE, SwiGLU, casts vs. the byte count
    # fitted: the host's (CPU's) time per transformer layer and micro-batch, forward + backward, of a step that is
    # not CUDA-graphed, on a Grace host (GB200, GB300): a layer shorter than this on the GPU waits for its
    # launches (model.predict_layout); fitted with one GB200 row (bench/model_accuracy.py FIT_EXTRA)
    host_layer_s_grace: float = 0.0115
    # HBM traffic of unfused attention's score kernels (scale-mask-softmax, dropout, their backward) vs. the
    # byte count of model.unfused_score_bytes; 1 as counted, refitted by ``dse calibrate`` for a stack
    unfused_scores_scale: float = 1.0
    nvlink_eff: float = 0.803  # fitted: NCCL bus bandwidth / one-way NVLink bandwidth
    scaleout_eff: float = 0.779  # fitted: NCCL bus bandwidth / NIC line rate
    tp_overlap: float = 0.738  # fitted: share of TP collectives hidden by userbuffers (tp_comm_overlap)
    cp_overlap: float = 0.698  # fitted: share of the context-parallel KV ring hidden behind attention
    dp_overlap: float = 0.796  # fitted: share of gradient reduce-scatter / parameter all-gather hidden
    # fixed
    tp_overlap_base: float = 0.25  # Megatron overlaps the backward all-gather / dgrad reduce with wgrad
    collective_latency_s: float = 10e-6  # per NCCL collective or send/recv (NCCL tests, small messages)
    layer_overhead_s: float = 60e-6  # kernel launches and small kernels per layer per micro-batch
    step_overhead_s: float = 0.010  # per step: data loader, loss reduction, logging, grad-norm all-reduce
    optimizer_bw_eff: float = 0.80  # Adam is memory-bound: share of HBM bandwidth it reaches
    host_link_eff: float = 0.80  # pinned-memory copies reach ~80% of the nominal PCIe / C2C rate (nvbandwidth)
    # share of a layer's compute that hides its activation offload (forward) or reload (backward): the copies
    # run on copy engines, asynchronously on a side stream (Transformer Engine's cpu_offload), and only
    # contend for HBM bandwidth
    offload_overlap: float = 0.90
    memory_reserve_gib: float = 3.0  # CUDA context, NCCL and cuBLAS / TE workspaces
    memory_fragmentation: float = 0.05  # allocator slack, as a share of the activation memory
    # a stack's constant memory difference (GiB, may be negative), learnt by ``dse calibrate`` from measured
    # peaks; 0 leaves the shipped model as it is
    memory_offset_gib: float = 0.0
    # fixed: bytes per logit element on the last stage at its peak, by the payload's loss (dse.perfmodel.stack).
    # 2: Megatron-Bridge's Llama providers set cross_entropy_fusion_impl="te" (Transformer Engine's parallel cross
    # entropy reads the bf16 logits and writes their gradient in place); Megatron's native loss, which
    # recipes.mcore runs, keeps an fp32 copy as well (2 + 4 = 6), and so does Megatron-Core's fused native one (its
    # fp32 softmax). A calibration file's [params] may set either; dse calibrate fits neither
    logits_bytes: float = 2.0
    logits_bytes_native: float = 6.0
    # mixture of experts (dse.perfmodel.moe), fitted by bench/model_moe.py --fit on its 18 published MoE rows of
    # container 26.04 (moe_a2a_eff and moe_flex_speedup end at their bounds: few rows run the NCCL all-to-all
    # across nodes, so the two are not separately determined; their product, the flex kernels' rate, is):
    # rows per expert at which a grouped expert GEMM runs at half the GEMM rate (prior: a few hundred, the tile
    # height times the waves a small per-expert problem leaves idle)
    moe_gemm_m_half: float = 1118.0
    # the token all-to-all's bandwidth over NCCL's ring bus bandwidth of the same links (prior 0.5-1: many small
    # messages to every peer)
    moe_a2a_eff: float = 0.2
    # the flex dispatcher's (DeepEP / HybridEP) bandwidth over the NCCL all-to-all's (prior 1-2: NVIDIA's reason
    # to ship it)
    moe_flex_speedup: float = 3.0
    # the share of the token exchanges hidden when moe_a2a_overlap runs one micro-batch's under another's compute
    moe_a2a_overlap: float = 0.887
    # fixed: the busiest expert-parallel rank's token copies over the mean; 1 = balanced, as NVIDIA's published
    # MoE rows force-balance the router (dse.perfmodel.moe); a real router's is learnt from one's runs
    moe_imbalance: float = 1.0
    # fixed: the launch of one expert's GEMM when the experts run one GEMM each (moe_grouped_gemm off)
    moe_gemm_launch_s: float = 10e-6
    # fitted: launches and small kernels of a MoE layer beyond a dense layer's (router, top-k, permutation
    # bookkeeping, the dispatcher's metadata), per micro-batch, forward + backward
    moe_layer_overhead_s: float = 1.50e-3

    def with_values(self, **kw) -> Params:
        return replace(self, **kw)


DEFAULT_PARAMS = Params()

FITTED = (
    "gemm_eff_fp8",
    "gemm_eff_fp8_blackwell",
    "attn_eff",
    "attn_eff_blackwell",
    "ultra_tensor_ratio",
    "mxfp8_gemm_ratio",
    "host_layer_s_grace",
    "elementwise_scale",
    "nvlink_eff",
    "scaleout_eff",
    "tp_overlap",
    "cp_overlap",
    "dp_overlap",
)
# the MoE parameters, fitted by bench/model_moe.py --fit on the published MoE rows (not by model_accuracy.py --fit,
# whose dense rows do not read them)
MOE_FITTED = ("moe_gemm_m_half", "moe_a2a_eff", "moe_flex_speedup", "moe_a2a_overlap", "moe_layer_overhead_s")
PARAM_NAMES = tuple(f.name for f in fields(Params))


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Pipeline bubble relative to the ideal time: (p-1)/m for 1F1B, (p-1)/(v·m) interleaved.

    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM" (arXiv 2104.04473), sections 2.2.1 and 2.2.2.
    """
    return (p - 1) / (v * max(m, 1))


def ring_time(nbytes: float, n: int, bw_Bps: float, latency_s: float) -> float:
    """One ring all-gather or reduce-scatter of an ``nbytes`` tensor over ``n`` ranks."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bw_Bps + latency_s
