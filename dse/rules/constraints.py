"""Validity rules. Each rule is a small named function of a trial returning a :class:`Broken` (a one-line
reason and the knobs it names) or None.

Rejected points are never launched: the environment records them as ``rejected`` with the rule's name and
reason. Rules are checked in the order of :data:`RULES`; :func:`check` returns the first that fails and
:func:`check_all` every one (``dse space`` counts rejections by rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dse.facts import hardware, knobs
from dse.facts.hardware import HARDWARE, gpus_where
from dse.rules.trial import TrialConfig


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
    ``pipeline_model_parallel_layout`` (:func:`dse.facts.knobs.pipeline_layout`, as NVIDIA's DeepSeek-V3 presets do), so
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
    for a dense recipe (``dse.facts.knobs.MOE_KNOBS``), so a space varying one would run the same job once per value:
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
                f"{name}={knobs.spell_value(t.values[name])} has no effect on a dense model ({t.arch.name}): the same run as "
                f"{name}={knobs.spell_value(t.first_listed[name])}",
                name,
            )
    return None


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
# scripts/performance/llm/pretrain_deepseek_v3.py); Megatron-Bridge names its backend (dse.facts.knobs.FLEX_BACKEND).
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
    every GPU of dse.facts.hardware has; recomputing the expert activation (``moe_act`` in ``recompute_modules``) needs
    them (transformer_config.py: "moe_act in recompute_modules is only supported with moe_grouped_gemm"). With FP8
    they need Transformer Engine >= 1.11, and fused permutation (``moe_permute_fusion``) TE >= 2.1
    (transformer_config.py): the container's TE version is not part of a trial, so neither is checked here."""
    if t.arch.is_moe and not t.layout.moe_grouped_gemm and "moe_act" in _recompute_modules(t):
        return broken(
            "recompute_modules with moe_act needs moe_grouped_gemm=true",
            *_catalogued("moe_grouped_gemm", "recompute_modules"),
        )
    return None


def moe_token_drop_supported(t: TrialConfig) -> Broken | None:
    """Token drop (a capacity factor with padded expert inputs) runs on the alltoall dispatcher: Megatron-Bridge's
    ``apply_moe_token_drop``, which NVIDIA's performance scripts call, asserts it ("moe_expert_capacity_factor only
    works with alltoall token dispatcher", as Megatron-Core's TransformerConfig raised through 0.13), and it is the
    only dispatcher NVIDIA's token-drop benchmarks ran."""
    lay = t.layout
    if t.arch.is_moe and lay.moe_token_drop and lay.moe_dispatcher != "alltoall":
        return broken(
            f"moe_token_drop needs the alltoall dispatcher, not {lay.moe_dispatcher}",
            "moe_token_drop",
            "moe_dispatcher",
        )
    return None


def fp8_needs_hopper(t: TrialConfig) -> Broken | None:
    gpu = HARDWARE[t.system.gpu]
    if t.layout.precision == "fp8" and not gpu.fp8:
        return broken(f"fp8 needs Hopper or newer; {t.system.gpu} has no FP8 tensor cores", "precision")
    if t.layout.precision == "fp8" and t.layout.fp8_recipe == "mxfp8" and not gpu.mxfp8:
        return broken(f"fp8_recipe=mxfp8 needs Blackwell ({', '.join(gpus_where('mxfp8'))})", "fp8_recipe")
    return None


# NVFP4 needs Megatron-Bridge's precision recipe (megatron/bridge/training/mixed_precision.py,
# bf16_with_nvfp4_mixed); NeMo 2's precision factories (nemo/collections/llm/recipes/precision/mixed_precision.py)
# stop at MXFP8 and blockwise FP8, and recipes/mcore builds bf16 and FP8 only. The payloads refused, with why.
NVFP4_REFUSED = {
    "nemo2": "NeMo 2 has no NVFP4 precision plugin",
    "mcore": "recipes.mcore runs bf16 and FP8 only",
}
# NVFP4 quantises 16-element blocks along both dimensions of a GEMM operand (row-wise for fprop, column-wise with the
# random Hadamard transform for wgrad: Transformer Engine's NVFP4BlockScaling, docs/features/low_precision_training/
# nvfp4), and Megatron-Core asks FP4 linear layers for per-partition output widths aligned to 32
# (megatron/core/transformer/transformer_config.py, its FP8 16 / FP4 32 alignment). dse asks 32 of every GEMM
# dimension a layer has on one GPU: the hidden width, the QKV, projection and MLP widths over tp, and the tokens.
NVFP4_ALIGN = 32


