"""Analytical performance and memory model (first cut; replaced by the calibrated model)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dse.trial import TrialConfig

_PEAK = {"a100": 312, "h100": 989, "h200": 989, "b200": 2250, "gb200": 2500, "gb300": 2500}
_HBM = {"a100": 80, "h100": 80, "h200": 141, "b200": 180, "gb200": 186, "gb300": 279}


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    peak_memory_gib: float
    gpu_memory_gib: float
    fits: bool
    breakdown: dict[str, float] = field(default_factory=dict)


def model_flops_per_step(arch, gbs: int, seq_length: int, convention: str = "causal") -> float:
    c = 1 if convention == "causal" else 2
    h, a, g, d, F, L = (arch.hidden_size, arch.num_attention_heads, arch.num_query_groups, arch.head_dim,
                        arch.ffn_hidden_size, arch.num_layers)
    e = 3 if arch.gated_mlp else 2
    return 6 * gbs * seq_length * (L * (e * h * F + 2 * h * a * d + 2 * h * g * d + c * a * d * seq_length)
                                   + h * arch.vocab_size)


def predict(trial: TrialConfig, *, flops_convention: str = "causal") -> Prediction:
    arch, n = trial.arch, trial.num_gpus
    flops = model_flops_per_step(arch, trial.gbs, trial.seq_length, flops_convention)
    peak = _PEAK[trial.system.gpu] * 1e12 * (1.6 if trial.precision == "fp8" else 1.0)
    m = max(trial.num_microbatches, 1)
    bubble = (trial.pp - 1) / (trial.vp * m)
    recompute = {"none": 1.0, "selective": 1.05, "full": 1.33}[trial.recompute]
    eff = 0.55 * (1 - 0.04 * (trial.tp - 1) ** 0.5) * (1 - 0.03 * (trial.cp - 1))
    step = flops / n / (peak * eff) * recompute * (1 + bubble)
    params = 12 * arch.num_layers * arch.hidden_size**2 + arch.vocab_size * arch.hidden_size
    dp = max(trial.dp, 1)
    weights = params / (trial.tp * trial.pp) * (6 + 12 / dp)
    s, b, h = trial.seq_length / trial.cp, trial.mbs, arch.hidden_size
    act_layer = {"none": s * b * h * 34 / trial.tp, "selective": s * b * h * 34 / trial.tp,
                 "full": 2 * s * b * h}[trial.recompute]
    acts = act_layer * arch.num_layers / trial.pp * min(trial.pp, m)
    mem = (weights + acts) / 2**30 + 4
    hbm = float(_HBM[trial.system.gpu])
    return Prediction(step, trial.gbs * trial.seq_length / (step * n), flops / (step * n) / 1e12, mem, hbm,
                      mem <= hbm)
