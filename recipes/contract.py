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

# dse's own control variables: dse sets them from the space, the system and the model, and the payload obeys
# them; a space or an imported file that set one would run something other than what the study records.
CONTROL_ENV = frozenset({ENV_NEMO_TASK, ENV_NEMO_RECIPE, ENV_FLOPS_CALLBACK, ENV_MBRIDGE_RECIPE, *SIM_ENV.values()})
# The payloads' own settings a space may set (the simulated trainer's pacing and echo, for tests): name -> what.
PAYLOAD_SETTINGS = {
    "DSE_SIM_STEP_S": "the simulated trainer's seconds per step (a long-running trial)",
    "DSE_SIM_SLEEP_S": "the simulated trainer's seconds before its first step (a job that hangs)",
    "DSE_SIM_ECHO_ENV": "names whose values the simulated trainer prints (what the process received)",
    "DSE_SIM_TEARDOWN_S": "the simulated trainer's seconds of teardown on rank 0",
    "DSE_SIM_PEER_WAIT_S": "the simulated trainer's seconds other ranks wait for rank 0",
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


def moe_model_flops_per_step(arch, *, gbs: int, seq_length: int, convention: str = "causal") -> float:
    """Model FLOPs of one step of a mixture-of-experts and/or multi-latent-attention decoder (``arch`` a
    ``recipes.models.ModelArch``), as Megatron-Bridge counts them for its TFLOP/s figures
    (``megatron/bridge/training/utils/flop_utils.py``, ``transformer_flops``; Megatron-LM's
    ``num_floating_point_operations`` is the same formula):

      FLOPs/step = 6·B·s·[ h·( e·F·L_dense + e·(k·F_e + F_sh)·L_moe ) + attention + MTP + h·V·(1 + n_mtp) ]

    per token; the n_mtp multi-token-prediction layers count as one more layer of the last layer's kind and
    add their projection (3h + 2h²) and output layer. Attention per layer: GQA ``h·(a + 2g)·d + a·d·h + c·a·d·s/2``
    (c as in :func:`model_flops_per_step`); MLA ``q_lora·(h + a·(d_nope + d_rope)) (+ h·a·(d_nope + d_rope) without
    query compression) + kv_lora·(h + a·(d_nope + d_v)) + h·d_rope + a·d_v·h + c·a·(d_nope + d_rope + d_v)·s/2``
    (Bridge's ``+1`` of the norms included); sliding-window layers count the window's average context instead of
    s/2 (Bridge's ``swa_context``). The vocabulary is not padded, as in :func:`model_flops_per_step`.
    Tokens routed to experts are counted at top-k whether or not a capacity factor drops some (Bridge's count).
    """
    if convention not in FLOPS_CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; use one of {', '.join(FLOPS_CONVENTIONS)}")
    c = 1 if convention == "causal" else 2
    e = 3 if arch.gated_mlp else 2
    h, a, s, n_mtp = arch.hidden_size, arch.num_attention_heads, seq_length, arch.mtp_layers
    layers = arch.num_layers + n_mtp
    if arch.num_experts:
        moe = arch.num_layers - arch.moe_first_dense_layers + n_mtp  # the last layer is MoE: so are the MTP layers
        dense = arch.moe_first_dense_layers
        ffn_e = arch.moe_ffn_hidden_size or arch.ffn_hidden_size
        mlp = e * arch.ffn_hidden_size * dense + e * (arch.moe_topk * ffn_e + arch.moe_shared_expert_size) * moe
    else:
        mlp = e * arch.ffn_hidden_size * layers
    if arch.kv_lora_rank:
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        q = h * a * qk if arch.q_lora_rank is None else arch.q_lora_rank * (h + a * qk + 1)
        kv = arch.kv_lora_rank * (h + a * (arch.qk_nope_head_dim + arch.v_head_dim) + 1) + h * arch.qk_rope_head_dim
        core = c * s * a * (qk + arch.v_head_dim) / 2
        attn = q + kv + a * arch.v_head_dim * h + core
        attn_all = layers * attn
    else:
        d = arch.kv_channels or h // a
        g = arch.num_query_groups
        proj = h * (a + 2 * g) * d + a * d * h
        attn_all = layers * (proj + c * a * d * s)
        if arch.sliding_window and arch.sliding_window + 1 < s:
            # window_size (W, 0) attends to W + 1 tokens: on average W' - W'(W' - 1)/(2s) of them, both directions
            # of the convention alike (Bridge's swa_context); every full_attention_every-th layer attends fully
            w = arch.sliding_window + 1
            every = arch.full_attention_every
            windowed = sum(1 for i in range(layers) if not every or (i + 1) % every)
            attn_all -= windowed * a * d * (c * s - 2 * (w - w * (w - 1) / (2 * s)))
    per_token = h * mlp + attn_all + n_mtp * (3 * h + 2 * h * h) + h * arch.vocab_size * (1 + n_mtp)
    return 6.0 * gbs * s * per_token
