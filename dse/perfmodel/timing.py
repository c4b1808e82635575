"""Time terms of a Megatron-style training step, and the physical parameters they depend on.

The parameters in :data:`DEFAULT_PARAMS` marked "fitted" come from ``bench/model_accuracy.py --fit``
(a least-squares fit in log space of tokens/s/GPU over ``bench/data/published_perf_calibration.tsv`` and some
held-out rows, ``fit_extra_ids()`` in that script: ``FIT_EXTRA``'s six (long-context, GB300, MXFP8, NVFP4, a Grace
host's launch time) and the Megatron-Bridge 26.02 and 26.04 rows, for the 26.x container family, with priors that keep
each parameter physical; ``FIT_FIXED`` names those it keeps); the model never refits at import. The others are
fixed from measurements or documentation, as their comments say.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Params:
    """Efficiencies, overlap fractions and overheads shared by every GPU, model and layout."""

    # GEMMs: time = FLOPs / (peak · eff · the share of the SMs their waves keep busy) + bytes / HBM bandwidth (a
    # roofline sum, so that small GEMMs such as those of high-TP layouts run at a lower fraction of peak;
    # dse.perfmodel.model.wave_utilisation).
    gemm_eff_bf16: float = 0.80  # fixed: 790 TFLOP/s of 989 for a large bf16 matmul measured on one H200
    # fixed: Blackwell's bf16 GEMMs reach the same fraction of their measured matmul ceiling as its FP8 GEMMs do of
    # theirs, so their efficiency is gemm_eff_fp8_blackwell (fitted on the published FP8 rows) times the ratio of
    # the two ceilings: the maximum achievable matmul FLOP/s measured on one B200 are 1,745 of 2,250 TFLOP/s in bf16
    # (77.6%) and 3,432.5 of 4,500 in FP8 (76.3%) (stas00/ml-engineering insights/when-to-upgrade-gpus/README.md @
    # 2d872ed2, the MAMF tables), 77.6 / 76.3 = 1.017. Hopper's bf16 rate is the matmul ceiling itself
    # (gemm_eff_bf16), as the published H100 bf16 rows bear out; on Blackwell the fitted FP8 rate is 72% of the FP8
    # ceiling (0.554 of 0.763) where Hopper's is 93% (0.680 of 0.734): training GEMMs there hold less of the
    # burst rate, and bf16's share is taken to be the same as FP8's. No published row is fitted to it
    bf16_over_fp8_eff_blackwell: float = 1.017
    gemm_eff_fp8: float = 0.6798  # fitted: fraction of the dense FP8 peak that large FP8 GEMMs reach (Hopper)
    gemm_eff_fp8_blackwell: float = 0.5542  # fitted: the same on Blackwell (B200, GB200, GB300)
    # flash attention (bf16): fraction of the bf16 peak over forward + backward (causal FLOPs, backward 2.5x the
    # forward), per architecture, since the kernels differ: Transformer Engine runs cuDNN's fused attention or
    # FlashAttention-3 on Hopper, cuDNN's Blackwell kernels on B200/GB200/GB300, FlashAttention-2 on Ampere
    # fitted: Hopper (prior centred on FlashAttention-2's H100 rate: dse.perfmodel.fit.PRIORS says why)
    attn_eff: float = 0.3485
    # fitted: Blackwell, the tensor-core part only (the softmax exponentials are priced at the GPU table's
    # special-function-unit rate, so Blackwell Ultra's doubled SFUs speed GB300 up); prior centred on cuDNN's B200
    # kernel rate (dse.perfmodel.fit.PRIORS says why); 0.557 while it was centred on FlashAttention-3's Hopper 0.5
    attn_eff_blackwell: float = 0.6365
    # fixed: FlashAttention-2 on A100 (Dao 2023, arXiv 2307.08691): forward + backward at 50-73% of the peak,
    # causal attention toward the low-middle of that range
    attn_eff_ampere: float = 0.56
    # fitted: Blackwell Ultra's (GB300) sustained tensor-core rate over GB200's at the same quoted dense peaks
    # (dse.facts.hardware.GpuSpec.blackwell_ultra); fitted with one GB300 row (bench/model_accuracy.py FIT_EXTRA)
    ultra_tensor_ratio: float = 1.182
    # fitted: MXFP8 GEMMs' rate over per-tensor-scaled FP8 GEMMs' (Blackwell); fitted with one MXFP8 row (FIT_EXTRA)
    mxfp8_gemm_ratio: float = 0.9206
    # fitted: fraction of the dense NVFP4 peak (dse.facts.hardware's fp4_tflops) that NVFP4 GEMMs reach (Blackwell; block
    # scales applied inside the tensor-core pipeline); fitted with the others on the Megatron-Bridge 26.02 and 26.04
    # NVFP4 rows (bench/model_accuracy.py FIT_CONTAINERS); those of 26.02.01, 26.04.01 and 26.06 are held out
    gemm_eff_nvfp4: float = 0.4255
    # fitted (kept at this value by the joint refit: bench/model_accuracy.py FIT_FIXED says why)
    elementwise_scale: float = 1.397  # fitted: HBM traffic of norms, RoPE, SwiGLU, casts vs. the byte count
    # fitted: the host's (CPU's) time per transformer layer and micro-batch, forward + backward, of a step that is
    # not CUDA-graphed, on a Grace host (GB200, GB300): a layer shorter than this on the GPU waits for its
    # launches (model.predict_layout); fitted with NeMo 25.04's GB200 405B row (bench/model_accuracy.py FIT_EXTRA)
    # and the 26.x rows that wait for the host (through container_host_bridge26 below). It was 11.4 ms while
    # Blackwell's bf16 GEMMs (the output layer of every FP8 run) ran at Hopper's share of the peak; with their own
    # rate (bf16_over_fp8_eff_blackwell) the refit ended at the prior's centre (3 ms, a lower MAP cost: 15.18 vs 15.87
    # at the old values), so few published layers wait for the host and graphs move a GB200 step little. The fit is
    # flat along it: after current scaling's amax pass (model.fp8_quant_bytes) a free refit lands at 11.4 ms again, at
    # a MAP cost of 16.02 against 16.05 with it held at 3 ms, so the refit now keeps it at its prior's centre
    # (bench/model_accuracy.py FIT_FIXED)
    host_layer_s_grace: float = 0.003
    # fitted: the software stack's efficiency per container family (dse.facts.containers), relative to the reference
    # family (Megatron-Bridge 25.x, the calibration table's containers): a factor on the tensor-core rates (GEMMs
    # and attention) that the family's kernels, libraries and framework reach. One per family, from the published
    # rows of its containers (bench/model_accuracy.py --fit); 1 for the reference and for rows of no known container
    container_eff_nemo24: float = 0.9658
    container_eff_nemo25: float = 0.8969
    container_eff_bridge26: float = 1.01
    # fitted: Blackwell Ultra's (GB300, B300) rate in the Megatron-Bridge 26.x containers over 25.x's, beyond the
    # family's factor above: the same GB300 Llama 3 70B layout went 4,520 -> 5,003 -> 5,243 tokens/s/GPU from
    # 25.11 to 26.02 to 26.04 while GB200's moved by a few percent either way (Megatron-Bridge
    # docs/performance-summary-archive.md): the newer containers' kernels for Blackwell Ultra
    container_ultra_bridge26: float = 1.017
    # fitted: the Megatron-Bridge 26.x containers' Grace host time per layer over the reference family's
    # (host_layer_s_grace, dse.facts.containers.ContainerFamily.host_param): the GB200 Llama 3 70B NVFP4 preset of 26.04,
    # not CUDA-graphed, steps in 6.69 s, under the 7.36 s that 20 layers x 32 micro-batches at the 25.x host time
    # would take, so the newer Transformer Engine / Megatron-Core launches less per layer; fitted with the 26.02 and
    # 26.04 NVFP4 rows whose layers wait for Grace (GB200 70B, GB300 405B; bench/model_accuracy.py FIT_CONTAINERS):
    # 26.02's sit near the 25.x time, 26.04's below it, and one factor per family lands between (0.93 at the 11.4 ms
    # host time; at its prior's centre with the host time at 3 ms, for which no fitted layer waits)
    container_host_bridge26: float = 0.9999
    # HBM traffic of unfused attention's score kernels (scale-mask-softmax, dropout, their backward) vs. the
    # byte count of model.unfused_score_bytes; 1 as counted, refitted by ``dse calibrate`` for a stack
    unfused_scores_scale: float = 1.0
    nvlink_eff: float = 0.7976  # fitted: NCCL bus bandwidth / one-way NVLink bandwidth
    scaleout_eff: float = 0.7955  # fitted: NCCL bus bandwidth / NIC line rate
    tp_overlap: float = 0.7427  # fitted: share of TP collectives hidden by userbuffers (tp_comm_overlap)
    cp_overlap: float = 0.6987  # fitted: share of the context-parallel KV ring hidden behind attention
    dp_overlap: float = 0.8106  # fitted: share of gradient reduce-scatter / parameter all-gather hidden
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
    # fixed, literature-based (not fitted: no published pair of rows differs in nccl_ub alone): NCCL user-buffer
    # registration (knob nccl_ub) lets the data-parallel collectives run zero-copy on NVLink SHARP inside an NVLink
    # domain; NVLS over ring bus bandwidth measured 480/370 = 1.30 on 8 H100 and 845/695 = 1.22 on 8 B300
    # (NVIDIA/nccl issue 2140, nccl-tests all-reduce); 1.25 between them. Across NICs the DP collectives stay
    # NIC-bound (no gain). The SMs it frees (4-5 instead of NCCL's usual channels, Megatron-Core's
    # DistributedDataParallelConfig.nccl_ub docstring) are not priced: the model charges overlapped DP traffic no SMs
    nccl_ub_nvls_gain: float = 1.25
    # fixed, an estimate (GiB per GPU): the registered parameter and gradient buffers are allocated by NCCL's
    # allocator outside PyTorch's pool, each rounded up to the multicast granularity for NVLS, and the NVLS
    # communicator holds buffers of its own (JAX-Toolbox PR 383 and NeMo-Framework-Launcher PR 127 turn NVLS off
    # to save memory); no published per-GPU figure, so half a GiB
    nccl_ub_memory_gib: float = 0.5
    memory_reserve_gib: float = 3.0  # CUDA context, NCCL and cuBLAS / TE workspaces
    memory_fragmentation: float = 0.05  # allocator slack, as a share of the activation memory
    # fixed prior, not fitted (no measured peak of a graphed run): what CUDA graphs' private memory pool adds, as a
    # share of the activations. Memory a graph allocates during capture stays in the graph's pool and is reused
    # only by the graphs that share it (PyTorch's CUDA graph pools, torch.cuda.graph_pool_handle; Megatron-Core's
    # cuda_graph_use_single_mempool), never by eager work between replays, so blocks freed inside the graphs are
    # not available to the optimizer step or the loss: twice the allocator's own fragmentation (0.05)
    cuda_graph_pool_share: float = 0.10
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
    # container 26.04, each with its preset's dispatcher, overlap, recompute modules and CUDA graphs, after the
    # first dense layers' activations and the head-size attention efficiency, and after the exchange's NIC phase
    # at one network plane, the overlap's unpaired warm-up and cool-down passes and the CUDA graphs' share of the
    # MoE layer's own small kernels (refit once more with those), after the dispatcher's host sync per MoE
    # layer forward (moe_host_fwd_s), and after the measured host time per local expert and backward-to-forward
    # host ratio below (moe_host_expert_fwd_s, moe_host_bwd_ratio), and after the bf16 grouped GEMMs' own ratio on
    # Blackwell and the published rows' bf16 gradients, and after Blackwell's own bf16 GEMM rate
    # (bf16_over_fp8_eff_blackwell; moe_gemm_bf16_blackwell_ratio fell from 8.1 to 4.4 with it), and after current
    # scaling's amax pass (model.fp8_quant_bytes) and the dense refit with it, and after the dense refit with Blackwell
    # attention's cuDNN prior (fit.PRIORS), and after the GEMMs' wave utilisation (model.wave_utilisation) and the
    # dense refit with it, with the MoE rows run in their containers' families (as the dense rows are; with them
    # MLA runs unfused on Blackwell in NeMo 25.0x, layout.attention_backend_run), and after the backward pass's
    # host bound (moe.moe_backward_host_wait: a MoE layer's backward takes at least moe_host_bwd_ratio times the
    # forward's host time): the least cost of 19 starts (bench/model_moe.py --starts), 0.0516 -> 0.0463 over the
    # fitted rows; the host's forward time fell 4.0 -> 2.5 ms and Grace's ratio 2.04 -> 1.45, where the forward's
    # sync alone had had to carry the backward's host time too
    # (moe_a2a_eff and moe_a2a_nic_eff end on the fit's bounds, 0.2 and 1.0, bench/model_moe.py BOUNDS, and
    # moe_flex_speedup outside its prior; the exchanges' parameters are the least determined: few fitted rows cross
    # the NIC, the dispatcher and the precision go together in them; docs/moe.md says what a fit inside the priors
    # costs):
    # rows per expert at which a grouped expert GEMM runs at half the GEMM rate (prior: a few hundred, the tile
    # height times the waves a small per-expert problem leaves idle; the fit with the host sync puts it above that:
    # per-micro-batch costs the model does not price end up here)
    moe_gemm_m_half: float = 968.2
    # fitted: the rows per expert at half rate of a bf16 grouped expert GEMM on Blackwell over moe_gemm_m_half (the
    # published Blackwell rows run MXFP8, whose grouped path Transformer Engine fuses, or bf16, whose GroupedLinear
    # goes through cuBLASLt's grouped matmul: TransformerEngine issue 2939, 8 B300 in bf16 at Mixtral's shapes,
    # about twice the time of a loop of per-expert GEMMs, its split-K plans launching 6 times the GEMM kernels).
    # Prior 1-16: 1 is "no slower than MXFP8's grouped path" (dse.perfmodel.moe.grouped_m_half)
    moe_gemm_bf16_blackwell_ratio: float = 4.131
    # the token all-to-all's bandwidth over NCCL's ring bus bandwidth of the same links (prior 0.5-1: many small
    # messages to every peer)
    moe_a2a_eff: float = 0.2
    # the all-to-all's bandwidth through the NIC (to peers outside the NVLink domain) over the NIC's line rate
    # (prior 0.5-1: a few large messages per remote peer, bandwidth-bound; the NVLink part's many small messages
    # are what hold moe_a2a_eff low)
    moe_a2a_nic_eff: float = 1.0
    # fixed: the line rate (Gb/s) of one network plane, the most a GPU's all-to-all uses of its NIC
    # (dse.perfmodel.moe.a2a_nic_Bps: a ConnectX-8's 800 Gb/s is two 400 Gb/s planes)
    moe_a2a_nic_plane_gbps: float = 400.0
    # the flex dispatcher's (DeepEP / HybridEP) bandwidth over the NCCL all-to-all's (prior 1-2: NVIDIA's reason
    # to ship it)
    moe_flex_speedup: float = 2.787
    # the share of the token exchanges hidden when moe_a2a_overlap runs one micro-batch's under another's compute,
    # over the passes the combined 1F1B schedule pairs (dse.perfmodel.moe.a2a_exposed)
    moe_a2a_overlap: float = 0.2225
    # fixed: the busiest expert-parallel rank's token copies over the mean; 1 = balanced, as NVIDIA's published
    # MoE rows force-balance the router (dse.perfmodel.moe); a real router's is learnt from one's runs
    moe_imbalance: float = 1.0
    # measured: what one expert's GEMM adds when the experts run one GEMM each (moe_grouped_gemm off: Megatron-
    # Core's SequentialMLP, a Python loop of slicing, fc1, activation and fc2 per expert, whose host time the GPU
    # waits for), forward (x3 with the backward). bench/moe_gpu_runs.py: the step time's slope over 8, 16 and 32
    # experts of the small MoE on one H200 with a Xeon host, recipes.mcore's local spec, 0.766 ms per expert,
    # MoE layer and micro-batch = 6 x 118.7 us (10 us, a bare launch, before it was measured; 0.779 ms over the
    # 5 such runs recorded since). The TE spec's SequentialMLP costs more than the grouped GEMM by 0.8-1.6 ms per
    # expert, layer and micro-batch at micro-batch 1-8 (the model: 0.5-0.6 ms). No published row runs without
    # grouped GEMMs, so no fit reads it. It is the host's time (moe.moe_host_forward_s: two per expert forward, four
    # backward at moe_host_bwd_ratio), added to the layer's other host time, no longer a gap in the GPU's
    moe_gemm_launch_s: float = 118.7e-6
    # fitted: launches and small kernels of a MoE layer beyond a dense layer's (router, top-k, permutation
    # bookkeeping, the dispatcher's metadata), per micro-batch, forward + backward, outside CUDA graphs (a graph
    # of the router and the dispatcher's preprocessing replays half of them: moe.moe_overhead_graphed_share)
    moe_layer_overhead_s: float = 0.0004664
    # fitted: an x86 host's time to launch one MoE layer's forward pass (attention and MoE block), per micro-batch,
    # outside CUDA graphs; the dispatcher's host sync makes each MoE layer's forward wait for it
    # (moe.moe_sync_wait). Prior 0.5-5 ms: a few hundred PyTorch ops at 5-15 µs
    moe_host_fwd_s: float = 0.002517
    # fitted: a Grace host's time for it over an x86 host's (prior 1-3: 2.75 per PyTorch op in a micro-benchmark,
    # 37.08 vs 13.48 µs on a Xeon 8480C, TransformerEngine issue 2053; less where the time is not the CPU's)
    moe_host_grace_ratio: float = 1.45
    # measured: what each expert a GPU holds adds to an x86 host's launch of a MoE layer's forward (TE's grouped
    # GEMM still passes every local expert's weights and row count from Python and launches per expert on Hopper).
    # bench/moe_gpu_runs.py: the step time's slope over 8, 16 and 32 experts of the small MoE on one H200 with its
    # Xeon host, Transformer Engine's spec with grouped GEMMs, micro-batch 2, whose steps wait for the host (GPU
    # busy 27%): 0.213 ms per expert, MoE layer and micro-batch, forward and backward; the forward's share taken
    # as its 2 of the 6 expert GEMMs a layer runs forward and backward
    moe_host_expert_fwd_s: float = 71e-6
    # measured: the host's time to launch a MoE layer's backward over its forward's: a backward pass takes at least
    # that (moe.moe_backward_host_wait), and the combined 1F1B schedule of moe_a2a_overlap holds it behind the
    # forward's sync (moe.moe_host_layer_wait). From the same
    # host-bound one-GPU runs: full recompute adds one forward's host time per MoE layer and micro-batch (3.6 ms
    # on the TE spec, 8.0 ms on the local spec), the step's slope over the micro-batches gives forward and
    # backward (12.1 ms and 19.5 ms; bench/moe_gpu_runs.py's host_split prints them): 2.4 and 1.4 times, 2.0
    # taken; the runs are short and noisy (the same TE point stepped in 534 and 689 ms), so this is a ratio, not a
    # time
    moe_host_bwd_ratio: float = 2.0

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
    "gemm_eff_nvfp4",
    "host_layer_s_grace",
    "container_eff_nemo24",
    "container_eff_nemo25",
    "container_eff_bridge26",
    "container_ultra_bridge26",
    "container_host_bridge26",
    "elementwise_scale",
    "nvlink_eff",
    "scaleout_eff",
    "tp_overlap",
    "cp_overlap",
    "dp_overlap",
)
# the MoE parameters, fitted by bench/model_moe.py --fit on the published MoE rows (not by model_accuracy.py --fit,
# whose dense rows do not read them)
MOE_FITTED = (
    "moe_gemm_m_half",
    "moe_gemm_bf16_blackwell_ratio",
    "moe_a2a_eff",
    "moe_a2a_nic_eff",
    "moe_flex_speedup",
    "moe_a2a_overlap",
    "moe_layer_overhead_s",
    "moe_host_fwd_s",
    "moe_host_grace_ratio",
)
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
