"""What the model's terms read: the layout (``predict_layout``'s keyword arguments, by their names), the sizes
of one micro-batch on one GPU that it gives, and the GPU's rates under the fitted parameters.

Computed once per prediction, so that each term of :mod:`dse.perfmodel.model` and :mod:`dse.perfmodel.memory`
is a small function of these three values instead of a share of one long body. They are slotted dataclasses,
built once per prediction and never changed afterwards; not frozen, because a frozen dataclass takes about twice
as long to build and the model's throughput is a goal (bench/model_speed.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from dse.hardware import GpuSpec
from dse.perfmodel.flops import layer_params
from dse.perfmodel.stack import Stack
from dse.perfmodel.timing import Params
from dse.recipes.models import ModelArch

# attention backends that run Megatron's or Transformer Engine's unfused core attention (scores through HBM)
UNFUSED_BACKENDS = ("unfused", "local")


@dataclass(slots=True)
class ModelLayout:
    """The layout and options of one prediction: :func:`dse.perfmodel.model.predict_layout`'s keyword arguments,
    under the same names (the knob catalogue names the one each knob feeds), with ``sp`` and ``dropout``
    resolved; ``nvlink_domain`` and ``scaleout_gbps`` None take the GPU's defaults."""

    num_gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1
    mbs: int = 1
    gbs: int = 128
    seq_length: int = 4096
    sp: bool = False
    recompute: str = "none"
    recompute_num_layers: int = 0
    precision: str = "bf16"
    fp8_recipe: str = "tensorwise"
    fsdp: bool = False
    tp_comm_overlap: bool = False
    cpu_offload_layers: int = 0
    attention_backend: str = "auto"
    ep: int = 1
    etp: int = 1
    moe_dispatcher: str = "alltoall"
    moe_grouped_gemm: bool = True
    moe_a2a_overlap: bool = False
    moe_permute_fusion: bool = False
    pp_first_layers: int = 0
    pp_last_layers: int = 0
    dropout: bool = False
    nvlink_domain: int | None = None
    scaleout_gbps: float | None = None

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
    fp8: bool
    bf16_peak: float
    attn_eff: float
    gemm_rate: float
    gemm_input_bytes: float

    @classmethod
    def of(cls, gpu: GpuSpec, params: Params, layout: ModelLayout) -> Machine:
        """Rates for ``layout``'s precision on ``gpu``: FP8 GEMMs where the GPU has them, bf16 otherwise."""
        P = params
        domain = gpu.nvlink_domain if layout.nvlink_domain is None else layout.nvlink_domain
        scaleout = gpu.scaleout_gbps if layout.scaleout_gbps is None else layout.scaleout_gbps
        fp8 = uses_fp8(gpu, layout)
        # the tensor cores' sustained rate relative to the quoted dense peak: 1 except on Blackwell Ultra, whose
        # larger power budget keeps the clock up (dse.hardware.GpuSpec.blackwell_ultra; a fitted parameter)
        tensor_ratio = P.ultra_tensor_ratio if gpu.blackwell_ultra else 1.0
        bf16_peak = gpu.bf16_tflops * 1e12 * tensor_ratio
        if fp8 and gpu.fp8_tflops is not None:  # (fp8 implies it; said again for the type checker)
            eff8 = P.gemm_eff_fp8_blackwell if gpu.arch == "blackwell" else P.gemm_eff_fp8
            # MXFP8's GEMMs apply a scale per 32-element block inside the tensor-core pipeline (a fitted rate
            # ratio, Params.mxfp8_gemm_ratio); per-tensor recipes scale once per GEMM
            mx = P.mxfp8_gemm_ratio if layout.fp8_recipe == "mxfp8" else 1.0
            gemm_rate, gemm_in = gpu.fp8_tflops * 1e12 * tensor_ratio * eff8 * mx, 1.0
        else:
            gemm_rate, gemm_in = bf16_peak * P.gemm_eff_bf16, 2.0
        return cls(
            gpu=gpu,
            params=P,
            nvlink_domain=domain,
            nic_Bps=scaleout * 1e9 / 8 * P.scaleout_eff,
            nvlink_Bps=gpu.nvlink_gbps * 1e9 / 2 * P.nvlink_eff,
            hbm_Bps=gpu.hbm_gbps * 1e9,
            latency_s=P.collective_latency_s,
            fp8=fp8,
            bf16_peak=bf16_peak,
            attn_eff={"blackwell": P.attn_eff_blackwell, "ampere": P.attn_eff_ampere}.get(gpu.arch, P.attn_eff),
            gemm_rate=gemm_rate,
            gemm_input_bytes=gemm_in,
        )

    def link_Bps(self, span: float) -> float:
        """A point-to-point or ring link over ``span`` consecutive GPUs: NVLink inside one domain, else the NIC."""
        return self.nvlink_Bps if span <= self.nvlink_domain else self.nic_Bps


