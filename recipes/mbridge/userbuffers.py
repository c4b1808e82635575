"""Which tensor-parallel communication-overlap (userbuffer) configs Megatron-Bridge ships, and at which layouts
NVIDIA's Bridge performance scripts load each one, as plain data.

Bridge carries its own copies of NeMo's tuned ``TransformerLayerTPOverlapCfg`` objects
(``src/megatron/bridge/training/comm_overlap.py``: the same nineteen names as NeMo's ``tp_overlap_configs``), and
its performance scripts pick one by model, GPU and precision alone, whatever the layout's TP size: Bridge 0.2-0.5
(containers 25.11-26.06; 0.2 keeps them under ``configs/llama3/`` and ``configs/llama31/``),
``scripts/performance/configs/llama/llama3_llm_pretrain.py`` and
``llama31_llm_pretrain.py`` (``comm_overlap_cfg = userbuffers_<bf16|fp8>_<b200|h100>_h<hidden>_...``, the B200 ones on
B200, B300, GB200 and GB300), with the layouts of ``llama3_workload_base_configs.py`` and
``llama31_workload_base_configs.py``, and the later ``src/megatron/bridge/perf_recipes/llama/<gpu>/llama3*.py``.
So Llama 3.1 405B runs at TP 2 on GB300 with ``userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192``, a config
tuned at TP 4. NVFP4 layouts set the FP8 config but turn ``tp_comm_overlap`` off; they are not listed.

The table lists every (family, precision, hidden size, TP) at which those scripts run TP overlap with a named
config: the controller allows ``tp_comm_overlap`` on the mbridge payload there and nowhere else (a TP size NVIDIA
never ran with the config is refused rather than guessed), and the payload loads the config by name
(``--tp-comm-overlap-cfg``). The configs and the TP sizes they are used at are the same in Bridge 0.2 to 0.5, so
the table has no container key. ``precision`` is "bf16" or "fp8" (every FP8 recipe loads the fp8 config).
"""

from __future__ import annotations

_405B_BF16 = "userbuffers_bf16_b200_h16384_tp4_cp2_mbs1_seqlen8192"
_405B_FP8 = "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192"

# (family, precision, hidden_size, tp) -> attribute name in megatron.bridge.training.comm_overlap
UB_CONFIGS: dict[tuple[str, str, int, int], str] = {
    # Llama 3 70B: H100 at TP 4 (bf16 and fp8_cs); B200 (bf16, fp8_mx), GB200 (fp8_mx) at TP 2
    ("h100", "bf16", 8192, 4): "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192",
    ("h100", "fp8", 8192, 4): "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192",
    ("b200", "bf16", 8192, 2): "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192",
    ("b200", "fp8", 8192, 2): "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192",
    # Llama 3.1 405B: H100 at TP 8 (cp 2); B200 and GB200 at TP 4 (bf16, fp8); GB200 fp8_cs V1 at TP 2 (FSDP);
    # B300 at TP 2 (bf16, fp8_cs, fp8_mx); GB300 at TP 2 (bf16 and fp8_cs V1, FSDP and offload; fp8_mx V2) and at
    # TP 4 (fp8_mx V1, fp8_cs V2)
    ("h100", "bf16", 16384, 8): "userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192",
    ("h100", "fp8", 16384, 8): "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192",
    ("b200", "bf16", 16384, 2): _405B_BF16,
    ("b200", "bf16", 16384, 4): _405B_BF16,
    ("b200", "fp8", 16384, 2): _405B_FP8,
    ("b200", "fp8", 16384, 4): _405B_FP8,
    # GPT-3 175B: Bridge's own H100 recipe (src/megatron/bridge/recipes/gpt/h100/gpt3_175b.py) at TP 4
    ("h100", "bf16", 12288, 4): "userbuffers_bf16_h100_h12288_tp4_mbs1_seqlen2048",
}


def lookup(family: str | None, precision: str, hidden_size: int, tp: int) -> str | None:
    """The config Bridge's performance scripts load for a GPU family (``dse.facts.hardware``'s ``userbuffer_family``),
    precision ("bf16" or "fp8"), width and TP size; None where they run no TP overlap with a named config."""
    return UB_CONFIGS.get((family, precision, hidden_size, tp)) if family else None
