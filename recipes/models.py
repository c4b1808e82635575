"""The recipes dse knows: architectures (from the published model cards) and NVIDIA's default layouts.

Plain frozen dataclasses, no third-party imports, so that the training container can import this module
as well as the controller. Architectures as listed in ``shared/reference/README.md``; default layouts are
the ones of NeMo's / Megatron-Bridge's performance recipes for that GPU generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

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


LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


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

    def default_layout(self, gpu: str, precision: str) -> Layout:
        for key in (f"{gpu}/{precision}", f"{gpu}/bf16", f"h100/{precision}", "h100/bf16"):
            if key in self.defaults:
                return self.defaults[key]
        return Layout()

    def default_values(self, gpu: str, precision: str) -> dict[str, Any]:
        """The knob values this recipe chooses on ``gpu`` in ``precision``: its layout and its sequence length
        (the knobs the controller's catalogue marks ``recipe_layout``)."""
        layout = self.default_layout(gpu, precision)
        # the fields one by one: dataclasses.asdict deep-copies each (scalars all), which cost more than the rest of
        # resolving a point (dse.trial.resolve, once per point a space walk checks)
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
                # LLAMA3_*/LLAMA31_*_PRETRAIN_CONFIG_B300_{BF16,FP8_CS}_V1), here and in the two recipes below
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
                "b200/fp8": Layout(4, 8, 2, 8, 1, 64),
                "gb200/fp8": Layout(4, 16, 1, 4, 1, 1536),
                "b300/bf16": Layout(2, 8, 1, 8, 1, 64),
                "b300/fp8": Layout(2, 8, 1, 8, 1, 64),
                "b200/nvfp4": Layout(4, 16, 1, 8, 1, 768),
                "gb200/nvfp4": Layout(4, 16, 1, 8, 1, 1536),
                "b300/nvfp4": Layout(4, 8, 1, 4, 1, 768),
                "gb300/nvfp4": Layout(4, 8, 1, 4, 1, 1536),
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
    ]
    out = {r.name: r for r in full}
    # 2-node reproducers: same width (so per-layer GEMM shapes and TP collectives are the real ones),
    # fewer layers, so that 16 GPUs hold the model. Layer counts keep pp in {1,2,4} with vp in {1,2}.
    for base, layers in (("llama3_70b", 16), ("llama3_405b", 8), ("nemotron4_340b", 8)):
        r = out[base]
        arch = r.arch.scaled(layers)
        # offloading keeps its share of the layers (70B on GB200: 40 of 80 -> 8 of 16)
        defaults = {
            k: replace(lay, cpu_offload_layers=lay.cpu_offload_layers * layers // r.arch.num_layers)
            for k, lay in r.defaults.items()
        }
        out[arch.name] = replace(r, name=arch.name, arch=arch, num_gpus_default=16, scaled_from=base, defaults=defaults)
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
    return out


RECIPES: dict[str, Recipe] = _recipes()
