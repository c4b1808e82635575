"""The recipes dse knows: architectures (from the published model cards) and NVIDIA's default layouts.

Plain frozen dataclasses, no third-party imports, so that the training container can import this module
as well as the controller. Architectures as listed in ``shared/reference/README.md``; default layouts are
the ones of NeMo's / Megatron-Bridge's performance recipes for that GPU generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

# The ModelArch fields of the experts, with kv_channels (the attention head width a MoE recipe sets apart from
# hidden / heads): a model file gives them and recipes.mcore's run config carries them under these names.
MOE_FIELDS = (
    "kv_channels",
    "num_experts",
    "moe_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_size",
    "moe_first_dense_layers",
    "moe_router_score",
    "moe_load_balancing",
    "moe_capacity_factor",
)
# the ModelArch fields of multi-latent attention (DeepSeek-V3)
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class ModelArch:
    """A dense (or MoE) GPT-style decoder; enough to count FLOPs, parameters and activations."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    gated_mlp: bool
    num_experts: int = 0  # 0 = dense
    max_position_embeddings: int = 8192
    # the MLP's activation as NVIDIA's model providers define it: "fused" is the stack's fused kernel (SwiGLU
    # when gated, GeLU otherwise); "squared_relu" is the Nemotron providers' eager ``torch.pow(relu(x), 2)``
    # (NeMo 2 ``NemotronConfig``, Megatron-Bridge ``NemotronModelProvider``: a plain Python function, not
    # Megatron-Core's jit-fused ``squared_relu``), priced by dse.perfmodel.model.SQUARED_RELU_EXTRA_BYTES
    activation: str = "fused"
    # the hidden and attention dropout probability the model trains with (Megatron's --hidden-dropout and
    # --attention-dropout, TransformerConfig.hidden_dropout / attention_dropout): NVIDIA's Llama and Nemotron
    # providers and NeMo 2's GPT-3 175B set 0; Megatron-LM's own default, which its 2021 GPT runs kept, is 0.1.
    # Priced by dse.perfmodel.model (HIDDEN_DROPOUT_BYTES, unfused attention's score bytes) and the activation count
    dropout: float = 0.0
    # the attention head size where it is not hidden / heads (Megatron's kv_channels): Qwen3 (128 with 32 or 64
    # heads of a 2048 / 4096 hidden), GPT-OSS (64 with 64 heads of a 2880 hidden); None: hidden / heads
    kv_channels: int | None = None
    # --- mixture of experts (Megatron-Core TransformerConfig's moe_* fields) ---
    moe_topk: int = 2  # experts each token is routed to (moe_router_topk); read only when num_experts > 0
    moe_ffn_hidden_size: int = 0  # one routed expert's FFN size (moe_ffn_hidden_size); 0 = ffn_hidden_size
    moe_shared_expert_size: int = 0  # total FFN size of the shared experts (moe_shared_expert_intermediate_size)
    moe_first_dense_layers: int = 0  # DeepSeek's first k dense layers (moe_layer_freq = [0]*k + [1]*(L-k))
    moe_router_score: str = "softmax"  # "softmax" | "sigmoid" (moe_router_score_function)
    moe_load_balancing: str = "aux_loss"  # "aux_loss" | "seq_aux_loss" | "none" (moe_router_load_balancing_type)
    moe_capacity_factor: float | None = None  # moe_expert_capacity_factor; None = dropless
    # --- DeepSeek's multi-latent attention (MLATransformerConfig); kv_lora_rank 0 = no MLA ---
    q_lora_rank: int | None = None  # None = no query compression
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0  # multi-token prediction depth (mtp_num_layers); 0 = none
    # sliding-window attention (Megatron's window_size = (sliding_window, 0); 0 = full attention everywhere) and
    # window_attn_skip_freq: every full_attention_every-th layer attends fully (0 = none does)
    sliding_window: int = 0
    full_attention_every: int = 0

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def expert_ffn(self) -> int:
        """One routed expert's FFN size."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def moe_layers(self) -> int:
        """The layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.num_layers - self.moe_first_dense_layers if self.is_moe else 0

    def scaled(self, num_layers: int, suffix: str | None = None) -> ModelArch:
        """The same width with fewer layers: the 2-node reproducer of a large model."""
        return replace(self, name=f"{self.name}_{suffix or f'{num_layers}l'}", num_layers=num_layers)