def nvfp4_needs_blackwell(t: TrialConfig) -> Broken | None:
    """NVFP4 runs on Blackwell tensor cores only (SM 10.0+; Transformer Engine's NVFP4 recipe, "Supported devices")."""
    if t.layout.precision == "nvfp4" and not HARDWARE[t.system.gpu].nvfp4:
        return broken(
            f"precision=nvfp4 needs Blackwell FP4 tensor cores ({', '.join(gpus_where('nvfp4'))}); {t.system.gpu} has "
            "none",
            "precision",
        )
    return None


def nvfp4_payload(t: TrialConfig) -> Broken | None:
    """NVFP4 needs Megatron-Bridge's bf16_with_nvfp4_mixed: NeMo 2 has no NVFP4 precision plugin and recipes.mcore
    builds BF16 and FP8 only (the sim payload describes Bridge's recipe)."""
    why = NVFP4_REFUSED.get(t.payload) if t.layout.precision == "nvfp4" else None
    if why:
        return broken(
            f"precision=nvfp4 needs the mbridge payload (Megatron-Bridge's bf16_with_nvfp4_mixed); {why}",
            "precision",
        )
    return None


def nvfp4_dims_aligned(t: TrialConfig) -> Broken | None:
    """Under NVFP4 the hidden size, the QKV and MLP widths over tp and a micro-batch's tokens are multiples of 32:
    16-element blocks along both dimensions of each GEMM operand, and Megatron-Core's FP4 width alignment."""
    if t.layout.precision != "nvfp4":
        return None
    a, tp = t.arch, t.layout.tp
    dims = {
        "hidden_size": a.hidden_size,
        "qkv width / tp": (a.num_attention_heads + 2 * a.num_query_groups) * a.head_dim // tp,
        "ffn_hidden_size / tp": a.ffn_hidden_size // tp,
        "tokens per micro-batch (mbs*seq_length/cp)": t.layout.mbs * t.layout.seq_length // t.layout.cp,
    }
    bad = [f"{k}={v}" for k, v in dims.items() if v % NVFP4_ALIGN]
    if bad:
        return broken(
            f"precision=nvfp4 needs GEMM dimensions divisible by {NVFP4_ALIGN}; {', '.join(bad)} is not",
            "precision",
            "tp",
        )
    return None


def nvfp4_no_tp_comm_overlap(t: TrialConfig) -> Broken | None:
    """NVIDIA's Megatron-Bridge performance scripts turn TP communication overlap off for every NVFP4 run
    (scripts/performance/configs/llama/llama3_llm_pretrain.py at v0.4.0, container 26.04:
    ``tp_comm_overlap = False if precision == "nvfp4"``; every NVFP4 preset of megatron/bridge/perf_recipes sets it
    False): no userbuffer configuration has been run with NVFP4."""
    if t.layout.precision == "nvfp4" and t.layout.tp_comm_overlap and t.layout.tp > 1:
        return broken(
            "tp_comm_overlap with precision=nvfp4: Megatron-Bridge runs NVFP4 without TP overlap (no userbuffer "
            "config for NVFP4); turn tp_comm_overlap off",
            "tp_comm_overlap",
            "precision",
        )
    return None


def userbuffer_config(trial: TrialConfig) -> str | None:
    """The userbuffer config ``trial``'s payload loads for its (GPU, precision, hidden size, tp), or None.

    One table per payload for the controller and the payload (``dse.facts.hardware.userbuffer_config``: NeMo 2's in
    ``recipes.nemo2.userbuffers``, Megatron-Bridge's in ``recipes.mbridge.userbuffers``, plain data).
    """
    return hardware.userbuffer_config(
        trial.system.gpu, trial.layout.precision, trial.arch.hidden_size, trial.layout.tp, trial.payload
    )


