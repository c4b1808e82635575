"""What the model's terms read: the layout (``predict_layout``'s keyword arguments, by their names), the sizes
of one micro-batch on one GPU that it gives, and the GPU's rates under the fitted parameters.

Computed once per prediction, so that each term of :mod:`dse.perfmodel.model` and :mod:`dse.perfmodel.memory`
is a small function of these three values instead of a share of one long body. They are slotted dataclasses,
built once per prediction and never changed afterwards; not frozen, because a frozen dataclass takes about twice
as long to build and the model's throughput is a goal (bench/model_speed.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from dse.facts import knobs
from dse.facts.containers import FAMILIES, REFERENCE
from dse.facts.hardware import GpuSpec
from dse.facts.knobs import ModelKnobs
from dse.perfmodel.flops import layer_params, mlp_factor
from dse.perfmodel.stack import Stack
from dse.perfmodel.timing import Params
from dse.recipes.models import ModelArch

# NVFP4 (Transformer Engine's NVFP4BlockScaling): E2M1 values, half a byte each, and one E4M3 scale byte per
# 16-element block (a per-tensor FP32 scale besides, negligible): bytes per element of one quantised copy
NVFP4_BLOCK = 16
NVFP4_ELEMENT_BYTES = 0.5 + 1.0 / NVFP4_BLOCK

# attention backends that run Megatron's or Transformer Engine's unfused core attention (scores through HBM)
UNFUSED_BACKENDS = ("unfused", "local")


def kept_score_bytes(fused_softmax: bool, dropout: bool, fp32_softmax: bool = False) -> float:
    """Bytes unfused attention keeps for its backward pass per s x s score element: the fused scale-mask-softmax's
    bf16 output (2), plus the dropout mask and output (3) with attention dropout; Korthikanti's 5 for a 16-bit
    softmax without a fused kernel. ``fp32_softmax``: Megatron's local attention (``attention_backend=local``:
    ``DotProductAttention`` through ``FusedScaleMaskSoftmax.forward_torch_softmax``, which upcasts the scores and
    runs ``torch.softmax`` in fp32, ``attention_softmax_in_fp32`` being Megatron's default): the fp32 softmax
    output that its backward reads (4) and the bf16 probabilities the P·V GEMM keeps (2); with attention dropout the
    dropout's mask (1) and output (2) replace the probabilities the GEMM keeps: 7. A dense layer and a MoE layer
    (dse.perfmodel.moe.attention_kept_bytes) count the scores with it."""
    if fp32_softmax:
        return 4.0 + 2.0 + (1.0 if dropout else 0.0)
    if fused_softmax:
        return 2.0 + 3.0 * (1.0 if dropout else 0.0)
    return 5.0


# The working set of Megatron's local attention's backward per s x s score element (bytes), at its peak, the
# softmax's backward: the fp32 softmax output it reads (4), the fp32 gradient the bf16 cast hands it (4) and its fp32
# result (4), which an op-by-op count of PyTorch's autograd names, and 4 more that the count does not name but the
# runs measure: the real one-H100 runs of recipes.mcore (bench/h100_mcore_grid.py: seq 4096, micro-batch 1, 2 and 4)
# peak at 19.7 (no recompute), 10.7 (selective) and 8.4 GiB (full) per sample above their model states, and only
# 16 bytes per score element at the softmax's backward fits all three (within 0.5 GiB per sample; 12 misses each
# by 2 GiB per sample). Measured, not fitted: no parameter of the model moves it.
LOCAL_SOFTMAX_BACKWARD_BYTES = 16.0
# Megatron's DotProductAttention multiplies Q·K^T into a preallocated bf16 buffer of one layer's scores
# (parallel_state.get_global_memory_buffer(), "mpu"): it is allocated once and kept for the whole run, 2 bytes per
# score element of one layer and micro-batch (the runs' allocation between iterations grows by 1 GiB per sample)
LOCAL_SCORE_BUFFER_BYTES = 2.0


# The share of one transformer layer's kernel launches in each part Megatron-Core can graph
# (megatron/core/transformer/transformer_layer.py: ``_forward_attention`` is the input norm, QKV GEMM, RoPE, core
# attention, projection and residual; ``_forward_mlp`` the pre-MLP norm, fc1, activation, fc2 and residual: about
# as many kernels and autograd nodes each, so half a layer's host time each). "full" (the whole layer) and
# "full_iteration" (the whole forward-backward) capture every launch of the layer. The MoE parts split the MLP
# half: the router (gating GEMM, top-k, aux loss) and its preprocessing (the dispatcher's permutation metadata);
# the experts' own GEMMs and the token exchange stay outside those graphs.
GRAPH_PART_SHARE = {
    "full": 1.0,
    "full_iteration": 1.0,
    "attn": 0.5,
    "mlp": 0.5,
    "moe": 0.5,
    "moe_router": 0.15,
    "moe_preprocess": 0.1,
    "mamba": 0.5,
}


def graph_captured_share(cuda_graph: str, cuda_graph_scope: str) -> float:
    """The share (0-1) of a layer's kernel launches inside a CUDA graph: 0 without graphs, else the sum of the
    scope's parts (:data:`GRAPH_PART_SHARE`, a comma-joined scope as ``dse.facts.knobs.CUDA_GRAPH_SCOPES`` spells it),
    at most 1."""
    if cuda_graph == "none":
        return 0.0
    return min(1.0, sum(GRAPH_PART_SHARE.get(part, 0.0) for part in cuda_graph_scope.split(",")))


@dataclass(slots=True, kw_only=True)
class ModelLayout(ModelKnobs):
    """The layout and options of one prediction: the knobs the model reads, each a field named as its knob with the
    knob's default (:class:`dse.facts.knobs.ModelKnobs`: the catalogue's ``model_arg`` knobs), and what the system
    gives. ``sp`` left unset takes its derived default (``dse.facts.knobs.effective``); ``tp_comm_overlap`` left unset
    is off (a trial's is settled by ``dse.facts.knobs.settle``). ``nvlink_domain`` and ``scaleout_gbps`` None take the
    GPU's defaults. ``container`` is the software stack's family (:data:`dse.facts.containers.FAMILIES`); ``pod_gpus``,
    ``pod_oversubscription`` and ``rank_order`` describe the fabric above the NVLink domain
    (:func:`dse.perfmodel.model.dp_exposed_time`)."""

    num_gpus: int
    dropout: bool = False
    nvlink_domain: int | None = None
    scaleout_gbps: float | None = None
    container: str = REFERENCE
    # GPUs of one non-blocking pod of the scale-out fabric (None: non-blocking at any size), the oversubscription
    # of the layer above the pods (1: none), and Megatron-Core's order of the parallel groups over the ranks
    # (parallel_state.initialize_model_parallel(order=...): "tp-cp-dp-pp", its default, or "tp-cp-pp-dp", data
    # parallelism outermost, as Meta's Llama 3 runs placed it)
    pod_gpus: int | None = None
    pod_oversubscription: float = 1.0
    rank_order: str = "tp-cp-dp-pp"

    def __post_init__(self) -> None:
        if self.sp is None:
            self.sp = knobs.effective("sp", {"tp": self.tp})

    def recomputes(self, module: str) -> bool:
        """Whether selective recompute recomputes ``module`` (a name of Megatron-Core's ``recompute_modules``)."""
        return self.recompute == "selective" and module in self.recompute_modules.split(",")

    @property
    def graph_share(self) -> float:
        """The share of a layer's kernel launches that a CUDA graph captures (:func:`graph_captured_share`)."""
        return graph_captured_share(self.cuda_graph, self.cuda_graph_scope)

    @property
    def unfused_attention(self) -> bool:
        """Core attention through HBM (Megatron's or TE's unfused kernels) instead of flash attention."""
        return self.attention_backend in UNFUSED_BACKENDS


@dataclass(slots=True)
class Shape:
    """One micro-batch of one transformer layer on one GPU: the architecture's sizes after the layout's split.

    ``tokens`` are a micro-batch's tokens on this GPU before the TP gather (``mbs · seq / cp``); ``hidden_sp`` the
    hidden width an element-wise kernel sees (split over TP with sequence parallelism); ``qkv_cols`` and
    ``fc1_cols`` the output columns of the QKV and first MLP GEMMs on this GPU.
    """

    arch: ModelArch
    tp: int
    pp: int
    cp: int
    vp: int
    mbs: int
    seq_length: int
    data_parallel: float
    microbatches: float
    tokens: float
    head_dim: float
    hidden_sp: float
    qkv_cols: float
    fc1_cols: float

    @classmethod
    def of(cls, arch: ModelArch, layout: ModelLayout) -> Shape:
        """The shape of ``layout``; a data-parallel size or micro-batch count below 1 is taken as 1."""
        t, a, g, ffn = layout.tp, arch.num_attention_heads, arch.num_query_groups, arch.ffn_hidden_size
        head_dim = arch.hidden_size / a
        dp = layout.num_gpus / (t * layout.pp * layout.cp)
        if dp < 1:
            dp = 1.0
        m = layout.gbs / (layout.mbs * dp)
        if m < 1:
            m = 1.0
        return cls(
            arch=arch,
            tp=t,
            pp=layout.pp,
            cp=layout.cp,
            vp=layout.vp,
            mbs=layout.mbs,
            seq_length=layout.seq_length,
            data_parallel=dp,
            microbatches=m,
            tokens=layout.mbs * layout.seq_length / layout.cp,
            head_dim=head_dim,
            hidden_sp=arch.hidden_size / t if layout.sp else arch.hidden_size,
            qkv_cols=(a + 2 * g) * head_dim / t,
            fc1_cols=(2 * ffn if arch.gated_mlp else ffn) / t,
        )

    @property
    def attn_cols(self) -> float:
        """Attention heads' columns on this GPU (the projection GEMM's input width)."""
        return self.arch.num_attention_heads * self.head_dim / self.tp

    @property
    def kv_groups(self) -> float:
        """Key/value head groups on this GPU (at least one: a group is replicated when tp exceeds them)."""
        return max(self.arch.num_query_groups / self.tp, 1.0)


@dataclass(slots=True)
class Machine:
    """The GPU's rates under the fitted parameters, in bytes or FLOPs per second, and its NVLink domain."""

    gpu: GpuSpec
    params: Params
    nvlink_domain: int
    nic_Bps: float
    nvlink_Bps: float
    hbm_Bps: float
    latency_s: float
    fp8: bool  # the GEMM inputs are quantised (FP8 or NVFP4): saved in one byte, cast by element-wise kernels
    fp4: bool  # ... and the GEMMs run in NVFP4
    bf16_peak: float
    attn_eff: float
    gemm_rate: float
    gemm_input_bytes: float
    bf16_gemm_rate: float  # bf16 GEMMs (the output layer, unfused attention, a bf16 run's linear layers), FLOP/s

    @classmethod
    def of(cls, gpu: GpuSpec, params: Params, layout: ModelLayout) -> Machine:
        """Rates for ``layout``'s precision on ``gpu``: NVFP4 or FP8 GEMMs where the GPU has them, bf16 otherwise.

        NVFP4 (precision=nvfp4): every linear layer's three GEMMs (fprop, dgrad, wgrad) at the dense FP4 peak times
        the fitted ``gemm_eff_nvfp4``, reading half a byte per element plus the block scales; core attention and the
        output layer stay in bf16 (Megatron-Bridge's bf16_with_nvfp4_mixed quantises Transformer Engine's linear
        layers only, and NVIDIA's Llama presets keep no layer in bf16: no first_last_layers_bf16)."""
        P = params
        domain = gpu.nvlink_domain if layout.nvlink_domain is None else layout.nvlink_domain
        scaleout = gpu.scaleout_gbps if layout.scaleout_gbps is None else layout.scaleout_gbps
        fp8 = uses_fp8(gpu, layout)
        fp4 = uses_nvfp4(gpu, layout)
        # the tensor cores' sustained rate relative to the quoted dense peak: 1 except on Blackwell Ultra, whose
        # larger power budget keeps the clock up (dse.facts.hardware.GpuSpec.blackwell_ultra; a fitted parameter), times
        # what the container family's software reaches (container_efficiency)
        sw, sw_ultra = container_efficiency(P, layout.container, gpu.arch)
        tensor_ratio = (P.ultra_tensor_ratio * sw_ultra if gpu.blackwell_ultra else 1.0) * sw
        bf16_peak = gpu.bf16_tflops * 1e12 * tensor_ratio
        bf16_gemm = bf16_peak * bf16_gemm_efficiency(P, gpu.arch)
        if fp4 and gpu.fp4_tflops is not None:
            gemm_rate, gemm_in = gpu.fp4_tflops * 1e12 * tensor_ratio * P.gemm_eff_nvfp4, NVFP4_ELEMENT_BYTES
        elif fp8 and gpu.fp8_tflops is not None:  # (fp8 implies it; said again for the type checker)
            eff8 = P.gemm_eff_fp8_blackwell if gpu.arch == "blackwell" else P.gemm_eff_fp8
            # MXFP8's GEMMs apply a scale per 32-element block inside the tensor-core pipeline (a fitted rate
            # ratio, Params.mxfp8_gemm_ratio); per-tensor recipes scale once per GEMM
            mx = P.mxfp8_gemm_ratio if layout.fp8_recipe == "mxfp8" else 1.0
            gemm_rate, gemm_in = gpu.fp8_tflops * 1e12 * tensor_ratio * eff8 * mx, 1.0
        else:
            gemm_rate, gemm_in = bf16_gemm, 2.0
        return cls(
            gpu=gpu,
            params=P,
            nvlink_domain=domain,
            nic_Bps=scaleout * 1e9 / 8 * P.scaleout_eff,
            nvlink_Bps=gpu.nvlink_gbps * 1e9 / 2 * P.nvlink_eff,
            hbm_Bps=gpu.hbm_gbps * 1e9,
            latency_s=P.collective_latency_s,
            fp8=fp8 or fp4,
            fp4=fp4,
            bf16_peak=bf16_peak,
            attn_eff={"blackwell": P.attn_eff_blackwell, "ampere": P.attn_eff_ampere}.get(gpu.arch, P.attn_eff),
            gemm_rate=gemm_rate,
            gemm_input_bytes=gemm_in,
            bf16_gemm_rate=bf16_gemm,
        )

    def link_Bps(self, span: float) -> float:
        """A point-to-point or ring link over ``span`` consecutive GPUs: NVLink inside one domain, else the NIC."""
        return self.nvlink_Bps if span <= self.nvlink_domain else self.nic_Bps


WIDE_HEAD = 128  # the widest attention head Transformer Engine's fused kernels took on Blackwell before 2.5


def attention_backend_run(arch: ModelArch, gpu: GpuSpec, layout: ModelLayout) -> str:
    """The attention backend the layout runs: its ``attention_backend``, except that ``auto`` (Transformer Engine's
    choice) is ``unfused`` for multi-latent attention with a query-key head wider than :data:`WIDE_HEAD`
    (DeepSeek-V3's: 192) on Blackwell in a container family whose Transformer Engine had no fused kernel for it
    (``dse.facts.containers.ContainerFamily.wide_head_attention_blackwell``): FlashAttention takes no MLA (its
    query-key and value heads differ: "Disabling FlashAttention as it does not support MLA") and cuDNN's fused
    attention refused the head there, so Transformer Engine fell back to its unfused DotProductAttention. A wide
    head without MLA (Nemotron-4 340B's 192) still had FlashAttention."""
    return backend_run(arch, gpu.arch, layout.container, layout.attention_backend)


def backend_run(arch: ModelArch, gpu_arch: str, family: str, backend: str) -> str:
    """:func:`attention_backend_run` on plain values: the model's architecture, the GPU's architecture name, the
    container family's name and the ``attention_backend`` knob's value."""
    if backend != "auto" or gpu_arch != "blackwell" or not arch.kv_lora_rank:
        return backend
    fam = _FAMILIES.get(family)
    if fam is None or fam.wide_head_attention_blackwell:
        return backend
    return "unfused" if arch.qk_nope_head_dim + arch.qk_rope_head_dim > WIDE_HEAD else backend


def bf16_gemm_efficiency(params: Params, arch: str) -> float:
    """The fraction of the bf16 peak that large bf16 GEMMs reach on ``arch``: the measured matmul ceiling on Hopper and
    Ampere (``gemm_eff_bf16``); on Blackwell the fitted FP8 efficiency times the ratio of the measured bf16 and FP8
    matmul ceilings (``bf16_over_fp8_eff_blackwell``; dse.perfmodel.timing says why)."""
    if arch == "blackwell":
        return params.gemm_eff_fp8_blackwell * params.bf16_over_fp8_eff_blackwell
    return params.gemm_eff_bf16


_FAMILIES = {f.name: f for f in FAMILIES}


def container_efficiency(params: Params, family: str, arch: str) -> tuple[float, float]:
    """(the family's factor on the tensor-core rates of a GPU of architecture ``arch``, its further factor on
    Blackwell Ultra's) under ``params``: the family's fitted ``Params`` fields (dse.facts.containers.ContainerFamily
    .param, on the architecture its ``arch`` names or on every one, and .ultra_param), 1 for the reference family and
    for a name no family has."""
    fam = _FAMILIES.get(family)
    if fam is None:
        return 1.0, 1.0
    general = getattr(params, fam.param) if fam.param and fam.arch in (None, arch) else 1.0
    ultra = getattr(params, fam.ultra_param) if fam.ultra_param else 1.0
    return general, ultra


def container_host_factor(params: Params, family: str) -> float:
    """The family's factor on a Grace host's launch time per layer (dse.facts.containers.ContainerFamily.host_param) under
    ``params``; 1 for a family without one (the reference) and for a name no family has."""
    fam = _FAMILIES.get(family)
    return getattr(params, fam.host_param) if fam is not None and fam.host_param else 1.0


def uses_fp8(gpu: GpuSpec, layout: ModelLayout) -> bool:
    """Whether ``layout``'s GEMMs run in FP8 on ``gpu``: an FP8 layout on a GPU with FP8 tensor cores."""
    return layout.precision == "fp8" and gpu.fp8_tflops is not None


def uses_nvfp4(gpu: GpuSpec, layout: ModelLayout) -> bool:
    """Whether ``layout``'s GEMMs run in NVFP4 on ``gpu``: an NVFP4 layout on a GPU with FP4 tensor cores (the
    rules refuse it elsewhere; the model then prices bf16)."""
    return layout.precision == "nvfp4" and gpu.nvfp4


def uses_low_precision(gpu: GpuSpec, layout: ModelLayout) -> bool:
    """Whether ``layout``'s GEMM inputs are quantised on ``gpu`` (FP8 or NVFP4): saved for the backward as a
    quantised copy (dse.perfmodel.memory.layer_activation_bytes) and cast by element-wise kernels."""
    return uses_fp8(gpu, layout) or uses_nvfp4(gpu, layout)


# Machines built, by the identity of the GPU and the parameters and the layout fields Machine.of reads: a grid or a
# study predicts thousands of points with a few machines. Keyed by id() rather than by value because hashing a Params
# (some thirty floats) costs more than building a Machine; each entry holds its GpuSpec and Params (Machine.gpu,
# .params), so no id is reused while its entry lives. Cleared when full: a fit (dse.perfmodel.calibrate) makes new Params at
# every evaluation, and a plain dict cleared now and then is cheaper per call than functools.lru_cache's bookkeeping.
_MACHINES: dict[tuple, Machine] = {}
_MACHINES_MAX = 256


def machine_for(gpu: GpuSpec, params: Params, layout: ModelLayout) -> Machine:
    """:meth:`Machine.of`, built once per GPU, parameters and layout fields it reads (precision, FP8 recipe,
    NVLink domain, scale-out bandwidth, container family); never changed afterwards, so shared between
    predictions."""
    key = (
        id(gpu),
        id(params),
        layout.precision,
        layout.fp8_recipe,
        layout.nvlink_domain,
        layout.scaleout_gbps,
        layout.container,
    )
    m = _MACHINES.get(key)
    if m is not None and m.params is params and m.gpu is gpu:
        return m
    if len(_MACHINES) >= _MACHINES_MAX:
        _MACHINES.clear()
    m = _MACHINES[key] = Machine.of(gpu, params, layout)
    return m


def grad_bytes(precision: str, stack: Stack) -> float:
    """Bytes per gradient element: NVIDIA's FP8 and NVFP4 performance recipes reduce gradients in bf16
    (grad_reduce_in_fp32=False); Megatron's bf16 default accumulates and reduces them in fp32, and so does
    recipes.mcore in FP8; Megatron-Bridge's performance scripts reduce them in bf16 in bf16 runs too (the published
    ``bf16-grads`` stacks; dse.perfmodel.stack)."""
    if precision in ("fp8", "nvfp4"):
        return 4.0 if stack.fp8_grad_reduce_in_fp32 else 2.0
    return 4.0 if stack.bf16_grad_reduce_in_fp32 else 2.0


def stage_layers(num_layers: int, p: int, v: int, first: int = 0, last: int = 0) -> tuple[float, float, float, bool]:
    """Transformer layers on the (first, middle, last) pipeline stage, and whether the embedding and
    the loss are counted as layers in the split (see :mod:`dse.perfmodel.model`'s docstring). ``first`` / ``last``
    set the first / last stage's layers (Megatron's num_layers_in_first/last_pipeline_stage, 0 = unset): the
    other stages share the rest evenly."""
    if p <= 1:
        return float(num_layers), float(num_layers), float(num_layers), False
    if first or last:
        fixed = (1 if first else 0) + (1 if last else 0)
        mid = (num_layers - first - last) / (p - fixed) if p > fixed else 0.0
        return float(first or mid), mid, float(last or mid), False
    pv = p * v
    if num_layers % pv and (num_layers + 2) % pv == 0:
        per_stage = (num_layers + 2) / p
        return per_stage - 1, per_stage, per_stage - 1, True
    per_stage = num_layers / p
    return per_stage, per_stage, per_stage, False


@dataclass(slots=True)
class Stages:
    """Transformer layers and parameters of the first, a middle and the last pipeline stage; ``accounted``: the
    embedding and the loss count as one layer each in the split (:func:`stage_layers`)."""

    first_layers: float
    mid_layers: float
    last_layers: float
    accounted: bool
    layer_params: float
    first_params: float
    last_params: float
    stage_params: float  # the largest stage's
    mid_params: float = 0.0  # a middle stage's (0 with fewer than three stages)

    @classmethod
    def of(cls, arch: ModelArch, p: int, v: int, first: int = 0, last: int = 0) -> Stages:
        """The stages of ``arch`` over ``p`` pipeline ranks of ``v`` model chunks each (``first`` / ``last`` layers
        on the first / last stage, 0 = an even split); with one stage, it holds both the embedding and the output
        layer. Multi-token-prediction layers (``ModelArch.mtp_layers``) run on the last stage, one layer each.

        Parameters per stage, beyond the layers' average (:func:`dse.perfmodel.flops.layer_params`): a MoE model's
        first dense layers (:func:`dense_layer_extra`) sit in the first model chunk of the first stage (Megatron-Core
        assigns layers to chunks in order: the first stage's first chunk holds layers ``0 .. L/(p·v) - 1``), and the
        MTP stage holds :func:`mtp_extra_params`."""
        first_l, mid_l, last_l, accounted = stage_layers(arch.num_layers, p, v, first, last)
        last_l += arch.mtp_layers
        if p == 1:
            first_l = mid_l = last_l
        lp = layer_params(arch)
        dense_n, dense_extra = arch.moe_first_dense_layers if arch.num_experts else 0, dense_layer_extra(arch)
        lp_moe = lp - dense_n * dense_extra / arch.num_layers  # a MoE layer's (the average without the dense ones)
        emb = arch.vocab_size * arch.hidden_size
        first_params: float
        last_params: float
        stage_params: float
        if p == 1:
            stage_params = last_l * lp_moe + dense_n * dense_extra + 2 * emb + mtp_extra_params(arch, p)
            first_params = last_params = stage_params
            mid_params = 0.0
        else:
            dense_first = min(float(dense_n), max(first_l / v, 0.0))  # the first chunk's dense layers
            first_params = first_l * lp_moe + dense_first * dense_extra + emb
            last_params = last_l * lp_moe + emb + mtp_extra_params(arch, p)
            mid_params = mid_l * lp_moe + (dense_n - dense_first) * dense_extra if p > 2 else 0.0
            stage_params = max(first_params, mid_params, last_params)
        return cls(first_l, mid_l, last_l, accounted, lp, first_params, last_params, stage_params, mid_params)


def dense_layer_extra(arch: ModelArch) -> float:
    """How many more parameters one of a MoE model's first dense layers (``moe_first_dense_layers``) has than one of
    its MoE layers without the routed experts: a dense MLP of ``ffn_hidden_size`` instead of the shared experts and
    the router (DeepSeek-V3: 396 M against 46 M). 0 for a model without experts."""
    if not arch.num_experts:
        return 0.0
    e, h = mlp_factor(arch), arch.hidden_size
    return float(e * h * arch.ffn_hidden_size - e * h * arch.moe_shared_expert_size - h * arch.num_experts)


def mtp_extra_params(arch: ModelArch, p: int) -> float:
    """Parameters of the multi-token-prediction stage beyond its MTP layers' transformer layers: per MTP layer the
    projection of the concatenated hidden state and embedding (``eh_proj``, ``2h x h``) and its two input norms
    (Megatron-Core ``MultiTokenPredictionLayer``: enorm, hnorm, eh_proj), and, with pipeline parallelism, a copy of
    the input embedding, which Megatron-Core builds on the MTP stage to embed the shifted tokens (``GPTModel``:
    ``if self.pre_process or self.mtp_process: self.embedding = LanguageModelEmbedding(...)``,
    megatron/core/models/gpt/gpt_model.py); with one stage the MTP reuses the model's own embedding."""
    if not arch.mtp_layers:
        return 0.0
    h = arch.hidden_size
    return arch.mtp_layers * (2.0 * h * h + 2.0 * h) + (arch.vocab_size * h if p > 1 else 0.0)


_STAGES: dict[tuple[int, int, int, int, int], tuple[ModelArch, Stages]] = {}


def stages_of(arch: ModelArch, p: int, v: int, first: int = 0, last: int = 0) -> Stages:
    """:meth:`Stages.of`, once per architecture and pipeline split (a grid has a few dozen); shared, never changed.
    Keyed by the architecture's identity, as :func:`machine_for` is (hashing a ModelArch costs as much as Stages.of)."""
    key = (id(arch), p, v, first, last)
    hit = _STAGES.get(key)
    if hit is not None and hit[0] is arch:
        return hit[1]
    if len(_STAGES) >= _MACHINES_MAX:
        _STAGES.clear()
    stages = Stages.of(arch, p, v, first, last)
    _STAGES[key] = (arch, stages)
    return stages
