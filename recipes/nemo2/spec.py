"""Plain data shared by the NeMo 2 payload and the controller: names, environment variables, model table.

No third-party imports: the controller reads this (through :mod:`dse.facts.knobs`) to spell a trial's command line,
and the in-container factories in :mod:`recipes.nemo2.factories` read it to build the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import contract

ENV_TASK = contract.ENV_NEMO_TASK  # "pretrain" (default) or "finetune"
ENV_RECIPE = (
    contract.ENV_NEMO_RECIPE
)  # a model name (llama3_8b) or factory name (llama3_8b_recipe); used when argv has no --factory
ENV_FLOPS = contract.ENV_FLOPS_CALLBACK  # "1": add FLOPsMeasurementCallback (containers 25.04 and later have it)
TASKS = ("pretrain", "finetune")
FACTORY_SUFFIX = "_recipe"


@dataclass(frozen=True)
class NemoModel:
    """How one dse model maps onto NeMo 2: its recipe module, FLOPs-formula name and tokenizer vocabulary."""

    name: str
    module: str  # module under nemo.collections.llm.recipes
    flops_name: str  # key of FLOPsMeasurementCallback's formula table
    vocab_size: int  # NullTokenizer vocabulary (the model's real vocabulary, so the embedding has its real size)
    # Megatron-Core's experimental features on (MegatronEnableExperimentalCallback), as NVIDIA's DeepSeek-V3 script
    # does for its fused MLA rope
    moe_experimental: bool = False

    @property
    def factory(self) -> str:
        return self.name + FACTORY_SUFFIX


MODELS: dict[str, NemoModel] = {
    m.name: m
    for m in (
        NemoModel("llama3_8b", "llama3_8b", "llama3", 128256),
        NemoModel("llama3_70b", "llama3_70b", "llama3", 128256),
        # NeMo ships the 405B recipe as Llama 3.1 (llama31_405b); the architecture is the one dse calls llama3_405b.
        NemoModel("llama3_405b", "llama31_405b", "llama3", 128256),
        NemoModel("nemotron3_8b", "nemotron3_8b", "nemotron3", 256000),
        NemoModel("nemotron4_15b", "nemotron4_15b", "nemotron4", 256000),
        NemoModel("nemotron4_340b", "nemotron4_340b", "nemotron4", 256000),
        # Mixture-of-experts models: the modules and tokenizer vocabularies of NVIDIA's NeMo 2 performance scripts
        # (scripts/performance/llm/pretrain_{mixtral_8x7b,mixtral_8x22b,deepseek_v3,qwen3_30b_a3b,qwen3_235b_a22b}.py;
        # Mixtral 8x22B is pretrained from its 64K-context module) and the formula names of NeMo's
        # FLOPsMeasurementCallback (nemo/lightning/pytorch/callbacks/flops_callback.py).
        NemoModel("mixtral_8x7b", "mixtral_8x7b", "mixtral", 32000),
        # the model card's vocabulary, as recipes.models has it (NVIDIA's script gives its NullTokenizer 32000)
        NemoModel("mixtral_8x22b", "mixtral_8x22b_64k", "mixtral", 32768),
        NemoModel("deepseek_v3", "deepseek_v3", "deepseekv3", 129280, moe_experimental=True),
        NemoModel("qwen3_30b_a3b", "qwen3_30b_a3b", "qwen3", 151936),
        NemoModel("qwen3_235b_a22b", "qwen3_235b_a22b", "qwen3", 151936),
        # NeMo 2 ships GPT-OSS 120B for fine-tuning only (its module has no pretrain_recipe): the factory says so
        NemoModel("gpt_oss_120b", "gpt_oss_120b", "gpt_oss", 201088),
    )
}


def model_for_factory(factory: str) -> NemoModel:
    """The model of a factory name (``llama3_8b_recipe``) or bare model name; KeyError when unknown."""
    name = factory.split("(", 1)[0].strip()
    if name.endswith(FACTORY_SUFFIX):
        name = name[: -len(FACTORY_SUFFIX)]
    return MODELS[name]
