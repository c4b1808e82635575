"""Validity rules. Each rule is a small named function of a trial returning a :class:`Broken` (a one-line
reason and the knobs it names) or None.

Rejected points are never launched: the environment records them as ``rejected`` with the rule's name and
reason. Rules are checked in the order of :data:`RULES`; :func:`check` returns the first that fails and
:func:`check_all` every one (``dse space`` counts rejections by rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dse import hardware, knobs
from dse.hardware import HARDWARE, gpus_where
from dse.trial import TrialConfig


@dataclass(frozen=True)
class Broken:
    """What a rule returns for a point that breaks it: the one-line reason, and the knobs the reason is about
    (changing one of them may make the point valid), so that a caller can point at them without reading the text:
    ``dse predict`` names those the recipe chose rather than the user, with the flag that sets each."""

    reason: str
    knobs: tuple[str, ...] = ()


def broken(reason: str, *knobs: str) -> Broken:
    """``Broken(reason, knobs)``, the way each rule below spells it."""
    return Broken(reason, knobs)


@dataclass(frozen=True)
class Rejection:
    """The first (or each) rule a point breaks: its name, its reason and the knobs the reason is about."""

    rule: str
    reason: str
    knobs: tuple[str, ...] = ()


def world_divisible(t: TrialConfig) -> Broken | None:
    mp = t.model_parallel
    if t.num_gpus % mp:
        return broken(
            f"world size {t.num_gpus} is not divisible by tp*pp*cp = {t.layout.tp}*{t.layout.pp}*{t.layout.cp} = {mp}",
            "tp",
            "pp",
            "cp",
        )
    return None


def heads_divisible(t: TrialConfig) -> Broken | None:
    a = t.arch
    if a.num_attention_heads % t.layout.tp or a.num_query_groups % t.layout.tp:
        return broken(
            f"tp={t.layout.tp} must divide the attention heads ({a.num_attention_heads}) "
            f"and query groups ({a.num_query_groups})",
            "tp",
        )
    return None


def layers_divisible(t: TrialConfig) -> Broken | None:
    """pp (and pp*vp) must divide the layers; Megatron may count the embedding and the loss as one pipeline
    layer each (``account_for_embedding/loss_in_pipeline_split``, as NeMo's 405B recipe does: 126 + 2 = 128)."""
    chunks = t.layout.pp * t.layout.vp
    if t.uneven_stages:
        return None  # uneven_stages checks a split with its own first and last stages
    if t.pipeline_layers % chunks:
        what, named = (
            (f"pp={t.layout.pp}", ("pp",))
            if t.layout.vp == 1
            else (f"pp*vp = {t.layout.pp}*{t.layout.vp}", ("pp", "vp"))
        )
        return broken(
            f"{what} does not divide the {t.arch.num_layers} layers (nor {t.arch.num_layers + 2} with "
            "embedding and loss)",
            *named,
        )
    return None


def uneven_stages(t: TrialConfig) -> Broken | None:
    """First and last pipeline stages of their own size (``pp_first_layers``, ``pp_last_layers``): what Megatron-Core
    checks of ``num_layers_in_first/last_pipeline_stage`` (transformer_config.py ``__post_init__``, "Uneven PP"):
    pipeline parallelism, middle stages if and only if layers are left for them, the layers left divisible by the
    middle stages, and each middle stage's layers by vp. With vp > 1 dse spells the split as a
    ``pipeline_model_parallel_layout`` (:func:`dse.knobs.pipeline_layout`, as NVIDIA's DeepSeek-V3 presets do), so
    the first and last stages need not divide by vp."""
    lay = t.layout
    first, last = lay.pp_first_layers, lay.pp_last_layers
    if not t.uneven_stages:
        return None
    named = tuple(n for n, v in (("pp_first_layers", first), ("pp_last_layers", last)) if v)
    if lay.pp == 1:
        return broken(f"{'/'.join(named)} set an uneven pipeline split, which needs pp > 1", *named, "pp")
    left, stages = t.arch.num_layers - first - last, lay.pp - len(named)
    if left < 0 or bool(left) != bool(stages):
        return broken(
            f"pp_first_layers={first} and pp_last_layers={last} leave {max(left, 0)} of the {t.arch.num_layers} "
            f"layers for {stages} middle stage(s) of pp={lay.pp}",
            *named,
            "pp",
        )
    if stages and left % (stages * lay.vp):
        what = f"{stages} middle stage(s)" + (f" x vp={lay.vp}" if lay.vp > 1 else "")
        return broken(
            f"the {left} layers left by pp_first_layers={first} and pp_last_layers={last} do not divide over {what}",
            *named,
            "pp",
            *(("vp",) if lay.vp > 1 else ()),
        )
    return None


def vp_needs_pp(t: TrialConfig) -> Broken | None:
    return (
        broken(f"vp={t.layout.vp} (interleaving) needs pp > 1", "vp", "pp")
        if t.layout.vp > 1 and t.layout.pp == 1
        else None
    )


def gbs_divisible(t: TrialConfig) -> Broken | None:
    if t.dp and t.layout.gbs % (t.layout.mbs * t.dp):
        return broken(
            f"gbs={t.layout.gbs} is not divisible by mbs*dp = {t.layout.mbs}*{t.dp} = {t.layout.mbs * t.dp}",
            "gbs",
            "mbs",
        )
    return None


def interleaved_microbatches(t: TrialConfig) -> Broken | None:
    m = t.num_microbatches
    if t.layout.vp > 1 and m and m % t.layout.pp:
        return broken(f"the interleaved schedule needs the {m} micro-batches to be divisible by pp={t.layout.pp}", "pp")
    return None


def seq_divisible(t: TrialConfig) -> Broken | None:
    s = t.layout.seq_length
    if t.layout.cp > 1 and s % (2 * t.layout.cp):
        return broken(
            f"seq_length={s} is not divisible by 2*cp = {2 * t.layout.cp} (load-balanced context parallelism)",
            "seq_length",
            "cp",
        )
    if t.sequence_parallel and s % t.layout.tp:
        return broken(f"seq_length={s} is not divisible by tp={t.layout.tp} (sequence parallelism)", "seq_length", "tp")
    return None


def sp_needs_tp(t: TrialConfig) -> Broken | None:
    return (
        broken("sequence parallelism (sp=true) needs tp > 1", "sp", "tp")
        if t.values["sp"] and t.layout.tp == 1
        else None
    )


def dense_takes_no_moe_knobs(t: TrialConfig) -> Broken | None:
    """A dense model has no experts to spread: Megatron-Core refuses expert parallelism without experts
    ("num_moe_experts must be non None to use expert-parallel": megatron/core/transformer/transformer_config.py
    ``__post_init__``; megatron/training/arguments.py ``validate_args``). The other MoE-only knobs are not spelled
    for a dense recipe (``dse.knobs.MOE_KNOBS``), so a space varying one would run the same job once per value:
    the point is kept once, with the first value the space lists."""
    if t.arch.is_moe:
        return None
    for name in ("ep", "etp"):
        if getattr(t.layout, name) != 1:
            return broken(
                f"{name}={getattr(t.layout, name)} on a dense model ({t.arch.name}); dense models take 1", name
            )
    for name in sorted(knobs.MOE_KNOBS & set(t.varied)):
        if t.values[name] != t.first_listed.get(name, t.values[name]):
            return broken(
                f"{name}={_spelled(t.values[name])} has no effect on a dense model ({t.arch.name}): the same run as "
                f"{name}={_spelled(t.first_listed[name])}",
                name,
            )
    return None


def _spelled(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def ep_divides_experts(t: TrialConfig) -> Broken | None:
    """Each expert-parallel rank holds experts / ep whole experts (megatron/training/arguments.py
    ``validate_args``: "Number of experts should be a multiple of expert model parallel_size";
    megatron/core/transformer/moe/moe_layer.py asserts it again)."""
    experts = t.arch.num_experts
    if experts and experts % t.layout.ep:
        return broken(f"ep={t.layout.ep} does not divide the {experts} experts", "ep")
    return None


def expert_data_parallel(t: TrialConfig) -> Broken | None:
    """The expert layers' own grid: world = etp x ep x expert-dp x pp (megatron/core/parallel_state.py
    ``initialize_model_parallel`` raises "world_size is not divisible by expert_tensor_model_pipeline_parallel
    size"). With the dense grid world = tp x cp x dp x pp this is EP x ETP dividing the tp x cp x dp GPUs of
    a pipeline stage: the experts are folded over the GPUs that attention spreads over by tp, cp and dp."""
    lay = t.layout
    if not t.arch.is_moe or t.num_gpus % t.model_parallel:
        return None  # a dense model's ep and etp are 1; world_divisible names a broken dense grid
    stage = t.num_gpus // lay.pp
    if stage % (lay.ep * lay.etp):
        return broken(
            f"ep*etp = {lay.ep}*{lay.etp} = {lay.ep * lay.etp} does not divide the {stage} GPUs of a pipeline stage "
            f"(tp*cp*dp = {lay.tp}*{lay.cp}*{t.dp}): the world of {t.num_gpus} has no expert-data-parallel group",
            "ep",
            "etp",
        )
    return None


def etp_divides_expert_ffn(t: TrialConfig) -> Broken | None:
    """Expert tensor parallelism splits each expert's FFN columns (megatron/core/transformer/moe/experts.py builds
    the expert linears over the expert-tensor-parallel group; megatron/core/utils.py ``divide`` asserts the
    split is exact). Megatron-Core has no rule tying etp to tp (its MoE parallel folding lets them differ, and
    ``expert_tensor_parallel_size`` only defaults to tp: megatron/core/model_parallel_config.py)."""
    ffn = t.arch.expert_ffn
    if t.arch.is_moe and ffn % t.layout.etp:
        return broken(f"etp={t.layout.etp} does not divide the experts' FFN size {ffn}", "etp")
    return None


def moe_needs_sp(t: TrialConfig) -> Broken | None:
    """Megatron-Core's MoE layer refuses to train with tensor parallelism but no sequence parallelism
    (megatron/core/transformer/moe/moe_layer.py ``MoELayer.forward``: "performance may degrade if MoE and tensor
    parallelism are enabled without also enabling sequence parallelism", a ValueError)."""
    if t.arch.is_moe and t.layout.tp > 1 and not t.sequence_parallel:
        return broken(f"an MoE model with tp={t.layout.tp} needs sequence parallelism (sp=true)", "sp", "tp")
    return None


# The flex dispatcher's kernels by payload family: NeMo 2 switches DeepEP on (moe_enable_deepep, as NVIDIA's
# scripts/performance/llm/pretrain_deepseek_v3.py); Megatron-Bridge names its backend (dse.knobs.FLEX_BACKEND).
# Where each runs: megatron/bridge/training/flex_dispatcher_backend.py validate_flex_dispatcher_backend (DeepEP on
# Ampere, Hopper, B200 and B300, not on Grace-Blackwell; HybridEP on compute capability 8, 9 and 10).
def _flex_backend(t: TrialConfig) -> str:
    """The flex kernels of ``t``'s payload: DeepEP for NeMo 2 (and the simulated payload, spelled as NeMo 2);
    HybridEP for Bridge, recipes.mcore and the published stacks of NVIDIA's tables (whose flex rows are Bridge's)."""
    return "deepep" if t.payload in ("nemo2", "sim") else knobs.FLEX_BACKEND


def _flex_runs_on(backend: str, gpu: str) -> bool:
    spec = HARDWARE[gpu]
    if backend == "deepep":
        return spec.arch in ("ampere", "hopper") or (spec.arch == "blackwell" and not spec.grace_host)
    return spec.arch in ("ampere", "hopper", "blackwell")


def moe_dispatcher_supported(t: TrialConfig) -> Broken | None:
    """What Megatron-Core checks of the token dispatcher. flex (``MoEFlexTokenDispatcher``,
    megatron/core/transformer/moe/token_dispatcher.py) asserts "DeepEP dispatcher requires TPxEP > 1" (its TP is
    the expert tensor-parallel size) and needs the DeepEP / HybridEP library (fused_a2a.py imports ``deep_ep``:
    whether the container has it, dse cannot see), on the GPUs its backend
    supports (:func:`_flex_runs_on`). allgather cannot carry the shared-expert overlap that the DeepSeek-V3
    recipes switch on ("moe_shared_expert_overlap only works with alltoall or flex token dispatcher":
    transformer_config.py ``__post_init__``; dse spells no change to it for allgather)."""
    lay, a = t.layout, t.arch
    if not a.is_moe or lay.moe_dispatcher == "alltoall":
        return None
    if lay.moe_dispatcher == "allgather":
        if a.moe_shared_expert_size:
            return broken(
                f"moe_dispatcher=allgather cannot overlap {a.name}'s shared experts, which its recipe does "
                "(Megatron-Core: alltoall or flex only)",
                "moe_dispatcher",
            )
        return None
    backend = _flex_backend(t)
    if backend == "deepep" and lay.ep * lay.etp == 1:
        return broken("moe_dispatcher=flex (DeepEP) needs etp*ep > 1", "moe_dispatcher", "ep")
    if not _flex_runs_on(backend, t.system.gpu):
        return broken(
            f"moe_dispatcher=flex runs {backend} with the {t.payload} payload, which does not run on {t.system.gpu} "
            f"(the mbridge payload runs {knobs.FLEX_BACKEND}; NeMo's scripts use alltoall there)",
            "moe_dispatcher",
        )
    return None


def _catalogued(*names: str) -> tuple[str, ...]:
    """``names`` that are knobs of the catalogue (``recompute_modules`` is read where a branch of the catalogue
    has it; a rejection names only knobs ``dse predict`` has a flag for)."""
    return tuple(n for n in names if n in knobs.CATALOGUE)


def _recompute_modules(t: TrialConfig) -> tuple[str, ...]:
    """The trial's ``recompute_modules`` (a list, or one string with , or / between names), () when unset."""
    value = t.values.get("recompute_modules") or ()
    if isinstance(value, str):
        value = value.replace("/", ",").split(",")
    return tuple(str(v).strip() for v in value if str(v).strip())


def moe_a2a_overlap_supported(t: TrialConfig) -> Broken | None:
    """What Megatron-Core asserts of ``overlap_moe_expert_parallel_comm`` (transformer_config.py
    ``__post_init__``): expert parallelism, the alltoall or flex dispatcher, interleaving (vp) when pp > 1, no full
    recompute (granularity, method and layer count unset), no ``moe`` in ``recompute_modules``, at most one MTP
    layer. Not checkable here: its PyTorch >= 2.6 (the container's version is not part of a trial)."""
    lay, on = t.layout, "moe_a2a_overlap"
    if not lay.moe_a2a_overlap or not t.arch.is_moe:
        return None
    if lay.ep == 1:
        return broken("moe_a2a_overlap needs expert parallelism (ep > 1)", on, "ep")
    if lay.moe_dispatcher not in ("alltoall", "flex"):
        return broken(
            f"moe_a2a_overlap needs the alltoall or flex dispatcher, not {lay.moe_dispatcher}", on, "moe_dispatcher"
        )
    if lay.pp > 1 and lay.vp == 1:
        return broken(f"moe_a2a_overlap with pp={lay.pp} needs interleaving (vp > 1)", on, "vp")
    if lay.recompute == "full":
        return broken("moe_a2a_overlap cannot run with full recompute", on, "recompute")
    if "moe" in _recompute_modules(t):
        return broken("moe_a2a_overlap cannot run with moe in recompute_modules", *_catalogued(on, "recompute_modules"))
    if t.arch.mtp_layers > 1:
        return broken(f"moe_a2a_overlap takes at most one MTP layer ({t.arch.name} has {t.arch.mtp_layers})", on)
    return None


def moe_grouped_gemm_supported(t: TrialConfig) -> Broken | None:
    """Grouped GEMMs need compute capability 8 or newer (megatron/training/arguments.py ``validate_args``), which
    every GPU of dse.hardware has; recomputing the expert activation (``moe_act`` in ``recompute_modules``) needs
    them (transformer_config.py: "moe_act in recompute_modules is only supported with moe_grouped_gemm"). With FP8
    they need Transformer Engine >= 1.11, and fused permutation (``moe_permute_fusion``) TE >= 2.1
    (transformer_config.py): the container's TE version is not part of a trial, so neither is checked here."""
    if t.arch.is_moe and not t.layout.moe_grouped_gemm and "moe_act" in _recompute_modules(t):
        return broken(
            "recompute_modules with moe_act needs moe_grouped_gemm=true",
            *_catalogued("moe_grouped_gemm", "recompute_modules"),
        )
    return None


def fp8_needs_hopper(t: TrialConfig) -> Broken | None:
    gpu = HARDWARE[t.system.gpu]
    if t.layout.precision == "fp8" and not gpu.fp8:
        return broken(f"fp8 needs Hopper or newer; {t.system.gpu} has no FP8 tensor cores", "precision")
    if t.layout.precision == "fp8" and t.layout.fp8_recipe == "mxfp8" and not gpu.mxfp8:
        return broken(f"fp8_recipe=mxfp8 needs Blackwell ({', '.join(gpus_where('mxfp8'))})", "fp8_recipe")
    return None


def userbuffer_config(trial: TrialConfig) -> str | None:
    """The name of NeMo's tuned userbuffer config for ``trial``'s (GPU, precision, hidden size, tp), or None.

    One table for the controller and the payload: ``recipes.nemo2.userbuffers`` (plain data).
    """
    return hardware.userbuffer_config(trial.system.gpu, trial.layout.precision, trial.arch.hidden_size, trial.layout.tp)


def tp_comm_overlap_supported(trial: TrialConfig) -> Broken | None:
    """Constraint rule: the reason ``trial`` cannot use tp_comm_overlap, or None when it can (or does not ask).

    TP comm overlap needs a userbuffer config tuned for the GPU family, model width, tp and precision;
    NeMo ships a handful (``recipes.nemo2.userbuffers.UB_CONFIGS``) and we do not launch untuned ones.
    """
    if not trial.layout.tp_comm_overlap or trial.layout.tp == 1:  # tp == 1: the rule tp_comm_overlap_needs_tp says why
        return None
    if userbuffer_config(trial) is not None:
        return None
    family = HARDWARE[trial.system.gpu].userbuffer_family or trial.system.gpu
    return broken(
        f"tp_comm_overlap needs a userbuffer config for ({family}, hidden {trial.arch.hidden_size}, "
        f"tp {trial.layout.tp}, {trial.layout.precision}); NeMo has none, so turn tp_comm_overlap off for this point",
        "tp_comm_overlap",
        "tp",
    )


def tp_within_nvlink(t: TrialConfig) -> Broken | None:
    domain = min(t.system.nvlink_domain, t.num_gpus)
    if t.layout.tp > domain:
        return broken(f"tp={t.layout.tp} spans more than one NVLink domain ({t.system.nvlink_domain} GPUs)", "tp")
    return None


def recompute_layers_in_stage(t: TrialConfig) -> Broken | None:
    n = t.layout.recompute_num_layers
    if n and t.layout.recompute != "full":
        return broken(
            f"recompute_num_layers={n} applies to recompute=full only (got recompute={t.layout.recompute})",
            "recompute_num_layers",
            "recompute",
        )
    per_stage = t.pipeline_layers // (t.layout.pp * t.layout.vp)
    if n > per_stage:
        return broken(
            f"recompute_num_layers={n} exceeds the {per_stage} layers of a pipeline stage chunk", "recompute_num_layers"
        )
    return None


def fsdp_no_pp(t: TrialConfig) -> Broken | None:
    if t.layout.fsdp and t.layout.pp > 1:
        return broken("fsdp (Megatron FSDP) is used without pipeline parallelism; pp must be 1", "fsdp", "pp")
    return None


def tp_comm_overlap_needs_tp(t: TrialConfig) -> Broken | None:
    if t.layout.tp_comm_overlap and (t.layout.tp == 1 or not t.sequence_parallel):
        return broken("tp_comm_overlap needs tp > 1 with sequence parallelism", "tp_comm_overlap", "tp", "sp")
    return None


def cpu_offload_supported(t: TrialConfig) -> Broken | None:
    """What Megatron-Core allows with activation offloading (``TransformerConfig.__post_init__``, megatron-core
    0.15: ``0 <= cpu_offloading_num_layers < num_layers``, no pipeline parallelism, no activation recompute)."""
    n = t.layout.cpu_offload_layers
    if not n:
        return None
    if n >= t.arch.num_layers:
        return broken(
            f"cpu_offload_layers={n} must be less than the model's {t.arch.num_layers} layers", "cpu_offload_layers"
        )
    if t.layout.pp > 1:
        return broken(
            f"cpu_offload_layers={n} needs pp=1; Megatron-Core cannot offload activations with pipeline parallelism",
            "cpu_offload_layers",
            "pp",
        )
    if t.layout.recompute != "none":
        return broken(
            f"cpu_offload_layers={n} needs recompute=none; Megatron-Core cannot offload with "
            f"recompute={t.layout.recompute}",
            "cpu_offload_layers",
            "recompute",
        )
    return None


def cp_needs_te_attention(t: TrialConfig) -> Broken | None:
    """Context parallelism runs inside Transformer Engine's attention; Megatron's unfused/local attention
    has no CP support."""
    backend = t.values.get("attention_backend", "auto")
    if t.layout.cp > 1 and backend in ("unfused", "local"):
        return broken(
            f"cp={t.layout.cp} needs Transformer Engine attention; attention_backend={backend} has no context "
            "parallelism",
            "cp",
            "attention_backend",
        )
    return None


def fp8_recipe_needs_fp8(t: TrialConfig) -> Broken | None:
    """A space that varies both ``precision`` and ``fp8_recipe`` would otherwise run each bf16 point once per
    recipe: the recipe has no effect without FP8. The bf16 point is kept once, with the first recipe the space
    lists; the others are rejected as duplicates (free: a rejected point costs no budget)."""
    first = t.first_listed.get("fp8_recipe")
    if t.layout.precision != "fp8" and "fp8_recipe" in t.varied and t.layout.fp8_recipe != first:
        return broken(
            f"fp8_recipe={t.layout.fp8_recipe} has no effect with precision={t.layout.precision}: the same run as "
            f"fp8_recipe={first}",
            "fp8_recipe",
            "precision",
        )
    return None


RULES: tuple[Callable[[TrialConfig], Broken | None], ...] = (
    world_divisible,
    heads_divisible,
    layers_divisible,
    uneven_stages,
    vp_needs_pp,
    gbs_divisible,
    interleaved_microbatches,
    seq_divisible,
    sp_needs_tp,
    dense_takes_no_moe_knobs,
    ep_divides_experts,
    expert_data_parallel,
    etp_divides_expert_ffn,
    moe_needs_sp,
    moe_dispatcher_supported,
    moe_a2a_overlap_supported,
    moe_grouped_gemm_supported,
    fp8_needs_hopper,
    tp_within_nvlink,
    recompute_layers_in_stage,
    fsdp_no_pp,
    tp_comm_overlap_needs_tp,
    cpu_offload_supported,
    cp_needs_te_attention,
    fp8_recipe_needs_fp8,
    tp_comm_overlap_supported,  # a userbuffer config exists for (GPU, hidden, tp, precision)
)


def check(trial: TrialConfig) -> Rejection | None:
    """The first rule ``trial`` breaks, or None when it is valid."""
    for rule in RULES:
        why = rule(trial)
        if why is not None:
            return Rejection(rule.__name__, why.reason, why.knobs)
    return None


def check_all(trial: TrialConfig) -> list[Rejection]:
    """Every rule ``trial`` breaks."""
    return [Rejection(r.__name__, why.reason, why.knobs) for r in RULES if (why := r(trial)) is not None]


def all_rules() -> list[str]:
    return [r.__name__ for r in RULES]
