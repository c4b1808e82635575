"""Building a :class:`dse.rules.trial.TrialConfig` from plain values (``dse predict``, the accuracy bench),
and reading ``--model-file`` architectures.

The system is the GPU generation's default cluster (GPUs per node, NVLink domain and NIC bandwidth from
:data:`dse.facts.hardware.HARDWARE`); every knob not given takes its catalogue default.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dse.errors import UserError
from dse.facts import knobs
from dse.facts.hardware import HARDWARE
from dse.recipes.models import MLA_FIELDS, MOE_FIELDS, ModelArch
from dse.rules.space import System, _first_error, _read_toml
from dse.rules.trial import TrialConfig, resolve_auto

_SYSTEMS: dict[tuple[str, str | None], System] = {}


def default_system(gpu: str, container: str | None = None) -> System:
    """The GPU's default system, in ``container`` (a ``YY.MM`` tag; None: System's default) (cached: System is
    immutable)."""
    key = (gpu, container)
    if key not in _SYSTEMS:
        hw = HARDWARE[gpu]
        system = System(
            name=gpu,
            gpu=gpu,
            gpus_per_node=hw.gpus_per_node,
            nvlink_domain=hw.nvlink_domain,
            scaleout_gbps=hw.scaleout_gbps,
        )
        _SYSTEMS[key] = system if container is None else system.model_copy(update={"container": container})
    return _SYSTEMS[key]


def make_trial(
    recipe,
    gpu: str,
    num_gpus: int,
    *,
    system: System | None = None,
    payload: str = "nemo2",
    container: str | None = None,
    **values: Any,
) -> TrialConfig:
    """A trial of ``recipe`` on ``num_gpus`` GPUs of ``gpu`` with the given knob values, for ``payload`` (a payload
    name, or a published stack's: dse.perfmodel.stack.PUBLISHED_STACKS), in ``container`` (a tag; None: the
    system's).

    ``num_gpus`` must be a multiple of the system's GPUs per node (a :class:`UserError` otherwise).
    """
    system = system or default_system(gpu)
    if container is not None and container != system.container:
        system = system.model_copy(update={"container": container})
    if num_gpus % system.gpus_per_node:
        raise UserError(
            f"{num_gpus} is not a multiple of the {system.gpus_per_node} GPUs per node of {gpu}", field="num_gpus"
        )
    out = {name: k.default for name, k in knobs.CATALOGUE.items()}
    out["seq_length"] = recipe.seq_length
    out.update(values)
    out["num_nodes"] = num_gpus // system.gpus_per_node
    resolve_auto(out, recipe, system, payload)
    return TrialConfig(
        recipe=recipe, system=system, values=MappingProxyType(out), env=MappingProxyType({}), varied=(), payload=payload
    )


class _ModelFile(BaseModel):
    """A ``--model-file``: an architecture outside the registry (e.g. a GPT-3 style model)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # bounds far beyond any published model (hidden 16,384 and 126 layers for Llama 3 405B), low enough that no
    # value overflows a float in the model's arithmetic
    name: str = Field(min_length=1, max_length=128)
    num_layers: int = Field(ge=1, le=knobs.LAYERS_MAX)
    hidden_size: int = Field(ge=1, le=2**20)
    num_attention_heads: int = Field(ge=1, le=2**16)
    num_query_groups: int | None = Field(None, ge=1, le=2**16, description="default: num_attention_heads (no GQA)")
    ffn_hidden_size: int = Field(ge=1, le=2**22)
    vocab_size: int = Field(ge=1, le=2**24)
    gated_mlp: bool
    activation: Literal["fused", "squared_relu"] = Field(
        "fused", description="fused: the stack's fused SwiGLU/GeLU kernel; squared_relu: Nemotron's eager one"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="hidden and attention dropout probability (0: none)")
    kv_channels: int | None = Field(None, ge=1, le=2**16, description="head size; default hidden / heads")
    # mixture of experts (recipes.models.ModelArch's fields; num_experts 0 = dense)
    num_experts: int = Field(0, ge=0, le=2**16)
    moe_topk: int = Field(2, ge=1, le=2**10)
    moe_ffn_hidden_size: int = Field(0, ge=0, le=2**22, description="one expert's FFN size; 0 = ffn_hidden_size")
    moe_shared_expert_size: int = Field(0, ge=0, le=2**22, description="the shared experts' total FFN size")
    moe_first_dense_layers: int = Field(0, ge=0, le=knobs.LAYERS_MAX)
    moe_router_score: Literal["softmax", "sigmoid"] = "softmax"
    moe_load_balancing: Literal["aux_loss", "seq_aux_loss", "none"] = "aux_loss"
    moe_capacity_factor: float | None = Field(None, gt=0.0, le=1024.0, description="absent: dropless")
    # multi-latent attention (kv_lora_rank 0 = none) and multi-token prediction
    q_lora_rank: int | None = Field(None, ge=1, le=2**20)
    kv_lora_rank: int = Field(0, ge=0, le=2**20)
    qk_rope_head_dim: int = Field(0, ge=0, le=2**16)
    qk_nope_head_dim: int = Field(0, ge=0, le=2**16)
    v_head_dim: int = Field(0, ge=0, le=2**16)
    mtp_layers: int = Field(0, ge=0, le=64)


def load_model_file(path: str | Path) -> ModelArch:
    """The architecture in a TOML model file; every problem is a :class:`UserError` naming file and field."""
    f = str(path)
    data = _read_toml(Path(path))
    try:
        m = _ModelFile.model_validate(data)
    except ValidationError as e:
        raise _first_error(e, f) from None
    groups = m.num_query_groups or m.num_attention_heads
    if m.hidden_size % m.num_attention_heads:
        raise UserError(
            f"hidden_size {m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads}",
            file=f,
            field="hidden_size",
        )
    if m.num_attention_heads % groups:
        raise UserError(
            f"num_attention_heads {m.num_attention_heads} is not divisible by num_query_groups {groups}",
            file=f,
            field="num_query_groups",
        )
    _check_moe(m, f)
    extra = {n: getattr(m, n) for n in _ARCH_EXTRAS}
    return ModelArch(
        m.name,
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        groups,
        m.ffn_hidden_size,
        m.vocab_size,
        m.gated_mlp,
        **extra,
    )


# the model file's fields that ModelArch takes by keyword, under the same names
_ARCH_EXTRAS = ("activation", "dropout", *MOE_FIELDS, *MLA_FIELDS, "mtp_layers")


def _check_moe(m: _ModelFile, f: str) -> None:
    """The MoE and MLA fields agree with each other: top-k within the experts, dense layers within the layers,
    MLA's head dims given with its rank."""
    if m.num_experts and m.moe_topk > m.num_experts:
        raise UserError(f"moe_topk {m.moe_topk} exceeds num_experts {m.num_experts}", file=f, field="moe_topk")
    if m.moe_first_dense_layers >= m.num_layers and m.num_experts:
        raise UserError(
            f"moe_first_dense_layers {m.moe_first_dense_layers} leaves no MoE layer of {m.num_layers}",
            file=f,
            field="moe_first_dense_layers",
        )
    if m.kv_lora_rank and not (m.qk_rope_head_dim and m.qk_nope_head_dim and m.v_head_dim):
        raise UserError(
            "kv_lora_rank (multi-latent attention) needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim > 0",
            file=f,
            field="kv_lora_rank",
        )
