"""Validity rules. Each rule is a small named function of a trial returning a one-line reason or None.

Rejected points are never launched: the environment records them as ``rejected`` with the rule's name and
reason. Rules are checked in the order of :data:`RULES`; :func:`check` returns the first that fails and
:func:`check_all` every one (``dse space`` counts rejections by rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dse import hardware
from dse.hardware import HARDWARE, gpus_where
from dse.trial import TrialConfig


@dataclass(frozen=True)
class Rejection:
    rule: str
    reason: str


def world_divisible(t: TrialConfig) -> str | None:
    k = t.layout
    mp = t.model_parallel
    if t.num_gpus % mp:
        return f"world size {t.num_gpus} is not divisible by tp*pp*cp = {k.tp}*{k.pp}*{k.cp} = {mp}"
    return None


def heads_divisible(t: TrialConfig) -> str | None:
    k = t.layout
    a = t.arch
    if a.num_attention_heads % k.tp or a.num_query_groups % k.tp:
        return (f"tp={k.tp} must divide the attention heads ({a.num_attention_heads}) "
                f"and query groups ({a.num_query_groups})")
    return None


def layers_divisible(t: TrialConfig) -> str | None:
    """pp (and pp*vp) must divide the layers; Megatron may count the embedding and the loss as one pipeline
    layer each (``account_for_embedding/loss_in_pipeline_split``, as NeMo's 405B recipe does: 126 + 2 = 128)."""
    k = t.layout
    chunks = k.pp * k.vp
    if t.pipeline_layers % chunks:
        what = f"pp={k.pp}" if k.vp == 1 else f"pp*vp = {k.pp}*{k.vp}"
        return f"{what} does not divide the {t.arch.num_layers} layers (nor {t.arch.num_layers + 2} with embedding and loss)"
    return None


def vp_needs_pp(t: TrialConfig) -> str | None:
    k = t.layout
    return f"vp={k.vp} (interleaving) needs pp > 1" if k.vp > 1 and k.pp == 1 else None


def gbs_divisible(t: TrialConfig) -> str | None:
    k = t.layout
    if t.dp and k.gbs % (k.mbs * t.dp):
        return f"gbs={k.gbs} is not divisible by mbs*dp = {k.mbs}*{t.dp} = {k.mbs * t.dp}"
    return None


def interleaved_microbatches(t: TrialConfig) -> str | None:
    k = t.layout
    m = t.num_microbatches
    if k.vp > 1 and m and m % k.pp:
        return f"the interleaved schedule needs the {m} micro-batches to be divisible by pp={k.pp}"
    return None


def seq_divisible(t: TrialConfig) -> str | None:
    k = t.layout
    s = k.seq_length
    if k.cp > 1 and s % (2 * k.cp):
        return f"seq_length={s} is not divisible by 2*cp = {2 * k.cp} (load-balanced context parallelism)"
    if t.sequence_parallel and s % k.tp:
        return f"seq_length={s} is not divisible by tp={k.tp} (sequence parallelism)"
    return None


def sp_needs_tp(t: TrialConfig) -> str | None:
    return "sequence parallelism (sp=true) needs tp > 1" if t.values["sp"] and t.layout.tp == 1 else None


def ep_divides_experts(t: TrialConfig) -> str | None:
    k = t.layout
    experts = t.arch.num_experts
    if experts == 0 and k.ep != 1:
        return f"ep={k.ep} on a dense model; dense models take ep=1"
    if experts and experts % k.ep:
        return f"ep={k.ep} does not divide the {experts} experts"
    return None


def fp8_needs_hopper(t: TrialConfig) -> str | None:
    k = t.layout
    gpu = HARDWARE[t.system.gpu]
    if k.precision == "fp8" and not gpu.fp8:
        return f"fp8 needs Hopper or newer; {t.system.gpu} has no FP8 tensor cores"
    if k.precision == "fp8" and k.fp8_recipe == "mxfp8" and not gpu.mxfp8:
        return f"fp8_recipe=mxfp8 needs Blackwell ({', '.join(gpus_where('mxfp8'))})"
    return None


def userbuffer_config(trial: TrialConfig) -> str | None:
    """The name of NeMo's tuned userbuffer config for ``trial``'s (GPU, precision, hidden size, tp), or None.

    One table for the controller and the payload: ``recipes.nemo2.userbuffers`` (plain data).
    """
    return hardware.userbuffer_config(trial.system.gpu, trial.layout.precision, trial.arch.hidden_size, trial.layout.tp)


def tp_comm_overlap_supported(trial: TrialConfig) -> str | None:
    """Constraint rule: the reason ``trial`` cannot use tp_comm_overlap, or None when it can (or does not ask).

    TP comm overlap needs a userbuffer config tuned for the GPU family, model width, tp and precision;
    NeMo ships a handful (``recipes.nemo2.userbuffers.UB_CONFIGS``) and we do not launch untuned ones.
    """
    k = trial.layout
    if not k.tp_comm_overlap or k.tp == 1:  # tp == 1: the rule tp_comm_overlap_needs_tp says why
        return None
    if userbuffer_config(trial) is not None:
        return None
    family = HARDWARE[trial.system.gpu].userbuffer_family or trial.system.gpu
    return (f"tp_comm_overlap needs a userbuffer config for ({family}, hidden {trial.arch.hidden_size}, "
            f"tp {k.tp}, {k.precision}); NeMo has none, so turn tp_comm_overlap off for this point")




def tp_within_nvlink(t: TrialConfig) -> str | None:
    domain = min(t.system.nvlink_domain, t.num_gpus)
    if t.layout.tp > domain:
        return f"tp={t.layout.tp} spans more than one NVLink domain ({t.system.nvlink_domain} GPUs)"
    return None


def recompute_layers_in_stage(t: TrialConfig) -> str | None:
    k = t.layout
    n = k.recompute_num_layers
    if n and k.recompute != "full":
        return f"recompute_num_layers={n} applies to recompute=full only (got recompute={k.recompute})"
    per_stage = t.pipeline_layers // (k.pp * k.vp)
    if n > per_stage:
        return f"recompute_num_layers={n} exceeds the {per_stage} layers of a pipeline stage chunk"
    return None


def fsdp_no_pp(t: TrialConfig) -> str | None:
    k = t.layout
    return "fsdp (Megatron FSDP) is used without pipeline parallelism; pp must be 1" if k.fsdp and k.pp > 1 else None


def tp_comm_overlap_needs_tp(t: TrialConfig) -> str | None:
    if t.layout.tp_comm_overlap and (t.layout.tp == 1 or not t.sequence_parallel):
        return "tp_comm_overlap needs tp > 1 with sequence parallelism"
    return None


def cpu_offload_supported(t: TrialConfig) -> str | None:
    """What Megatron-Core allows with activation offloading (``TransformerConfig.__post_init__``, megatron-core
    0.15: ``0 <= cpu_offloading_num_layers < num_layers``, no pipeline parallelism, no activation recompute)."""
    k = t.layout
    n = k.cpu_offload_layers
    if not n:
        return None
    if n >= t.arch.num_layers:
        return f"cpu_offload_layers={n} must be less than the model's {t.arch.num_layers} layers"
    if k.pp > 1:
        return f"cpu_offload_layers={n} needs pp=1; Megatron-Core cannot offload activations with pipeline parallelism"
    if k.recompute != "none":
        return f"cpu_offload_layers={n} needs recompute=none; Megatron-Core cannot offload with recompute={k.recompute}"
    return None


def cp_needs_te_attention(t: TrialConfig) -> str | None:
    """Context parallelism runs inside Transformer Engine's attention; Megatron's unfused/local attention
    has no CP support."""
    backend, cp = t.layout.attention_backend, t.layout.cp
    if cp > 1 and backend in ("unfused", "local"):
        return f"cp={cp} needs Transformer Engine attention; attention_backend={backend} has no context parallelism"
    return None


def fp8_recipe_needs_fp8(t: TrialConfig) -> str | None:
    """A space that varies both ``precision`` and ``fp8_recipe`` would otherwise run each bf16 point once per
    recipe: the recipe has no effect without FP8. The bf16 point is kept once, with the first recipe the space
    lists; the others are rejected as duplicates (free: a rejected point costs no budget)."""
    k = t.layout
    first = t.first_listed.get("fp8_recipe")
    if k.precision != "fp8" and "fp8_recipe" in t.varied and k.fp8_recipe != first:
        return (f"fp8_recipe={k.fp8_recipe} has no effect with precision={k.precision}: the same run as "
                f"fp8_recipe={first}")
    return None


RULES: tuple[Callable[[TrialConfig], str | None], ...] = (
    world_divisible, heads_divisible, layers_divisible, vp_needs_pp, gbs_divisible, interleaved_microbatches,
    seq_divisible, sp_needs_tp, ep_divides_experts, fp8_needs_hopper, tp_within_nvlink,
    recompute_layers_in_stage, fsdp_no_pp, tp_comm_overlap_needs_tp, cpu_offload_supported,
    cp_needs_te_attention, fp8_recipe_needs_fp8, tp_comm_overlap_supported,  # a userbuffer config exists for (GPU, hidden, tp, precision)
)


def check(trial: TrialConfig) -> Rejection | None:
    """The first rule ``trial`` breaks, or None when it is valid."""
    for rule in RULES:
        reason = rule(trial)
        if reason:
            return Rejection(rule.__name__, reason)
    return None


def check_all(trial: TrialConfig) -> list[Rejection]:
    """Every rule ``trial`` breaks."""
    return [Rejection(r.__name__, reason) for r in RULES if (reason := r(trial))]


def all_rules() -> list[str]:
    return [r.__name__ for r in RULES]