def tp_comm_overlap_supported(trial: TrialConfig) -> Broken | None:
    """Constraint rule: the reason ``trial`` cannot use tp_comm_overlap, or None when it can (or does not ask).

    TP comm overlap needs a userbuffer config that the trial's payload ships and NVIDIA's scripts for that
    payload use for the GPU family, model width, tp and precision (each payload's table, see
    :func:`userbuffer_config`); we do not launch untuned ones. The megatron-core payload has no userbuffers.
    """
    if not trial.layout.tp_comm_overlap or trial.layout.tp == 1:  # tp == 1: the rule tp_comm_overlap_needs_tp says why
        return None
    if trial.layout.precision == "nvfp4":  # the rule nvfp4_no_tp_comm_overlap says why
        return None
    if userbuffer_config(trial) is not None:
        return None
    payload = trial.payload
    if hardware.UB_LOOKUPS.get(payload, True) is None:
        what = "has no Transformer Engine userbuffers"
    else:
        what = "ships none that NVIDIA's scripts use for it"
    family = HARDWARE[trial.system.gpu].userbuffer_family or trial.system.gpu
    return broken(
        f"tp_comm_overlap needs a userbuffer config for ({family}, hidden {trial.arch.hidden_size}, "
        f"tp {trial.layout.tp}, {trial.layout.precision}); the {payload} payload {what}, so turn tp_comm_overlap "
        "off for this point",
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
    backend = knobs.effective("attention_backend", t.values)
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


# --- CUDA graphs: Megatron-Core's own checks (megatron/core/transformer/transformer_config.py,
# TransformerConfig.__post_init__ at core_v0.16.0, the core of the 26.x containers), and what each payload can spell
def cuda_graph_scope_needs_graph(t: TrialConfig) -> Broken | None:
    """A space varying ``cuda_graph_scope`` would run each ungraphed point once per scope: the scope means nothing
    without a graph. The first listed scope keeps the point; the others are rejected as duplicates (free)."""
    first = t.first_listed.get("cuda_graph_scope")
    scope = t.values["cuda_graph_scope"]
    if t.values["cuda_graph"] == "none" and "cuda_graph_scope" in t.varied and scope != first:
        return broken(
            f"cuda_graph_scope={scope} has no effect with cuda_graph=none: the same run as cuda_graph_scope={first}",
            "cuda_graph_scope",
            "cuda_graph",
        )
    return None


def cuda_graph_scope_impl(t: TrialConfig) -> Broken | None:
    """``full_iteration`` is Megatron-Core's own (local) implementation: "To use full iteration cuda graph, please
    use cuda_graph_impl=local instead of cuda_graph_impl=transformer_engine" (transformer_config.py)."""
    if t.values["cuda_graph"] == "transformer_engine" and t.values["cuda_graph_scope"] == "full_iteration":
        return broken(
            "cuda_graph_scope=full_iteration needs cuda_graph=local (Megatron-Core's own graphs); "
            "transformer_engine graphs one layer at a time",
            "cuda_graph_scope",
            "cuda_graph",
        )
    return None


def cuda_graph_scope_fits_arch(t: TrialConfig) -> Broken | None:
    """The scope's parts must exist in the model: ``moe``/``moe_router`` need experts ("moe cuda graph is only
    supported for MoE"), ``moe`` a drop-and-pad MoE ("moe cuda graph is only supported with drop-padding MoE":
    ``moe_token_drop``), and so does ``full``, the whole layer, on a MoE model (Megatron-Core's
    ``is_whole_moe_cuda_graph_scope``: an empty scope, the whole layer, captures the whole MoE block; a dropless
    block's host sync cannot be captured), ``mlp`` a dense MLP ("mlp cuda graph is only supported for dense layers"; dse's
    MoE architectures put experts in every layer), ``mamba`` a hybrid Mamba model (none in dse's registry)."""
    if t.values["cuda_graph"] == "none":
        return None
    scope, name, moe = t.values["cuda_graph_scope"], t.arch.name, t.arch.num_experts > 0
    parts = scope.split(",")
    if not moe and any(p.startswith("moe") for p in parts):
        return broken(f"cuda_graph_scope={scope} graphs MoE parts; {name} is dense", "cuda_graph_scope")
    if moe and ("moe" in parts or scope == "full") and not t.layout.moe_token_drop:
        what = "the whole MoE block" if "moe" in parts else "the whole layer, its MoE block included"
        return broken(
            f"cuda_graph_scope={scope} graphs {what}, which Megatron-Core allows only for drop-and-pad MoE (a "
            "capacity factor with padding): set moe_token_drop=true, or graph moe_router,moe_preprocess",
            "cuda_graph_scope",
            "moe_token_drop",
        )
    if moe and "mlp" in parts:
        return broken(
            f"cuda_graph_scope={scope} graphs a dense MLP; {name} has experts in every layer (use moe or moe_router)",
            "cuda_graph_scope",
        )
    if "mamba" in parts:
        return broken(
            f"cuda_graph_scope={scope} needs a hybrid Mamba model; {name} has no Mamba layers", "cuda_graph_scope"
        )
    return None


def cuda_graph_no_offload(t: TrialConfig) -> Broken | None:
    """Megatron-Core: "CUDA graphs not supported with CPU offloading." (activation offloading)."""
    impl, n = t.values["cuda_graph"], t.layout.cpu_offload_layers
    if impl != "none" and n:
        return broken(
            f"cuda_graph={impl} cannot run with cpu_offload_layers={n}; Megatron-Core does not graph offloaded layers",
            "cuda_graph",
            "cpu_offload_layers",
        )
    return None


def cuda_graph_recompute(t: TrialConfig) -> Broken | None:
    """Megatron-Core: "full recompute is only supported with full iteration CUDA graph"."""
    impl, scope = t.values["cuda_graph"], t.values["cuda_graph_scope"]
    if impl != "none" and t.layout.recompute == "full" and scope != "full_iteration":
        return broken(
            f"recompute=full with cuda_graph={impl} needs cuda_graph_scope=full_iteration, not {scope}",
            "recompute",
            "cuda_graph_scope",
        )
    return None


MOE_MODULES = ("moe_act", "moe", "shared_experts")


def recompute_modules_need_selective(t: TrialConfig) -> Broken | None:
    """Megatron-Core reads ``recompute_modules`` only under ``recompute_granularity="selective"``
    (``TransformerConfig.__post_init__``, megatron/core/transformer/transformer_config.py), and NeMo's and
    Bridge's performance scripts set selective with them (``set_recompute_configs`` asserts it;
    ``_set_recompute_overrides`` sets it): modules other than the default with another recompute are refused,
    not silently dropped."""
    modules = t.layout.recompute_modules
    if modules != knobs.DEFAULT_RECOMPUTE_MODULES and t.layout.recompute != "selective":
        return broken(
            f"recompute_modules={modules} applies to recompute=selective only (got recompute={t.layout.recompute}); "
            "Megatron-Core reads recompute_modules with selective recompute alone",
            "recompute_modules",
            "recompute",
        )
    return None


def cuda_graph_fsdp_hooks(t: TrialConfig) -> Broken | None:
    """Megatron-Core's own per-layer graphs replay a layer only with Megatron-Core DDP's forward pre-hooks on it
    (megatron/core/transformer/cuda_graphs.py, ``CudaGraphManager.call_ddp_preforward_hook``: "Tried to cudagraph a
    module with user registered pre-forward hooks, which is not allowed."); Megatron FSDP gathers each layer's
    weights in a hook of its own, so local per-layer graphs cannot run with it."""
    if t.values["cuda_graph"] == "local" and t.values["cuda_graph_scope"] != "full_iteration" and t.layout.fsdp:
        return broken(
            "cuda_graph=local graphs each layer, which Megatron FSDP's weight-gather hooks forbid; use "
            "cuda_graph_scope=full_iteration, cuda_graph=transformer_engine or fsdp=false",
            "cuda_graph",
            "fsdp",
        )
    return None


def cuda_graph_te_allocator(t: TrialConfig) -> Broken | None:
    """Megatron-LM's arguments.py: Transformer Engine's graphs with PyTorch's expandable segments need
    NCCL_GRAPH_REGISTER=0 ("to avoid illegal memory access when using CUDA Graph with
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"); Bridge's runs set the same environment."""
    alloc = t.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if t.values["cuda_graph"] == "transformer_engine" and "expandable_segments:True" in alloc:
        if t.env.get("NCCL_GRAPH_REGISTER") != "0":
            return broken(
                "cuda_graph=transformer_engine with env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True needs "
                "env.NCCL_GRAPH_REGISTER=0",
                "cuda_graph",
            )
    return None


def cuda_graph_payload(t: TrialConfig) -> Broken | None:
    """What each payload can spell. NeMo 2 (and the sim payload, which takes its command line): its performance
    scripts express a graph only as ``enable_cuda_graph`` (Megatron-Core's local graphs of the whole layer) and turn
    it off with Megatron FSDP ("Currently, cuda graphs are not supported with FSDP", scripts/performance/
    helpers.py). recipes.mcore builds a TransformerConfig but has no graph capture in its training loop (no
    CudaGraphManager warm-up, no TE make_graphed_callables), so it runs none."""
    impl, scope = t.values["cuda_graph"], t.values["cuda_graph_scope"]
    if impl == "none":
        return None
    if t.payload == "mcore":
        return broken(
            "recipes.mcore does not capture CUDA graphs; use cuda_graph=none or the mbridge payload", "cuda_graph"
        )
    if t.payload in ("nemo2", "sim") and (impl, scope) != ("local", "full"):
        return broken(
            f"NeMo 2 spells CUDA graphs as enable_cuda_graph only (cuda_graph=local, cuda_graph_scope=full); "
            f"cuda_graph={impl} with cuda_graph_scope={scope} needs the mbridge payload",
            "cuda_graph",
            "cuda_graph_scope",
        )
    if t.payload in ("nemo2", "sim") and t.layout.fsdp:
        return broken("NeMo 2 runs no CUDA graphs with Megatron FSDP (fsdp=true)", "cuda_graph", "fsdp")
    return None


def recompute_modules_fit_model(t: TrialConfig) -> Broken | None:
    """Megatron-Core's checks of the modules against the model (``TransformerConfig.__post_init__``):
    ``mla_up_proj`` needs multi-latent attention; ``moe_act`` MoE's grouped GEMM (NVIDIA's MoE recipes use it),
    and ``moe`` / ``shared_experts`` recompute MoE layers a dense model has not (there they would recompute
    nothing: refused rather than run as a duplicate); ``moe_act`` and ``layernorm`` cannot recompute with FP8
    delayed scaling."""
    modules = set(t.layout.recompute_modules.split(","))
    if t.layout.recompute != "selective":
        return None
    moe = sorted(modules & set(MOE_MODULES))
    if moe and not t.arch.num_experts:
        return broken(
            f"recompute_modules {', '.join(moe)} recompute MoE layers; {t.arch.name} is dense", "recompute_modules"
        )
    if "mla_up_proj" in modules and not t.arch.is_mla:
        return broken(
            f"recompute_modules mla_up_proj needs multi-latent attention; {t.arch.name} has none", "recompute_modules"
        )
    fp8_delayed = t.layout.precision == "fp8" and t.layout.fp8_recipe == "delayed"
    if fp8_delayed and modules & {"moe_act", "layernorm"}:
        return broken(
            "recompute_modules moe_act and layernorm cannot recompute with FP8 delayed scaling (Megatron-Core)",
            "recompute_modules",
            "fp8_recipe",
        )
    return None


def nccl_ub_supported(t: TrialConfig) -> Broken | None:
    """NCCL user-buffer registration of the data-parallel buffers: it needs data-parallel collectives (dp x cp
    above 1; without them it would change nothing), a payload that registers them (recipes.mcore does not), and
    no ``expandable_segments:True`` allocator (Megatron-Core's ``DistributedDataParallelConfig.__post_init__``
    refuses the two together below torch 2.11: "compatibility issue with torch.cuda.MemPool API")."""
    if not t.layout.nccl_ub:
        return None
    if t.dp * t.layout.cp <= 1:
        return broken("nccl_ub registers the data-parallel buffers; with dp x cp = 1 there are none", "nccl_ub")
    if t.payload == "mcore":
        return broken("nccl_ub: the mcore payload does not register NCCL user buffers; use nemo2 or mbridge", "nccl_ub")
    if "expandable_segments:True" in t.env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(","):
        return broken(
            "nccl_ub cannot run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (Megatron-Core refuses the "
            "pair: torch.cuda.MemPool)",
            "nccl_ub",
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
    moe_token_drop_supported,
    fp8_needs_hopper,
    nvfp4_needs_blackwell,
    nvfp4_payload,
    nvfp4_dims_aligned,
    nvfp4_no_tp_comm_overlap,
    tp_within_nvlink,
    recompute_layers_in_stage,
    fsdp_no_pp,
    tp_comm_overlap_needs_tp,
    cpu_offload_supported,
    cp_needs_te_attention,
    fp8_recipe_needs_fp8,
    cuda_graph_scope_needs_graph,
    cuda_graph_scope_impl,
    cuda_graph_scope_fits_arch,
    cuda_graph_no_offload,
    cuda_graph_recompute,
    cuda_graph_fsdp_hooks,
    cuda_graph_te_allocator,
    cuda_graph_payload,
    recompute_modules_need_selective,
    recompute_modules_fit_model,
    nccl_ub_supported,
    tp_comm_overlap_supported,  # a userbuffer config exists for (GPU, hidden, tp, precision)
)


# Rules that reject a point as the same run as another (a value with no effect, other than the space's first
# listed one): the first knob each names is that value's; the baseline moves it to the first listed value
# (dse.study.request.baseline_of) rather than call the recipe's layout broken.
DUPLICATE_RULES = frozenset({"dense_takes_no_moe_knobs", "fp8_recipe_needs_fp8", "cuda_graph_scope_needs_graph"})


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
