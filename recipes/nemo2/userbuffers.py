"""Which tensor-parallel communication-overlap (userbuffer) configs NeMo 2 ships, as plain data.

NeMo tunes a ``TransformerLayerTPOverlapCfg`` per GPU generation, precision, model width and TP size
(``nemo.collections.llm.recipes.tp_overlap_configs.userbuffers``); each config picks the overlap method
(ring exchange, pipelined, bulk) and SM count per GEMM. Without one, Transformer Engine falls back to its
defaults. The controller uses :func:`lookup` to reject ``tp_comm_overlap`` where no tuned config exists and to
name the one the factory should load; the NeMo test checks every name here against the installed NeMo.

NeMo's performance scripts (``scripts/performance/llm/pretrain_<model>.py``) pick a config by model, GPU and
precision alone and load it at whatever TP size the layout has; :data:`USED_AT` lists the layouts of their
recommended configs (``scripts/performance/recommended_model_configs/model_configs_<gpu>.csv``) that run a
config at a TP size other than the one it was tuned at. Megatron-Bridge ships the same configs with its own
table of where its scripts use them (``recipes.mbridge.userbuffers``).
"""

from __future__ import annotations

# (family, precision, hidden_size, tp) -> attribute name in NeMo's userbuffers module (pretraining configs only;
# the *_lora ones are for LoRA fine-tuning shapes). The name also records the cp/mbs/seq_length it was tuned at.
UB_CONFIGS: dict[tuple[str, str, int, int], str] = {
    ("h100", "bf16", 8192, 4): "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192",
    ("h100", "fp8", 8192, 4): "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192",
    ("b200", "bf16", 8192, 2): "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192",
    ("b200", "fp8", 8192, 2): "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192",
    ("h100", "bf16", 16384, 8): "userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192",
    ("h100", "fp8", 16384, 8): "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192",
    ("b200", "bf16", 16384, 4): "userbuffers_bf16_b200_h16384_tp4_cp2_mbs1_seqlen8192",
    ("b200", "fp8", 16384, 4): "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192",
    ("h100", "bf16", 6144, 2): "userbuffers_bf16_h100_h6144_tp2_mbs2_seqlen2048",
    ("h100", "fp8", 6144, 2): "userbuffers_fp8_h100_h6144_tp2_mbs2_seqlen2048",
    ("b200", "bf16", 6144, 2): "userbuffers_bf16_b200_h6144_tp2_mbs1_seqlen4096",
    ("h100", "bf16", 12288, 4): "userbuffers_bf16_h100_h12288_tp4_mbs1_seqlen2048",
    ("h100", "fp8", 12288, 4): "userbuffers_fp8_h100_h12288_tp4_mbs1_seqlen2048",
    ("b200", "bf16", 12288, 4): "userbuffers_bf16_b200_h12288_tp4_mbs1_seqlen2048",
    ("b200", "fp8", 12288, 4): "userbuffers_fp8_b200_h12288_tp4_mbs1_seqlen2048",
    ("b200", "bf16", 18432, 8): "userbuffers_bf16_b200_h18432_tp8_mbs1_seqlen4096",
    ("b200", "fp8", 18432, 8): "userbuffers_fp8_b200_h18432_tp8_mbs1_seqlen4096",
}

# (family, precision, hidden_size, tp) -> config, beyond UB_CONFIGS' own keys: where NeMo's scripts load a config
# at a TP size it was not tuned at. Llama 3.1 405B FP8 on GB200 at TP 2 (FSDP; model_configs_gb200.csv) with
# pretrain_llama31_405b.py's B200 fp8 config; Nemotron-4 340B BF16 on GB200 at TP 4 (model_configs_gb200.csv)
# with pretrain_nemotron4_340b.py's B200 bf16 config.
USED_AT: dict[tuple[str, str, int, int], str] = {
    ("b200", "fp8", 16384, 2): "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192",
    ("b200", "bf16", 18432, 4): "userbuffers_bf16_b200_h18432_tp8_mbs1_seqlen4096",
}


def lookup(family: str | None, precision: str, hidden_size: int, tp: int) -> str | None:
    """The tuned userbuffer config for a GPU family (``dse.facts.hardware``'s ``userbuffer_family``: NVIDIA uses the
    B200 configs on GB200/GB300 and the H100 ones on H200), precision, width and TP size; None where NeMo has none."""
    if not family:
        return None
    key = (family, precision, hidden_size, tp)
    return UB_CONFIGS.get(key) or USED_AT.get(key)