@dataclass(frozen=True)
class Layout:
    """A default parallel layout for one GPU generation and precision."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1
    mbs: int = 1
    gbs: int = 128
    fsdp: bool = False
    recompute: str = "none"
    cpu_offload_layers: int = 0  # layers whose activations go to host memory (Megatron-Core cpu_offloading)
    # Megatron-Core's recompute_modules, comma-joined in its order (read with recompute = "selective")
    recompute_modules: str = "core_attn"
    ep: int = 1  # expert-parallel size
    etp: int = 1  # expert tensor-parallel size
    moe_dispatcher: str = "alltoall"  # "alltoall" | "allgather" | "flex" (DeepEP / HybridEP)
    moe_grouped_gemm: bool = True
    moe_a2a_overlap: bool = False  # overlap the expert all-to-all with the other micro-batch's compute
    moe_permute_fusion: bool = False
    # decoder layers of the first / last pipeline stage (Megatron's num_layers_in_first/last_pipeline_stage);
    # 0 = an even split
    pp_first_layers: int = 0
    pp_last_layers: int = 0
    # The world size of the NVIDIA preset the layout comes from (Megatron-Bridge's WorkloadBaseConfig.num_gpus in
    # scripts/performance/configs/*/*_workload_base_configs.py; the GPU count of NeMo's recommended_model_configs
    # row); 0: the recipe's num_gpus_default. A layout's gbs is its preset's at that world size: ``dse predict``
    # runs it there unless told otherwise. Not a knob, and not part of what the layout is (compare=False).
    num_gpus: int = field(default=0, compare=False)


def fit_layout(layout: Layout, layers: int, world: int) -> Layout:
    """A full model's preset fitted to a reproducer's ``layers`` and ``world`` GPUs. What a reproducer keeps is
    each layer's work per GPU (its GEMM shapes, TP and CP collectives), so tp and cp are kept first: the largest tp
    up to the preset's that divides the world, the largest cp up to the preset's that divides the GPUs left; then
    the largest pp up to the preset's that divides both the layers and the GPUs left after that, and the largest vp
    up to the preset's that divides each stage's layers (1 without a pipeline). A layout that already fits is
    returned as it is."""
    tp = max(d for d in range(1, min(layout.tp, world) + 1) if world % d == 0)
    left = world // tp
    cp = max(d for d in range(1, min(layout.cp, left) + 1) if left % d == 0)
    left //= cp
    pp = max(d for d in range(1, min(layout.pp, left) + 1) if layers % d == 0 and left % d == 0)
    vp = max(d for d in range(1, layout.vp + 1) if (layers // pp) % d == 0) if pp > 1 else 1
    return replace(layout, tp=tp, pp=pp, cp=cp, vp=vp)


# the fields that are knobs (num_gpus is where the layout runs, not a knob)
LAYOUT_FIELDS = tuple(f.name for f in fields(Layout) if f.name != "num_gpus")


@dataclass(frozen=True)
class Recipe:
    """One trainable recipe: architecture, NeMo 2 / Megatron-Bridge recipe names, defaults."""

    name: str
    arch: ModelArch
    nemo2_recipe: str  # module under nemo.collections.llm.recipes
    mbridge_recipe: str | None  # function under megatron.bridge.recipes, None where Bridge has none
    seq_length: int
    num_gpus_default: int
    defaults: dict[str, Layout] = field(default_factory=dict)  # key "gpu/precision", e.g. "h100/fp8"
    scaled_from: str | None = None

    def layout_key(self, gpu: str, precision: str) -> str | None:
        """The ``gpu/precision`` key of the layout :meth:`default_layout` takes: this GPU and precision's, else
        this GPU's BF16 one, else H100's in this precision, else H100's BF16 one; None where the recipe has none."""
        for key in (f"{gpu}/{precision}", f"{gpu}/bf16", f"h100/{precision}", "h100/bf16"):
            if key in self.defaults:
                return key
        return None

    def default_layout(self, gpu: str, precision: str) -> Layout:
        key = self.layout_key(gpu, precision)
        return self.defaults[key] if key is not None else Layout()

    def layout_source(self, gpu: str, precision: str, world: int | None = None) -> str:
        """Which layout :meth:`default_values` gives, in words: NVIDIA's published preset for this GPU and precision
        (the full recipes' table holds NVIDIA's presets), or the recipe's own layout, and why."""
        key = self.layout_key(gpu, precision)
        if self.scaled_from is not None and key is not None:
            layout = self.defaults[key]
            fitted = world is not None and fit_layout(layout, self.arch.num_layers, world) != layout
            how = f" fitted to {world} GPUs and {self.arch.num_layers} layers" if fitted else ""
            return f"the recipe's layout ({self.name}'s {key} entry{how}; a reproducer of {self.scaled_from})"
        if key is None:
            return f"the recipe's layout (dse ships no NVIDIA preset of {self.name})"
        if key == f"{gpu}/{precision}":
            return f"NVIDIA's preset for {key}"
        return f"the recipe's layout (NVIDIA's {key} preset; dse ships none for {gpu}/{precision})"

    def default_world(self, gpu: str, precision: str) -> int:
        """The world size the default layout for ``gpu`` in ``precision`` is NVIDIA's preset for (its gbs is the
        preset's there); the recipe's ``num_gpus_default`` where the layout names none."""
        return self.default_layout(gpu, precision).num_gpus or self.num_gpus_default

    def default_values(self, gpu: str, precision: str, world: int | None = None) -> dict[str, Any]:
        """The knob values this recipe chooses on ``gpu`` in ``precision``: its layout and its sequence length
        (the knobs the controller's catalogue marks ``recipe_layout``). A reproducer's layout is its full model's
        preset, which needs more GPUs than the reproducer has: on ``world`` GPUs it is fitted to them
        (:func:`fit_layout`), so that its default layout runs."""
        layout = self.default_layout(gpu, precision)
        if world is not None and self.scaled_from is not None:
            layout = fit_layout(layout, self.arch.num_layers, world)
        # the fields one by one: dataclasses.asdict deep-copies each (scalars all), which cost more than the rest of
        # resolving a point (dse.rules.trial.resolve, once per point a space walk checks)
        return {**{name: getattr(layout, name) for name in LAYOUT_FIELDS}, "seq_length": self.seq_length}


