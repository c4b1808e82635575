"""The contract between the controller (``dse``) and the payloads that run inside the training container.

Plain data and one formula, standard library only: both sides import this module, so a payload name, an
environment variable, the log's file name, a scheduler's end state or the FLOPs convention is written once.
"""

from __future__ import annotations

# Payload flavours: ``python -m recipes.<payload>`` inside the container.
PAYLOADS = ("nemo2", "mbridge", "mcore", "sim")

# The trainer's output in every run directory (the simulated backend writes it there too).
LOG_NAME = "log.txt"

# Environment the payloads read (set by dse.launch.build_plan).
ENV_NEMO_TASK = "DSE_NEMO_TASK"  # pretrain | finetune
ENV_NEMO_RECIPE = "DSE_NEMO_RECIPE"  # the NeMo 2 recipe module (llama3_70b) or factory (llama3_70b_recipe)
ENV_FLOPS_CALLBACK = "DSE_FLOPS_CALLBACK"  # "1": add FLOPsMeasurementCallback; "0": the container lacks it
ENV_MBRIDGE_RECIPE = "DSE_MBRIDGE_RECIPE"  # the Megatron-Bridge recipe, when argv names none
ENV_VBOOST = "ENABLE_VBOOST"  # "1": PerfEnvPlugin's vboost pre-step
# The simulated trainer's figures: SimRun field -> variable (python -m recipes.sim reads them).
SIM_ENV = {
    "step_time_s": "DSE_SIM_STEP_TIME_S",
    "tflops_per_gpu": "DSE_SIM_TFLOPS_PER_GPU",
    "peak_memory_gib": "DSE_SIM_PEAK_MEMORY_GIB",
    "gpu_memory_gib": "DSE_SIM_GPU_MEMORY_GIB",
    "oom": "DSE_SIM_OOM",
    "oom_after": "DSE_SIM_OOM_AFTER",
    "seed": "DSE_SIM_SEED",
    "max_steps": "DSE_SIM_MAX_STEPS",
    "gbs": "DSE_SIM_GBS",
}

# A scheduler's word for how a job ended -> trial status; None: decided by the log and the exit code.
# Slurm's sacct states, and torchx's SUCCEEDED (nemo-run's LocalExecutor's clean end).
SCHEDULER_END_STATES: dict[str, str | None] = {
    "COMPLETED": None,
    "SUCCEEDED": None,
    "FAILED": None,
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "oom",
    "CANCELLED": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "PREEMPTED": "failed",
    "REVOKED": "failed",
}
CLEAN_END_STATES = frozenset({"COMPLETED", "SUCCEEDED"})

FLOPS_CONVENTIONS = ("causal", "noncausal")


def model_flops_per_step(
    *,
    num_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    num_query_groups: int,
    ffn_hidden_size: int,
    vocab_size: int,
    gated_mlp: bool,
    gbs: int,
    seq_length: int,
    convention: str = "causal",
) -> float:
    """Model FLOPs of one step (forward and backward) of a dense GQA decoder, as Megatron-Bridge and NeMo report
    them (``shared/reference/README.md``):

      FLOPs/step = 6·B·s·[ L·( e·h·F + 2·h·a·d + 2·h·g·d + c·a·d·s ) + h·V ]

    e = 3 for gated MLPs (SwiGLU) else 2; c = 1 in the causal convention (the masked half of the score and
    value products not counted, current Megatron-LM) and 2 in the noncausal one. Recompute adds hardware
    FLOPs, never model FLOPs. ValueError for an unknown convention.
    """
    if convention not in FLOPS_CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; use one of {', '.join(FLOPS_CONVENTIONS)}")
    c = 1 if convention == "causal" else 2
    e = 3 if gated_mlp else 2
    h, a, g, F = hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size
    d = h // a
    per_layer = e * h * F + 2 * h * a * d + 2 * h * g * d + c * a * d * seq_length
    return 6.0 * gbs * seq_length * (num_layers * per_layer + h * vocab_size)
