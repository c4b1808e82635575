"""Validity rules. Each rule is a small named function of a trial returning a :class:`Broken` (a one-line
reason and the knobs it names) or None.

Rejected points are never launched: the environment records them as ``rejected`` with the rule's name and
reason. Rules are checked in the order of :data:`RULES`; :func:`check` returns the first that fails and
:func:`check_all` every one (``dse space`` counts rejections by rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dse import hardware
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
    uneven = _uneven_stages(t)
    if uneven is not None:
        return uneven
    if t.layout.pp_first_layers or t.layout.pp_last_layers:
        return None
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


def _uneven_stages(t: TrialConfig) -> Broken | None:
    """With the first / last stage's layers set (Megatron's num_layers_in_first/last_pipeline_stage,
    TransformerConfig's checks): a pipeline to place them on, and the other layers split evenly over the other
    stages (every stage holding at least one)."""
    first, last, pp, layers = t.layout.pp_first_layers, t.layout.pp_last_layers, t.layout.pp, t.arch.num_layers
    if not (first or last):
        return None
    named = tuple(n for n, v in (("pp_first_layers", first), ("pp_last_layers", last)) if v) + ("pp",)
    if pp == 1:
        return broken("pp_first_layers / pp_last_layers need pp > 1", *named)
    rest, others = layers - first - last, pp - (1 if first else 0) - (1 if last else 0)
    if rest < 0 or (others == 0 and rest) or (others and (rest < others or rest % others)):
        return broken(
            f"the {rest} layers besides the first ({first or 'even'}) and last ({last or 'even'}) stage's do not "
            f"split evenly over the other {others} of pp={pp} stages",
            *named,
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


def ep_divides_experts(t: TrialConfig) -> Broken | None:
    experts = t.arch.num_experts
    if experts == 0 and t.layout.ep != 1:
        return broken(f"ep={t.layout.ep} on a dense model; dense models take ep=1", "ep")
    if experts and experts % t.layout.ep:
        return broken(f"ep={t.layout.ep} does not divide the {experts} experts", "ep")
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
    vp_needs_pp,
    gbs_divisible,
    interleaved_microbatches,
    seq_divisible,
    sp_needs_tp,
    ep_divides_experts,
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