LLAMA3_8B = ModelArch("llama3_8b", 32, 4096, 32, 8, 14336, 128256, True)
LLAMA3_70B = ModelArch("llama3_70b", 80, 8192, 64, 8, 28672, 128256, True)
LLAMA3_405B = ModelArch("llama3_405b", 126, 16384, 128, 8, 53248, 128256, True)
NEMOTRON3_8B = ModelArch(
    "nemotron3_8b", 32, 4096, 32, 32, 16384, 256000, False, max_position_embeddings=4096, activation="squared_relu"
)
NEMOTRON4_15B = ModelArch(
    "nemotron4_15b", 32, 6144, 48, 8, 24576, 256000, False, max_position_embeddings=4096, activation="squared_relu"
)
NEMOTRON4_340B = ModelArch(
    "nemotron4_340b", 96, 18432, 96, 8, 73728, 256000, False, max_position_embeddings=4096, activation="squared_relu"
)

# Mixture-of-experts architectures, as the Hugging Face configs that Megatron-Bridge's AutoBridge converts
# (mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1, deepseek-ai/DeepSeek-V3, Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B,
# openai/gpt-oss-120b) and NeMo 2's MixtralConfig8x7B / 8x22B, DeepSeekV3Config, Qwen3Config30B_A3B /
# 235B_A22B, GPTOSSConfig120B define them.
MIXTRAL_8X7B = ModelArch(
    "mixtral_8x7b", 32, 4096, 32, 8, 14336, 32000, True, num_experts=8, moe_topk=2, max_position_embeddings=32768
)
MIXTRAL_8X22B = ModelArch(
    "mixtral_8x22b", 56, 6144, 48, 8, 16384, 32768, True, num_experts=8, moe_topk=2, max_position_embeddings=65536
)
# 671B total, 37B active: 3 dense layers then 58 MoE layers of 256 routed experts (top-8, sigmoid scores, the
# sequence-wise auxiliary loss besides the bias-based balancing) and one shared expert; MLA; one MTP layer
DEEPSEEK_V3 = ModelArch(
    "deepseek_v3",
    61,
    7168,
    128,
    128,
    18432,
    129280,
    True,
    num_experts=256,
    max_position_embeddings=163840,
    moe_topk=8,
    moe_ffn_hidden_size=2048,
    moe_shared_expert_size=2048,
    moe_first_dense_layers=3,
    moe_router_score="sigmoid",
    moe_load_balancing="seq_aux_loss",
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    mtp_layers=1,
)
QWEN3_30B_A3B = ModelArch(
    "qwen3_30b_a3b",
    48,
    2048,
    32,
    4,
    6144,
    151936,
    True,
    num_experts=128,
    max_position_embeddings=40960,
    kv_channels=128,
    moe_topk=8,
    moe_ffn_hidden_size=768,
)
QWEN3_235B_A22B = ModelArch(
    "qwen3_235b_a22b",
    94,
    4096,
    64,
    4,
    12288,
    151936,
    True,
    num_experts=128,
    max_position_embeddings=40960,
    kv_channels=128,
    moe_topk=8,
    moe_ffn_hidden_size=1536,
)
# every other layer attends within a 128-token sliding window (Bridge's GPT-OSS provider: window_size (128, 0),
# window_attn_skip_freq 2)
GPT_OSS_120B = ModelArch(
    "gpt_oss_120b",
    36,
    2880,
    64,
    8,
    2880,
    201088,
    True,
    num_experts=128,
    max_position_embeddings=131072,
    kv_channels=64,
    moe_topk=4,
    moe_ffn_hidden_size=2880,
    sliding_window=128,
    full_attention_every=2,
)


