"""Stand-in validity rules until ``dse.constraints`` is on this branch.

TODO(lead): delete this module once ``dse/constraints.py`` is merged; ``dse predict`` and
``bench/model_accuracy.py`` import ``dse.constraints`` first and use this only when it is missing.
The rules are the divisibility rules of issue 2, with one difference worth keeping in the real module:
layers must be divisible by ``pp·vp`` *or* ``num_layers + 2`` must be (Megatron's
``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``, which NVIDIA's
Llama 3.1 405B recipes use for 126 layers at pp=8 vp=8 and pp=16 vp=4).
"""

from __future__ import annotations

from dataclasses import dataclass

HOPPER_OR_NEWER = ("h100", "h200", "b200", "gb200", "gb300")


@dataclass(frozen=True)
class Rejection:
    rule: str
    reason: str


def _rules(t):
    v, a = t.values, t.arch
    tp, pp, cp, vp, mbs, gbs, s = v["tp"], v["pp"], v["cp"], v["vp"], v["mbs"], v["gbs"], v["seq_length"]
    n = t.num_gpus
    mp = tp * pp * cp
    if n % mp:
        yield "world_divisible", f"world size {n} is not divisible by tp*pp*cp = {mp}"
        return
    dp = n // mp
    if a.num_attention_heads % tp or a.num_query_groups % tp:
        yield "heads_divisible", (f"tp={tp} must divide the attention heads ({a.num_attention_heads}) "
                                  f"and query groups ({a.num_query_groups})")
    layers = a.num_layers
    if layers % (pp * vp) and (layers + 2) % (pp * vp):
        yield "layers_divisible", f"pp*vp = {pp}*{vp} divides neither the {layers} layers nor layers + 2"
    if vp > 1 and pp == 1:
        yield "vp_needs_pp", f"vp={vp} (interleaving) needs pp > 1"
    if gbs % (mbs * dp):
        yield "gbs_divisible", f"gbs={gbs} is not divisible by mbs*dp = {mbs}*{dp} = {mbs * dp}"
    elif vp > 1 and (gbs // (mbs * dp)) % pp:
        yield "interleaved_microbatches", f"the interleaved schedule needs the micro-batches divisible by pp={pp}"
    if cp > 1 and s % (2 * cp):
        yield "seq_divisible", f"seq_length={s} is not divisible by 2*cp = {2 * cp}"
    if t.sequence_parallel and s % tp:
        yield "seq_divisible", f"seq_length={s} is not divisible by tp={tp} (sequence parallelism)"
    if v["sp"] and tp == 1:
        yield "sp_needs_tp", "sequence parallelism (sp=true) needs tp > 1"
    if v["ep"] != 1 and a.num_experts == 0:
        yield "ep_divides_experts", f"ep={v['ep']} on a dense model; dense models take ep=1"
    if v["precision"] == "fp8" and t.system.gpu not in HOPPER_OR_NEWER:
        yield "fp8_needs_hopper", f"fp8 needs Hopper or newer; {t.system.gpu} has no FP8 tensor cores"
    if tp > min(t.system.nvlink_domain, n):
        yield "tp_within_nvlink", f"tp={tp} spans more than one NVLink domain ({t.system.nvlink_domain} GPUs)"
    if v["recompute_num_layers"] and v["recompute"] != "full":
        yield "recompute_layers_in_stage", "recompute_num_layers applies to recompute=full only"
    if v["fsdp"] and pp > 1:
        yield "fsdp_no_pp", "fsdp (Megatron FSDP) is used without pipeline parallelism; pp must be 1"


def check(trial) -> Rejection | None:
    """The first rule ``trial`` breaks, or None."""
    for rule, reason in _rules(trial):
        return Rejection(rule, reason)
    return None