def uses_fp8(gpu: GpuSpec, layout: ModelLayout) -> bool:
    """Whether ``layout``'s GEMMs run in FP8 on ``gpu``: an FP8 layout on a GPU with FP8 tensor cores."""
    return layout.precision == "fp8" and gpu.fp8_tflops is not None


# Machines built, by the identity of the GPU and the parameters and the layout fields Machine.of reads: a grid or a
# study predicts thousands of points with a few machines. Keyed by id() rather than by value because hashing a Params
# (some thirty floats) costs more than building a Machine; each entry holds its GpuSpec and Params (Machine.gpu,
# .params), so no id is reused while its entry lives. Cleared when full: a fit (dse.calibrate) makes new Params at
# every evaluation, and a plain dict cleared now and then is cheaper per call than functools.lru_cache's bookkeeping.
_MACHINES: dict[tuple, Machine] = {}
_MACHINES_MAX = 256


def machine_for(gpu: GpuSpec, params: Params, layout: ModelLayout) -> Machine:
    """:meth:`Machine.of`, built once per GPU, parameters and layout fields it reads (precision, FP8 recipe,
    NVLink domain, scale-out bandwidth); never changed afterwards, so shared between predictions."""
    key = (id(gpu), id(params), layout.precision, layout.fp8_recipe, layout.nvlink_domain, layout.scaleout_gbps)
    m = _MACHINES.get(key)
    if m is not None and m.params is params and m.gpu is gpu:
        return m
    if len(_MACHINES) >= _MACHINES_MAX:
        _MACHINES.clear()
    m = _MACHINES[key] = Machine.of(gpu, params, layout)
    return m


def grad_bytes(precision: str, stack: Stack) -> float:
    """Bytes per gradient element: NVIDIA's FP8 performance recipes reduce gradients in bf16
    (grad_reduce_in_fp32=False); Megatron's bf16 default accumulates and reduces them in fp32, and so does
    recipes.mcore in FP8 (dse.perfmodel.stack)."""
    return 2.0 if precision == "fp8" and not stack.fp8_grad_reduce_in_fp32 else 4.0


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

    @classmethod
    def of(cls, arch: ModelArch, p: int, v: int, first: int = 0, last: int = 0) -> Stages:
        """The stages of ``arch`` over ``p`` pipeline ranks of ``v`` model chunks each (``first`` / ``last`` layers
        on the first / last stage, 0 = an even split); with one stage, it holds both the embedding and the output
        layer. Multi-token-prediction layers (``ModelArch.mtp_layers``) run on the last stage, one layer each."""
        first_l, mid_l, last_l, accounted = stage_layers(arch.num_layers, p, v, first, last)
        last_l += arch.mtp_layers
        if p == 1:
            first_l = mid_l = last_l
        lp = layer_params(arch)
        emb = arch.vocab_size * arch.hidden_size
        first_params: float
        last_params: float
        stage_params: float
        if p == 1:
            stage_params = last_l * lp + 2 * emb
            first_params = last_params = stage_params
        else:
            first_params = first_l * lp + emb
            last_params = last_l * lp + emb
            stage_params = max(first_params, mid_l * lp, last_params)
        return cls(first_l, mid_l, last_l, accounted, lp, first_params, last_params, stage_params)


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