# house: a data table (the recipes and their per-GPU layouts), not logic
def _moe_recipes() -> list[Recipe]:
    """The six MoE recipes with NVIDIA's default layouts per GPU.

    Sources: NeMo's ``scripts/performance/recommended_model_configs/model_configs_{h100,b200,gb200}.csv`` for
    Mixtral (NeMo 2 only: Megatron-Bridge ships no Mixtral recipe), Megatron-Bridge's
    ``scripts/performance/configs/{deepseek,qwen,gpt_oss}/*_workload_base_configs.py`` (``*_V1`` presets) for the
    others. "flex" is the presets' ``moe_flex_dispatcher_backend="hybridep"``; a preset without one runs the
    all-to-all dispatcher (``scripts/performance/utils/overrides.py``). Bridge's MoE recipes fuse the permutation
    (``moe_permute_fusion = True``) and use grouped GEMMs. DeepSeek-V3's ``pp_layout`` strings are given as the
    decoder layers of the first and last pipeline stage they produce (embedding, MTP and loss aside).
    """
    mix = dict(ep=8, moe_permute_fusion=True)
    dsv3 = dict(moe_dispatcher="flex", moe_permute_fusion=True)
    qwen = dict(moe_permute_fusion=True)
    # the presets' recompute modules (the same *_workload_base_configs.py): DeepSeek-V3 recomputes MLA's
    # up-projections (on H100 also the dense MLP, on GB300 in BF16 the experts' activation), GPT-OSS on GB200,
    # B200 and H100 the norms and the experts' activation
    mla = dict(recompute="selective", recompute_modules="mla_up_proj")
    oss = dict(recompute="selective", recompute_modules="moe_act,layernorm")
    return [
        Recipe(
            "mixtral_8x7b",
            MIXTRAL_8X7B,
            "mixtral_8x7b",
            None,
            4096,
            64,
            {
                "h100/bf16": Layout(1, 4, 1, 8, 1, 256, **mix),
                "b200/bf16": Layout(1, 1, 1, 1, 2, 256, **mix),
                "gb200/bf16": Layout(1, 1, 1, 1, 2, 256, **mix),
            },
        ),
        Recipe(
            "mixtral_8x22b",
            MIXTRAL_8X22B,
            "mixtral_8x22b",
            None,
            65536,
            256,
            {
                "h100/bf16": Layout(4, 4, 8, 14, 1, 256, **mix),
                "b200/bf16": Layout(2, 4, 8, 14, 1, 64, **mix),
            },
        ),
        Recipe(
            "deepseek_v3",
            DEEPSEEK_V3,
            "deepseek_v3",
            "deepseek_v3_pretrain_config",
            4096,
            256,
            {
                # pp_layout "Et|(tt|)*30mL": 7 decoder layers on the first stage, 6 (and the MTP layer) on the last;
                # DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1 runs on 1,024 GPUs (num_gpus=1024)
                "h100/bf16": Layout(
                    2,
                    8,
                    1,
                    4,
                    1,
                    8192,
                    num_gpus=1024,
                    ep=64,
                    pp_first_layers=7,
                    pp_last_layers=6,
                    **dsv3,
                    recompute="selective",
                    recompute_modules="mla_up_proj,mlp",
                ),
                # Bridge's layout for (pp 4, vp 4): 16 layers on the first stage, 13 on the last
                "gb200/bf16": Layout(1, 4, 1, 4, 1, 2048, ep=64, pp_first_layers=16, pp_last_layers=13, **dsv3, **mla),
                # "Et*4|(t*4|)*14tmL" over pp 2, vp 8: 32 and 29
                "gb300/bf16": Layout(
                    1,
                    4,
                    1,
                    4,
                    1,
                    2048,
                    ep=64,
                    pp_first_layers=16,
                    pp_last_layers=13,
                    **dsv3,
                    recompute="selective",
                    recompute_modules="moe_act",
                ),
                "gb300/fp8": Layout(1, 2, 1, 8, 2, 2048, ep=32, pp_first_layers=32, pp_last_layers=29, **dsv3, **mla),
                # (pp 16, vp 1): 4 layers on the first stage, 1 on the last
                "b200/bf16": Layout(1, 16, 1, 1, 1, 2048, ep=8, pp_first_layers=4, pp_last_layers=1, **dsv3, **mla),
                # (pp 8, vp 2): 8 and 5
                "b300/bf16": Layout(1, 8, 1, 2, 1, 2048, ep=8, pp_first_layers=8, pp_last_layers=5, **dsv3, **mla),
            },
        ),
        Recipe(
            "qwen3_30b_a3b",
            QWEN3_30B_A3B,
            "qwen3_30b_a3b",
            "qwen3_30b_a3b_pretrain_config",
            4096,
            8,
            {
                # NeMo's 8-GPU H100 row (Bridge's base preset: ep 8, gbs 512); Bridge's own H100 preset is 16 GPUs
                "h100/bf16": Layout(1, 1, 1, 1, 1, 512, ep=8, moe_dispatcher="flex", **qwen),
                "b200/bf16": Layout(1, 1, 1, 1, 4, 512, ep=8, moe_dispatcher="flex", **qwen),
                "gb200/bf16": Layout(1, 1, 1, 1, 4, 512, ep=8, moe_dispatcher="flex", **qwen),
                "b300/bf16": Layout(1, 1, 1, 1, 8, 512, ep=8, moe_dispatcher="flex", **qwen),
                "gb300/bf16": Layout(1, 1, 1, 1, 8, 512, ep=8, moe_dispatcher="flex", **qwen),
            },
        ),
        Recipe(
            "qwen3_235b_a22b",
            QWEN3_235B_A22B,
            "qwen3_235b_a22b",
            "qwen3_235b_a22b_pretrain_config",
            4096,
            64,
            {
                # QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_BF16_V1: 256 GPUs (num_gpus=256); the others 64
                "h100/bf16": Layout(2, 8, 1, 4, 1, 2048, ep=32, moe_a2a_overlap=True, num_gpus=256, **qwen),
                "b200/bf16": Layout(1, 8, 1, 4, 1, 1024, ep=8, **qwen),
                "b200/fp8": Layout(1, 8, 1, 1, 1, 1024, ep=8, **qwen),
                "gb200/bf16": Layout(1, 8, 1, 1, 1, 1024, ep=8, moe_dispatcher="flex", **qwen),
                "b300/bf16": Layout(1, 8, 1, 1, 1, 1024, ep=8, moe_dispatcher="flex", **qwen),
                "gb300/bf16": Layout(1, 1, 1, 1, 2, 1024, ep=64, moe_dispatcher="flex", **qwen),
            },
        ),
        Recipe(
            "gpt_oss_120b",
            GPT_OSS_120B,
            "gpt_oss_120b",
            "gpt_oss_120b_pretrain_config",
            4096,
            64,
            {
                "h100/bf16": Layout(1, 4, 1, 1, 1, 512, ep=8, **qwen, **oss),
                "b200/bf16": Layout(1, 1, 1, 1, 4, 512, ep=64, **qwen, **oss),
                "gb200/bf16": Layout(1, 1, 1, 1, 4, 512, ep=64, **qwen, **oss),
                "b300/bf16": Layout(1, 1, 1, 1, 4, 512, ep=64, **qwen),
                "gb300/bf16": Layout(1, 1, 1, 1, 4, 512, ep=64, **qwen),
            },
        ),
    ]


# house: a data table (the recipes and their per-GPU layouts), not logic
def _recipes() -> dict[str, Recipe]:
    full = [
        Recipe(
            "llama3_8b",
            LLAMA3_8B,
            "llama3_8b",
            "llama3_8b_pretrain_config",
            8192,
            8,
            {
                "h100/bf16": Layout(1, 1, 2, 1, 1, 128),
                "h100/fp8": Layout(1, 1, 2, 1, 1, 128),
                "b200/fp8": Layout(1, 1, 1, 1, 2, 128),
                "gb200/fp8": Layout(1, 1, 1, 1, 2, 128),
                # B300 rows: Megatron-Bridge's performance presets (scripts/performance/configs/llama,
                # LLAMA3_*/LLAMA31_*_PRETRAIN_CONFIG_B300_{BF16,FP8_CS}_V1), here and in the 70B recipe below; the
                # 405B recipe takes the layouts NVIDIA's later presets and recipes run (see there)
                "b300/bf16": Layout(1, 1, 1, 1, 4, 128),
                "b300/fp8": Layout(1, 1, 1, 1, 4, 128),
                # NVFP4 rows: the NVFP4 presets of Megatron-Bridge's performance recipes (megatron/bridge/
                # perf_recipes/llama/{b200,gb200,b300,gb300}/llama3.py and llama31.py: *_nvfp4_config; the 70B and
                # 405B layouts also scripts/performance/configs/llama/*_workload_base_configs.py at v0.4.0,
                # *_NVFP4_V2), here and in the two recipes below
                **{f"{g}/nvfp4": Layout(1, 1, 1, 1, 4, 128) for g in ("b200", "gb200", "b300", "gb300")},
            },
        ),
        Recipe(
            "llama3_70b",
            LLAMA3_70B,
            "llama3_70b",
            "llama3_70b_pretrain_config",
            8192,
            64,
            {
                "h100/bf16": Layout(4, 4, 2, 5, 1, 128),
                "h100/fp8": Layout(4, 8, 1, 5, 1, 128),
                "b200/fp8": Layout(2, 4, 2, 5, 1, 128),
                "gb200/fp8": Layout(1, 1, 1, 1, 2, 256, fsdp=True, cpu_offload_layers=40),
                "b300/bf16": Layout(1, 1, 1, 1, 1, 128, fsdp=True),
                "b300/fp8": Layout(1, 1, 1, 1, 1, 128, fsdp=True),
                "b200/nvfp4": Layout(2, 4, 1, 5, 1, 256),
                "gb200/nvfp4": Layout(2, 4, 1, 5, 1, 256),
                "b300/nvfp4": Layout(1, 4, 1, 5, 1, 256),
                "gb300/nvfp4": Layout(1, 4, 1, 5, 1, 256),
            },
        ),
        Recipe(
            "llama3_405b",
            LLAMA3_405B,
            "llama31_405b",
            "llama3_405b_pretrain_config",
            8192,
            1024,
            {
                "h100/bf16": Layout(8, 8, 2, 8, 1, 512),
                "h100/fp8": Layout(8, 8, 2, 8, 1, 512),
                # the world sizes (num_gpus) of the presets: LLAMA31_405B_PRETRAIN_CONFIG_{H100,B200}_*_V1 in
                # Megatron-Bridge's scripts/performance/configs/llama/llama31_workload_base_configs.py (1,024 and
                # 128 GPUs); GB200 and GB300 at GBS 1536 on 256 GPUs, as the published rows of that layout
                # (bench/data/published_perf_*.tsv)
                "b200/fp8": Layout(4, 8, 2, 8, 1, 64, num_gpus=128),
                "gb200/fp8": Layout(4, 16, 1, 4, 1, 1536, num_gpus=256),
                # B300: Megatron-Bridge's 128-GPU B300 recipes (megatron/bridge/perf_recipes/llama/b300/llama31.py:
                # llama31_405b_pretrain_128gpu_b300_{bf16,fp8cs}_config, GBS 768, as the nvfp4 one below; the
                # layouts of the V2 presets, LLAMA31_405B_PRETRAIN_CONFIG_B300_*_V2 in scripts/performance/configs/
                # llama/llama31_workload_base_configs.py at v0.5.0, on 256 GPUs with GBS 1536), not the V1 presets
                # (TP 2, PP 8, VP 8, GBS 64 on 128 GPUs): V1 gives 8 micro-batches for 8 stages, so Megatron-Core's
                # interleaved schedule runs every micro-batch's forward before the first backward
                # (get_pp_rank_microbatches: warm-up 2(p-1) + (v-1)p = 70 >= m·v = 64,
                # are_all_microbatches_in_warmup) and the first stage holds all 8 micro-batches of its 15 layers:
                # ~208 GiB of activations (FP8) beside ~105 GiB of model states, more than B300's 279 GiB; NVIDIA
                # publishes no B300 Llama row of it
                "b300/bf16": Layout(2, 1, 1, 1, 1, 768, fsdp=True, cpu_offload_layers=40, num_gpus=128),
                "b300/fp8": Layout(4, 8, 1, 4, 1, 768, num_gpus=128),
                "b200/nvfp4": Layout(4, 16, 1, 8, 1, 768),
                "gb200/nvfp4": Layout(4, 16, 1, 8, 1, 1536, num_gpus=256),
                "b300/nvfp4": Layout(4, 8, 1, 4, 1, 768, num_gpus=128),
                "gb300/nvfp4": Layout(4, 8, 1, 4, 1, 1536, num_gpus=256),
            },
        ),
        Recipe(
            "nemotron3_8b",
            NEMOTRON3_8B,
            "nemotron3_8b",
            None,
            4096,
            8,
            {"h100/bf16": Layout(2, 1, 1, 1, 1, 32), "h100/fp8": Layout(2, 1, 1, 1, 1, 32)},
        ),
        Recipe(
            "nemotron4_15b",
            NEMOTRON4_15B,
            "nemotron4_15b",
            None,
            4096,
            64,
            {"h100/bf16": Layout(4, 1, 1, 1, 1, 256), "b200/fp8": Layout(1, 1, 1, 1, 2, 256)},
        ),
        Recipe(
            "nemotron4_340b",
            NEMOTRON4_340B,
            "nemotron4_340b",
            None,
            4096,
            128,
            {"h100/bf16": Layout(8, 8, 1, 12, 1, 32), "h100/fp8": Layout(8, 8, 1, 12, 1, 32)},
        ),
        *_moe_recipes(),
    ]
    out = {r.name: r for r in full}
    # 2-node reproducers: same width (so per-layer GEMM shapes and TP collectives are the real ones),
    # fewer layers, so that 16 GPUs hold the model. Layer counts keep pp in {1,2,4} with vp in {1,2}.
    for base, layers in (("llama3_70b", 16), ("llama3_405b", 8), ("nemotron4_340b", 8)):
        r = out[base]
        arch = r.arch.scaled(layers)
        # offloading keeps its share of the layers (70B on GB200: 40 of 80 -> 8 of 16)
        defaults = {
            # and runs on the reproducer's 16 GPUs, not its preset's world (num_gpus 0: the recipe's)
            k: replace(lay, cpu_offload_layers=lay.cpu_offload_layers * layers // r.arch.num_layers, num_gpus=0)
            for k, lay in r.defaults.items()
        }
        out[arch.name] = replace(r, name=arch.name, arch=arch, num_gpus_default=16, scaled_from=base, defaults=defaults)
    # 2-node MoE reproducer: DeepSeek-V3's width (MLA, 7168 hidden, 2048-wide experts, top-8 routing, one shared
    # expert, MTP) with 8 of its 61 layers (the first dense, as its first 3 of 61 are) and 64 of its 256 experts,
    # so that 16 H100 hold it: ~25 B parameters. At ep 16 each GPU holds 4 experts of a layer, as DeepSeek-V3's
    # ep 64 does of its 256; expert tensor parallelism stays 1, as NVIDIA's presets have it.
    r = out["deepseek_v3"]
    arch = replace(r.arch.scaled(8, "2node"), num_experts=64, moe_first_dense_layers=1)
    out[arch.name] = replace(
        r,
        name=arch.name,
        arch=arch,
        num_gpus_default=16,
        scaled_from="deepseek_v3",
        defaults={"h100/bf16": Layout(2, 2, 1, 1, 1, 128, ep=8, moe_dispatcher="flex", moe_permute_fusion=True)},
    )
    # Probe slice: DeepSeek-V3 itself (MLA, 256 routed experts top-8 with sigmoid scores and a shared expert, its
    # first 3 layers dense) cut to 8 of its 61 layers and without its MTP layer (the mcore payload builds none), so
    # that one rank of a 64-GPU layout with expert parallelism fits one H100 (``dse probe``; bench/probe_compare.py).
    arch = replace(r.arch.scaled(8), mtp_layers=0)
    out[arch.name] = replace(
        r,
        name=arch.name,
        arch=arch,
        num_gpus_default=64,
        scaled_from="deepseek_v3",
        defaults={"h100/bf16": Layout(1, 4, 1, 1, 1, 64, ep=16, moe_grouped_gemm=False)},
    )
    # 1-GPU reproducer: Llama 3 8B's width (its GEMM shapes) with 4 of its 32 layers, so that one GPU holds
    # weights, gradients and Adam state (~1.9 B parameters) without model parallelism.
    r = out["llama3_8b"]
    arch = r.arch.scaled(4)
    # Its default layout is no parallelism at all (the 8-GPU recipe's cp=2 does not fit one GPU).
    out[arch.name] = replace(
        r, name=arch.name, arch=arch, num_gpus_default=1, scaled_from="llama3_8b", defaults={"h100/bf16": Layout(gbs=8)}
    )
    # 1-GPU memory-border reproducer: Llama 3 70B's width (8192 hidden, 28672 FFN, GQA 64/8) with 4 of its 80
    # layers, ~5.5 B parameters: weights, fp32 gradients and Adam state alone take ~92 GiB of one H200's
    # 141 GiB, so the micro-batch and recompute choices decide whether it fits (issue 16's "wider model").
    r = out["llama3_70b"]
    arch = r.arch.scaled(4)
    out[arch.name] = replace(
        r,
        name=arch.name,
        arch=arch,
        num_gpus_default=1,
        scaled_from="llama3_70b",
        defaults={"h100/bf16": Layout(gbs=4)},
    )
    # 2-GPU memory-border reproducer: the same width with 12 of its 80 layers, ~12 B parameters: on two GPUs
    # without model parallelism the weights, fp32 gradients and half the optimizer state (dp 2) take most of an
    # H200's 141 GiB before activations and the ~12 GiB the mcore payload holds outside PyTorch's allocator, so tp,
    # pp, cp, the micro-batch and recompute decide whether it fits (the model puts no layout of 16 layers within
    # two H200s).
    arch = r.arch.scaled(12)
    out[arch.name] = replace(
        r,
        name=arch.name,
        arch=arch,
        num_gpus_default=2,
        scaled_from="llama3_70b",
        defaults={"h100/bf16": Layout(gbs=16)},
    )
    return out


RECIPES: dict[str, Recipe] = _recipes()
