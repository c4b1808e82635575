"""Command line, configuration and log formatting of the Megatron-core payload, with no torch import.

Everything here is plain Python so that the argument parsing, the ``path=value`` overrides that dse sends
(the ``mbridge`` spellings of :mod:`dse.facts.knobs`), the FLOPs count and the exact text of the log lines can be
tested without torch. :mod:`recipes.mcore.train` does the GPU work.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from ..models import MLA_FIELDS, MOE_FIELDS, RECIPES, ModelArch

# The reference's small GQA model ("a small 8-layer, 2048-hidden GQA model", shared/reference/README.md):
# head dim 128 as in Llama 3, four query groups, a SwiGLU FFN of 2.75 h and a 32k vocabulary.
SMALL_GQA = ModelArch("small_gqa", 8, 2048, 16, 4, 5632, 32000, True)
# A small fine-grained MoE of the same width for one GPU: every layer's MLP is 16 routed SwiGLU experts of FFN
# 1408 (a quarter of the dense FFN, as DeepSeek's and Qwen's fine-grained experts), top-2, dropless, aux loss.
SMALL_MOE = ModelArch(
    "small_moe", 8, 2048, 16, 4, 5632, 32000, True, num_experts=16, moe_topk=2, moe_ffn_hidden_size=1408
)
# the ModelArch fields that become RunConfig fields of the same meaning (recipes.models names them the same)
_ARCH_MOE = MOE_FIELDS + MLA_FIELDS

RECOMPUTE = ("none", "selective", "full")
# the recompute_modules a dense GPT layer has (Megatron-Core's TransformerConfig.recompute_modules; the MoE ones
# need layers this payload does not build), and the one multi-latent attention adds (its up-projections)
DENSE_RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp")
MLA_RECOMPUTE_MODULES = ("mla_up_proj",)
RECOMPUTE_METHODS = ("uniform", "block")
# Megatron-Core's choices (TransformerConfig: moe_token_dispatcher_type, moe_router_score_function,
# moe_router_load_balancing_type)
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
MOE_SCORES = ("softmax", "sigmoid")
MOE_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")


class ConfigError(ValueError):
    """A command line or override that the payload cannot run; printed as one line, exit status 2."""


def known_models() -> dict[str, ModelArch]:
    """Model presets: the reference's small GQA model and every architecture in :data:`recipes.models.RECIPES`."""
    out = {SMALL_GQA.name: SMALL_GQA, SMALL_MOE.name: SMALL_MOE}
    out.update({r.arch.name: r.arch for r in RECIPES.values()})
    return out


@dataclass(frozen=True)
class RunConfig:
    """One training run: model shape, parallel layout, batch, recompute and schedule. Immutable."""

    model: str = SMALL_GQA.name
    num_layers: int = SMALL_GQA.num_layers
    hidden_size: int = SMALL_GQA.hidden_size
    num_attention_heads: int = SMALL_GQA.num_attention_heads
    num_query_groups: int = SMALL_GQA.num_query_groups
    ffn_hidden_size: int = SMALL_GQA.ffn_hidden_size
    vocab_size: int = SMALL_GQA.vocab_size
    gated: bool = SMALL_GQA.gated_mlp
    kv_channels: int | None = None  # attention head size where it is not hidden / heads (Qwen3); None: h / a
    # --- mixture of experts (Megatron-Core TransformerConfig's moe_* fields); num_experts 0 = a dense model ---
    num_experts: int = 0
    moe_topk: int = 2  # moe_router_topk
    moe_ffn_hidden_size: int = 0  # one routed expert's FFN size; 0 = ffn_hidden_size
    moe_shared_expert_size: int = 0  # moe_shared_expert_intermediate_size; 0 = no shared expert
    moe_first_dense_layers: int = 0  # moe_layer_freq = [0] * k + [1] * (L - k)
    moe_router_score: str = "softmax"  # moe_router_score_function
    moe_load_balancing: str = "aux_loss"  # moe_router_load_balancing_type
    moe_aux_loss_coeff: float = 1e-2  # Megatron-Bridge's Mixtral / Qwen3-MoE providers' 1e-2 and 1e-3
    moe_capacity_factor: float | None = None  # moe_expert_capacity_factor; None = dropless
    moe_pad_to_capacity: bool = False  # moe_pad_expert_input_to_capacity (needs a capacity factor)
    moe_dispatcher: str = "alltoall"  # moe_token_dispatcher_type
    moe_grouped_gemm: bool | None = None  # None: on with the TE spec (TEGroupedMLP), off on the local spec
    moe_permute_fusion: bool = False
    moe_a2a_overlap: bool = False  # overlap_moe_expert_parallel_comm
    # moe_router_enable_expert_bias (DeepSeek-V3's aux-loss-free balancing: a per-expert bias on the sigmoid scores,
    # updated after each step); None: on with sigmoid scores, the only ones Megatron-Core allows it with
    moe_expert_bias: bool | None = None
    # --- multi-latent attention (Megatron-Core's MLATransformerConfig); kv_lora_rank 0 = standard attention ---
    q_lora_rank: int | None = None  # None = no query compression
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0  # MLATransformerConfig.qk_pos_emb_head_dim
    qk_nope_head_dim: int = 0  # MLATransformerConfig.qk_head_dim
    v_head_dim: int = 0
    etp: int | None = None  # expert_tensor_parallel_size; None: 1 (dse's default) once checked
    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool | None = None  # None: on when tp > 1 (Megatron's rule); the local spec cannot do it (see check)
    mbs: int = 1
    gbs: int = 8
    seq_length: int = 2048
    recompute: str = "none"
    recompute_method: str | None = None  # full recompute: "uniform" (default) or "block"
    recompute_num_layers: int | None = None  # full recompute: layers per unit/stage (None: all, 1 per unit)
    # selective recompute's modules, comma-joined (Megatron-Core's recompute_modules; None: its default, core_attn)
    recompute_modules: str | None = None
    precision: str = "bf16"
    fp8_recipe: str | None = None  # FP8 scaling recipe; recorded, meaningful only with precision=fp8
    fsdp: bool = False
    tp_comm_overlap: bool = False
    cpu_offloading: bool = False  # Megatron-Core activation offloading; refused by check() (needs TE)
    cpu_offloading_num_layers: int = 0
    # Megatron-Core AttnBackend: the local layer spec IS the local (unfused) attention; auto means the same here
    attention_backend: str = "local"
    # Which layer spec builds the transformer layers: "auto" (Transformer Engine's when it imports, else the
    # local one), "te" (get_gpt_layer_with_transformer_engine_spec), "local" (get_gpt_layer_local_spec).
    # check() resolves auto, so a checked config always names the spec that runs.
    layer_spec: str = "auto"
    # Megatron's uneven pipeline split (embedding / loss counted as a layer); dse spells both always, off
    # unless pp*vp misses the layers by two. Only the even split is wired here (check() refuses the other).
    pp_first_layers: int | None = None  # Megatron's num_layers_in_first/last_pipeline_stage: refused by check()
    pp_last_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    train_iters: int = 20
    log_interval: int = 1
    # Megatron-LM's --timing-log-level: 0 none; 1 its level-1 timers "forward-backward" and "optimizer", each
    # bracketed by torch.cuda.synchronize() (so the phases are told apart at the cost of two syncs per step) and
    # printed per iteration, averaged over the log interval, in Megatron's "(min, max) time across ranks (ms)" block
    timing_log_level: int = 0
    lr: float = 3.0e-4
    min_lr: float = 3.0e-5
    lr_warmup_iters: int = 2  # clamped below the decay length, as Megatron requires
    lr_decay_iters: int | None = None  # None: train_iters
    weight_decay: float = 0.1
    clip_grad: float = 1.0
    seed: int = 1234
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool | None = None  # None: on when data-parallel size > 1
    # Megatron-Core's default: this loop has no forward pre-hook, so it gathers the weights after the optimizer step
    overlap_param_gather: bool = False

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_flops_per_step(cfg: RunConfig, convention: str = "causal") -> float:
    """Model FLOPs of one global batch (forward and backward), as shared/reference/README.md defines them.

    FLOPs/step = 6·B·s·[L·(e·h·F + 2·h·a·d + 2·h·g·d + c·a·d·s) + h·V], e = 3 for a gated MLP else 2,
    c = 1 in the ``causal`` convention (current Megatron-LM's ``num_floating_point_operations``: the score
    and value products count half under a causal mask) and 2 in the ``noncausal`` one. Recompute is not
    counted (model FLOPs, not hardware FLOPs), as in Megatron-LM's logged throughput.
    """
    from .. import contract  # the formula the controller's parser and model use

    if cfg.is_moe or cfg.kv_channels or cfg.is_mla:
        # Megatron-LM's num_floating_point_operations for an MoE (top-k routed experts + shared expert, the first
        # dense layers with the dense FFN) or a head size other than h / a: the contract's MoE formula
        try:
            return contract.moe_model_flops_per_step(
                _arch_of(cfg), gbs=cfg.gbs, seq_length=cfg.seq_length, convention=convention
            )
        except ValueError as e:
            raise ConfigError(str(e)) from None
    try:
        return contract.model_flops_per_step(
            num_layers=cfg.num_layers,
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            num_query_groups=cfg.num_query_groups,
            ffn_hidden_size=cfg.ffn_hidden_size,
            vocab_size=cfg.vocab_size,
            gated_mlp=cfg.gated,
            gbs=cfg.gbs,
            seq_length=cfg.seq_length,
            convention=convention,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _arch_of(cfg: RunConfig) -> ModelArch:
    """The run's architecture as recipes.models describes one (for the contract's MoE FLOPs formula)."""
    return ModelArch(
        cfg.model,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_query_groups,
        cfg.ffn_hidden_size,
        cfg.vocab_size,
        cfg.gated,
        **{name: getattr(cfg, name) for name in _ARCH_MOE},
    )


def te_importable() -> bool:
    """Whether Transformer Engine's PyTorch package is installed (found, not imported: no torch import here)."""
    import importlib.util

    try:
        return importlib.util.find_spec("transformer_engine.pytorch") is not None
    except (ImportError, ValueError):
        return False


# house: one independent refusal after another (each a rule the payload cannot run), read top to bottom
def check(
    cfg: RunConfig, world_size: int, *, te_available: bool | None = None, gpu_capability: tuple[int, int] | None = None
) -> RunConfig:
    """Validate ``cfg`` for ``world_size`` processes; return it with derived defaults filled in.

    ``te_available`` (default: :func:`te_importable`) resolves ``layer_spec=auto``. ``gpu_capability`` is the
    GPU's compute capability where known (the trainer passes it; ``None`` on a machine without a GPU).
    Raises :class:`ConfigError` naming the setting for what this payload cannot run. The local layer spec (no
    Transformer Engine, no Apex) has no sequence parallelism, no FP8, no flash/fused attention and no
    activation offloading; the TE spec has them, but MXFP8 and blockwise FP8 need a Blackwell GPU
    (compute capability 10.x; Hopper is 9.0). Context parallelism and TP comm overlap are wired in neither.
    """

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    for name in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "ffn_hidden_size",
        "vocab_size",
        "tp",
        "pp",
        "vp",
        "cp",
        "ep",
        "mbs",
        "gbs",
        "seq_length",
        "train_iters",
        "log_interval",
    ):
        need(getattr(cfg, name) >= 1, f"{name}={getattr(cfg, name)} must be >= 1")
    need(
        cfg.timing_log_level in (0, 1),
        f"timing_log_level={cfg.timing_log_level} must be 0 or 1 (level 1's timers only)",
    )
    need(cfg.lr_decay_iters is None or cfg.lr_decay_iters >= 1, f"lr_decay_iters={cfg.lr_decay_iters} must be >= 1")
    need(
        cfg.hidden_size % cfg.num_attention_heads == 0,
        f"hidden_size={cfg.hidden_size} is not divisible by num_attention_heads={cfg.num_attention_heads}",
    )
    need(
        cfg.num_attention_heads % cfg.num_query_groups == 0,
        f"num_attention_heads={cfg.num_attention_heads} is not divisible by num_query_groups={cfg.num_query_groups}",
    )
    need(cfg.num_query_groups % cfg.tp == 0, f"num_query_groups={cfg.num_query_groups} is not divisible by tp={cfg.tp}")
    need(cfg.ffn_hidden_size % cfg.tp == 0, f"ffn_hidden_size={cfg.ffn_hidden_size} is not divisible by tp={cfg.tp}")
    _check_pipeline_split(cfg, need)
    need(cfg.vp == 1 or cfg.pp > 1, f"vp={cfg.vp} needs pp > 1")
    if te_available is None:
        te_available = te_importable()
    need(cfg.layer_spec in LAYER_SPECS, f"layer_spec={cfg.layer_spec!r}; one of {', '.join(LAYER_SPECS)}")
    spec = cfg.layer_spec if cfg.layer_spec != "auto" else ("te" if te_available else "local")
    need(
        spec != "te" or te_available,
        "layer_spec=te: Transformer Engine (transformer_engine.pytorch) is not installed; use layer_spec=local",
    )
    te = spec == "te"
    need(cfg.cp == 1, f"cp={cfg.cp}: context parallelism is not wired into this payload; cp=1 only")
    moe = _check_moe(cfg, world_size, te)
    _check_mla(cfg, need)
    need(cfg.precision in ("bf16", "fp8"), f"precision={cfg.precision!r}; one of bf16, fp8")
    need(
        cfg.precision == "bf16" or te,
        f"precision={cfg.precision}: FP8 needs Transformer Engine's layer spec; the local spec runs bf16 only",
    )
    need(cfg.fp8_recipe in (None, *FP8_RECIPES), f"fp8_recipe={cfg.fp8_recipe!r}; one of {', '.join(FP8_RECIPES)}")
    if cfg.precision == "fp8" and cfg.fp8_recipe in BLACKWELL_FP8_RECIPES and gpu_capability is not None:
        need(
            gpu_capability[0] >= 10,
            f"fp8_recipe={cfg.fp8_recipe}: needs a Blackwell GPU (compute capability 10.x); this GPU is "
            f"{gpu_capability[0]}.{gpu_capability[1]} (Hopper: use fp8_recipe=delayed or tensorwise)",
        )
    need(not cfg.fsdp, "fsdp=true: Megatron FSDP is not wired into this payload; use the distributed optimizer")
    need(not cfg.tp_comm_overlap, "tp_comm_overlap=true needs Transformer Engine's userbuffers")
    need(
        not cfg.overlap_param_gather,
        "overlap_param_gather=true: this loop gathers the weights after the optimizer step (no forward pre-hook)",
    )
    need(
        not cfg.cpu_offloading or te,
        "cpu_offloading=true: Megatron-Core offloads activations through Transformer "
        "Engine's offload context; the local layer spec has none",
    )
    if cfg.cpu_offloading:
        # Megatron-Core's TransformerConfig: 0 < cpu_offloading_num_layers < num_layers (one layer stays on)
        need(
            0 < cfg.cpu_offloading_num_layers < cfg.num_layers,
            f"cpu_offloading_num_layers={cfg.cpu_offloading_num_layers} must be between 1 and num_layers-1 "
            f"({cfg.num_layers - 1})",
        )
    need(
        cfg.attention_backend in LOCAL_ATTENTION or cfg.attention_backend in TE_ATTENTION,
        f"attention_backend={cfg.attention_backend!r}; one of {', '.join(LOCAL_ATTENTION + TE_ATTENTION)}",
    )
    need(
        cfg.attention_backend not in TE_ATTENTION or te,
        f"attention_backend={cfg.attention_backend}: flash and fused attention come from Transformer Engine; the "
        f"local layer spec computes attention unfused (attention_backend=local, unfused or auto)",
    )
    need(not cfg.sp or te, "sp=true: the local layer spec's torch norms have no sequence parallelism; set sp=false")
    need(not cfg.sp or cfg.tp > 1, "sp=true needs tp > 1")
    need(cfg.recompute in RECOMPUTE, f"recompute={cfg.recompute!r}; one of {', '.join(RECOMPUTE)}")
    need(
        cfg.recompute_method in (None, *RECOMPUTE_METHODS),
        f"recompute_method={cfg.recompute_method!r}; one of {', '.join(RECOMPUTE_METHODS)}",
    )
    if cfg.recompute_modules:
        modules = cfg.recompute_modules.split(",")
        need(cfg.recompute == "selective", f"recompute_modules={cfg.recompute_modules} needs recompute=selective")
        known = DENSE_RECOMPUTE_MODULES + (MLA_RECOMPUTE_MODULES if cfg.is_mla else ())
        need(
            set(modules) <= set(known),
            f"recompute_modules={cfg.recompute_modules}; this model's layers have {', '.join(known)}",
        )
    layers_per_stage = max(stage_layers(cfg))
    if cfg.recompute == "full":
        n = cfg.recompute_num_layers or None  # dse's 0 means "all layers"
        need(
            n is None or 1 <= n <= layers_per_stage,
            f"recompute_num_layers={n} must be between 1 and the layers per pipeline stage ({layers_per_stage})",
        )
    model_parallel = cfg.tp * cfg.pp * cfg.cp
    need(world_size % model_parallel == 0, f"world size {world_size} is not divisible by tp*pp*cp={model_parallel}")
    dp = world_size // model_parallel
    need(cfg.gbs % (cfg.mbs * dp) == 0, f"gbs={cfg.gbs} is not divisible by mbs*dp={cfg.mbs}*{dp}")
    if cfg.pp > 1 and cfg.vp > 1:
        m = cfg.gbs // (cfg.mbs * dp)
        need(m % cfg.pp == 0, f"interleaved pipeline: micro-batches per step ({m}) must be a multiple of pp={cfg.pp}")
    out = replace(cfg, layer_spec=spec, **moe)
    if cfg.precision == "fp8" and cfg.fp8_recipe is None:
        out = replace(out, fp8_recipe="delayed")  # Megatron-Core's default Fp8Recipe
    if cfg.precision != "fp8" and cfg.fp8_recipe is not None:
        out = replace(out, fp8_recipe=None)  # dse always spells a recipe; it means nothing in bf16
    if cfg.sp is None:
        out = replace(out, sp=te and cfg.tp > 1)  # Megatron's rule where the spec can (TE norms)
    if cfg.overlap_grad_reduce is None:
        out = replace(out, overlap_grad_reduce=dp > 1)
    if cfg.recompute == "full":
        out = replace(
            out,
            recompute_method=cfg.recompute_method or "uniform",
            recompute_num_layers=cfg.recompute_num_layers
            or (1 if (cfg.recompute_method or "uniform") == "uniform" else layers_per_stage),
        )
    else:
        need(
            cfg.recompute_method is None and cfg.recompute_num_layers in (None, 0),
            "recompute_method / recompute_num_layers apply to recompute=full only",
        )
        out = replace(out, recompute_method=None, recompute_num_layers=None)
    return out


def _check_pipeline_split(cfg: RunConfig, need) -> None:
    """Megatron-Core's pipeline splits: even (pp*vp divides the layers), the embedding and loss counted as layers
    (``account_for_*_in_pipeline_split``: pp*vp divides the layers plus those counted), or uneven first and last
    stages (``num_layers_in_first/last_pipeline_stage``, no interleaving: the other stages split the rest evenly)."""
    first, last = cfg.pp_first_layers or 0, cfg.pp_last_layers or 0
    counted = int(cfg.account_for_embedding_in_pipeline_split) + int(cfg.account_for_loss_in_pipeline_split)
    chunks = cfg.pp * cfg.vp
    if first or last:
        need(
            not counted,
            "num_layers_in_first/last_pipeline_stage and account_for_*_in_pipeline_split exclude each other",
        )
        need(cfg.vp == 1, "num_layers_in_first/last_pipeline_stage: wired here without interleaving (vp=1) only")
        need(cfg.pp > 1, "num_layers_in_first/last_pipeline_stage needs pp > 1")
        middle = cfg.pp - bool(first) - bool(last)
        rest = cfg.num_layers - first - last
        need(
            rest >= 0 and (rest % middle == 0 if middle else rest == 0),
            f"num_layers={cfg.num_layers} less the first ({first}) and last ({last}) stage's layers does not split "
            f"evenly over the other {middle} pipeline stages",
        )
        return
    if counted:
        need(cfg.pp > 1, "account_for_embedding/loss_in_pipeline_split needs pp > 1")
        need(
            (cfg.num_layers + counted) % chunks == 0,
            f"num_layers={cfg.num_layers} plus the {counted} counted for embedding/loss is not divisible by "
            f"pp*vp={chunks}",
        )
        return
    need(cfg.num_layers % chunks == 0, f"num_layers={cfg.num_layers} is not divisible by pp*vp={chunks}")


def stage_layers(cfg: RunConfig) -> list[int]:
    """Transformer layers on each pipeline stage (its virtual chunks together), as Megatron-Core splits them for
    a configuration :func:`check` accepts."""
    pp, first, last = cfg.pp, cfg.pp_first_layers or 0, cfg.pp_last_layers or 0
    if first or last:
        middle = pp - bool(first) - bool(last)
        each = (cfg.num_layers - first - last) // middle if middle else 0
        return [first or each] + [each] * (pp - 2) + [last or each]
    emb, loss = int(cfg.account_for_embedding_in_pipeline_split), int(cfg.account_for_loss_in_pipeline_split)
    each = (cfg.num_layers + emb + loss) // pp
    out = [each] * pp
    out[0] -= emb
    out[-1] -= loss
    return out


def _check_mla(cfg: RunConfig, need) -> None:
    """Multi-latent attention's rules (Megatron-Core's MLATransformerConfig): every head size and rank set (the
    heads' split over tensor parallelism is the general rule's); expert bias only with sigmoid scores."""
    if cfg.moe_expert_bias:
        # TransformerConfig.__post_init__: expert bias needs sigmoid (or sqrtsoftplus) router scores
        need(cfg.moe_router_score == "sigmoid", "moe_expert_bias=true needs moe_router_score=sigmoid")
    if not cfg.is_mla:
        return
    for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        need(getattr(cfg, name) >= 1, f"{name}={getattr(cfg, name)} must be >= 1 with multi-latent attention")
    need(
        cfg.q_lora_rank is None or cfg.q_lora_rank >= 1,
        f"q_lora_rank={cfg.q_lora_rank} must be >= 1 (or null: no query compression)",
    )


def _check_moe(cfg: RunConfig, world_size: int, te: bool) -> dict[str, Any]:
    """The MoE part of :func:`check`: Megatron-Core's own rules (cited where it checks them) and what this
    payload cannot run, each a :class:`ConfigError` naming the setting; returns the resolved MoE fields."""

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    etp = cfg.etp if cfg.etp is not None else 1
    need(cfg.num_experts >= 0, f"num_experts={cfg.num_experts} must be >= 0 (0: a dense model)")
    need(etp >= 1, f"etp={etp} must be >= 1")
    if not cfg.is_moe:
        need(cfg.ep == 1 and etp == 1, f"ep={cfg.ep}, etp={etp}: expert parallelism needs num_experts > 0")
        return {"etp": etp, "moe_grouped_gemm": False, "moe_expert_bias": False}
    need(1 <= cfg.moe_topk <= cfg.num_experts, f"moe_topk={cfg.moe_topk} must be between 1 and num_experts")
    need(cfg.moe_ffn_hidden_size >= 0, f"moe_ffn_hidden_size={cfg.moe_ffn_hidden_size} must be >= 0")
    need(cfg.moe_shared_expert_size >= 0, f"moe_shared_expert_size={cfg.moe_shared_expert_size} must be >= 0")
    need(
        0 <= cfg.moe_first_dense_layers < cfg.num_layers,
        f"moe_first_dense_layers={cfg.moe_first_dense_layers} must be between 0 and num_layers-1",
    )
    need(
        cfg.moe_router_score in MOE_SCORES, f"moe_router_score={cfg.moe_router_score!r}; one of {', '.join(MOE_SCORES)}"
    )
    need(
        cfg.moe_load_balancing in MOE_BALANCING,
        f"moe_load_balancing={cfg.moe_load_balancing!r}; one of {', '.join(MOE_BALANCING)}",
    )
    need(
        cfg.moe_dispatcher in MOE_DISPATCHERS,
        f"moe_dispatcher={cfg.moe_dispatcher!r}; one of {', '.join(MOE_DISPATCHERS)}",
    )
    need(
        cfg.moe_capacity_factor is None or cfg.moe_capacity_factor > 0,
        f"moe_capacity_factor={cfg.moe_capacity_factor} must be > 0 (or null: dropless)",
    )
    # TransformerConfig.__post_init__: "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity"
    need(
        not cfg.moe_pad_to_capacity or cfg.moe_capacity_factor is not None,
        "moe_pad_to_capacity=true needs a capacity factor (moe_capacity_factor)",
    )
    # TransformerConfig.__post_init__: top-1 softmax routing without pre-softmax has a zero gradient
    need(
        cfg.moe_topk > 1 or cfg.moe_router_score != "softmax",
        "moe_topk=1 with softmax scores: Megatron-Core needs moe_router_pre_softmax, which this payload does not set",
    )
    # MoELayer.__init__: assert num_moe_experts % ep_size == 0
    need(cfg.num_experts % cfg.ep == 0, f"num_experts={cfg.num_experts} is not divisible by ep={cfg.ep}")
    # parallel_state.initialize_model_parallel: the expert grid etp x ep x pp divides the world
    grid = etp * cfg.ep * cfg.pp
    need(world_size % grid == 0, f"world size {world_size} is not divisible by etp*ep*pp={grid}")
    need(cfg.expert_ffn % etp == 0, f"moe_ffn_hidden_size={cfg.expert_ffn} is not divisible by etp={etp}")
    # ModelParallelConfig.__post_init__ (a warning there; Megatron-LM's arguments.py makes it an error)
    need(
        not (cfg.ep > 1 and cfg.tp > 1 and cfg.sp is False),
        "ep > 1 with tp > 1 needs sequence parallelism (sp=true)",
    )
    grouped = te if cfg.moe_grouped_gemm is None else cfg.moe_grouped_gemm
    need(
        not grouped or te,
        "moe_grouped_gemm=true: Megatron-Core's grouped GEMM experts (TEGroupedMLP) need Transformer Engine; the "
        "local layer spec builds SequentialMLP (set moe_grouped_gemm=false)",
    )
    # TransformerConfig.__post_init__: fused permutation needs TE >= 2.1
    need(not cfg.moe_permute_fusion or te, "moe_permute_fusion=true needs Transformer Engine's fused permutation")
    need(
        cfg.moe_dispatcher != "flex",
        "moe_dispatcher=flex: DeepEP / HybridEP are not installed with this payload; use alltoall or allgather",
    )
    # TransformerConfig.__post_init__: overlap_moe_expert_parallel_comm asserts expert_model_parallel_size > 1
    need(not cfg.moe_a2a_overlap or cfg.ep > 1, "moe_a2a_overlap=true needs ep > 1 (Megatron-Core asserts it)")
    need(
        not cfg.moe_a2a_overlap,
        "moe_a2a_overlap=true: the overlapped 1F1B MoE schedule is not wired into this payload",
    )
    bias = cfg.moe_router_score == "sigmoid" if cfg.moe_expert_bias is None else cfg.moe_expert_bias
    return {"etp": etp, "moe_grouped_gemm": grouped, "moe_expert_bias": bias}


# -------------------------------------------------------------------------------------------- overrides
# ``path=value`` spellings accepted after the flags. The knob paths are the ``mbridge`` ones of dse.facts.knobs
# (Megatron-Bridge's ConfigContainer: model.*, train.*, dataset.*, ddp.*, comm_overlap.*, mixed_precision);
# model-shape paths follow Megatron-Bridge's GPTModelProvider field names.
_OVERRIDES: dict[str, str] = {
    "model.tensor_model_parallel_size": "tp",
    "model.pipeline_model_parallel_size": "pp",
    "model.virtual_pipeline_model_parallel_size": "vp",
    "model.context_parallel_size": "cp",
    "model.expert_model_parallel_size": "ep",
    "model.expert_tensor_parallel_size": "etp",
    "model.num_moe_experts": "num_experts",
    "model.mtp_num_layers": "mtp_layers",  # read before the config is built: this payload builds no MTP layer
    "model.moe_router_topk": "moe_topk",
    "model.moe_ffn_hidden_size": "moe_ffn_hidden_size",
    "model.moe_shared_expert_intermediate_size": "moe_shared_expert_size",
    "model.moe_router_score_function": "moe_router_score",
    "model.moe_router_load_balancing_type": "moe_load_balancing",
    "model.moe_aux_loss_coeff": "moe_aux_loss_coeff",
    "model.moe_expert_capacity_factor": "moe_capacity_factor",
    "model.moe_pad_expert_input_to_capacity": "moe_pad_to_capacity",
    "model.moe_token_dispatcher_type": "moe_dispatcher",
    "model.moe_grouped_gemm": "moe_grouped_gemm",
    "model.moe_permute_fusion": "moe_permute_fusion",
    "comm_overlap.overlap_moe_expert_parallel_comm": "moe_a2a_overlap",
    "model.overlap_moe_expert_parallel_comm": "moe_a2a_overlap",
    "model.kv_channels": "kv_channels",
    "model.sequence_parallel": "sp",
    "train.micro_batch_size": "mbs",
    "train.global_batch_size": "gbs",
    "model.seq_length": "seq_length",
    "dataset.sequence_length": "seq_length",
    "model.recompute_granularity": "recompute",
    "model.recompute_method": "recompute_method",
    "model.recompute_num_layers": "recompute_num_layers",
    "model.recompute_modules": "recompute_modules",
    "mixed_precision": "precision",
    "ddp.use_megatron_fsdp": "fsdp",
    "comm_overlap.tp_comm_overlap": "tp_comm_overlap",
    "model.cpu_offloading": "cpu_offloading",
    "model.cpu_offloading_num_layers": "cpu_offloading_num_layers",
    "model.attention_backend": "attention_backend",
    "model.transformer_impl": "layer_spec",
    "model.num_layers_in_first_pipeline_stage": "pp_first_layers",
    "model.num_layers_in_last_pipeline_stage": "pp_last_layers",
    "model.account_for_embedding_in_pipeline_split": "account_for_embedding_in_pipeline_split",
    "model.account_for_loss_in_pipeline_split": "account_for_loss_in_pipeline_split",
    "train.train_iters": "train_iters",
    "logger.log_interval": "log_interval",
    "optimizer.lr": "lr",
    "optimizer.min_lr": "min_lr",
    "optimizer.weight_decay": "weight_decay",
    "optimizer.clip_grad": "clip_grad",
    "optimizer.use_distributed_optimizer": "distributed_optimizer",
    "ddp.use_distributed_optimizer": "distributed_optimizer",
    "ddp.overlap_grad_reduce": "overlap_grad_reduce",
    "ddp.overlap_param_gather": "overlap_param_gather",
    "scheduler.lr_warmup_iters": "lr_warmup_iters",
    "scheduler.lr_decay_iters": "lr_decay_iters",
    "rng.seed": "seed",
    "model.num_layers": "num_layers",
    "model.hidden_size": "hidden_size",
    "model.num_attention_heads": "num_attention_heads",
    "model.num_query_groups": "num_query_groups",
    "model.ffn_hidden_size": "ffn_hidden_size",
    "model.vocab_size": "vocab_size",
    "model.gated_linear_unit": "gated",
}
# Megatron-Bridge settings that dse sends with others (its Megatron-FSDP set, the offload details) and that
# change nothing here: the knob they come with (ddp.use_megatron_fsdp=true, model.cpu_offloading=true) is
# refused by check() with the reason.
IGNORED = (
    "ddp.data_parallel_sharding_strategy",
    "ddp.average_in_collective",
    "model.init_model_with_meta_device",
    "optimizer.use_precision_aware_optimizer",
    # what is offloaded (activations, not weights): meaningful only with cpu_offloading, refused by check()
    "model.cpu_offloading_activations",
    "model.cpu_offloading_weights",
    # what dse spells with moe_dispatcher=flex and moe_a2a_overlap=true (dse.facts.knobs), both refused by check()
    "model.moe_flex_dispatcher_backend",
    "model.moe_shared_expert_overlap",
    "comm_overlap.delay_wgrad_compute",
)
_NULLS = ("null", "none", "None", "~")
# mixed_precision recipe names as Megatron-Bridge spells them; only the bf16 ones run here.
_PRECISIONS = {"bf16": "bf16", "bf16_mixed": "bf16", "bf16-mixed": "bf16"}
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
BLACKWELL_FP8_RECIPES = ("mxfp8", "blockwise")  # MXFP8 and 1x128/128x128 block scaling: sm_100 kernels only
# Megatron-Bridge's mixed-precision recipe names (what dse's mbridge spelling sends) -> FP8 recipe
_BRIDGE_FP8 = {
    "bf16_with_fp8_delayed_scaling_mixed": "delayed",
    "bf16_with_fp8_current_scaling_mixed": "tensorwise",
    "bf16_with_mxfp8_mixed": "mxfp8",
    "bf16_with_fp8_subchannel_scaling_mixed": "blockwise",
}
LAYER_SPECS = ("auto", "te", "local")
# Megatron-Core AttnBackend names: what the local layer spec runs, and what needs Transformer Engine
LOCAL_ATTENTION = ("local", "unfused", "auto")
TE_ATTENTION = ("flash", "fused")


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(RunConfig)}


def _convert(name: str, text: str, where: str) -> Any:
    if name == "mtp_layers":  # no RunConfig field: the architecture's, read (and refused unless 0) at parse time
        return 0 if text in _NULLS else _convert("num_layers", text, where)
    kind = _field_types()[name]
    optional = "None" in kind
    if text in _NULLS:
        if name == "recompute":
            return "none"
        if name == "vp":
            return 1
        if optional:
            return None
        raise ConfigError(f"{where}: {name} cannot be null")
    if kind.startswith("bool"):
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{where}: {text!r} is not a boolean (true or false)")
    if kind.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{where}: {text!r} is not an integer") from None
    if kind.startswith("float"):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{where}: {text!r} is not a number") from None
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {text!r} is not a finite number")
        return value
    if name == "layer_spec":
        return {"transformer_engine": "te"}.get(text, text)  # Bridge's transformer_impl spelling
    if name == "recompute_modules":  # Hydra's list, [core_attn,mlp] (quotes allowed), kept comma-joined
        return ",".join(m.strip().strip("'\"") for m in text.strip("[]").split(",") if m.strip())
    if name == "precision":
        if "fp8" in text.lower():
            return "fp8"  # check() explains why FP8 cannot run here
        return _PRECISIONS.get(text, text)
    return text


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["train.micro_batch_size=2", ...]`` -> ``{"mbs": 2, ...}``; unknown paths are a :class:`ConfigError`."""
    out: dict[str, Any] = {}
    for item in items:
        path, sep, text = item.partition("=")
        path = path.strip().lstrip("+")  # Hydra's "+key=value" (add a key) means the same here
        if not sep or not path:
            raise ConfigError(f"{item!r} is not an override; write path=value, e.g. train.micro_batch_size=2")
        if path in IGNORED:
            continue
        name = _OVERRIDES.get(path)
        if name is None:
            close = [p for p in _OVERRIDES if p.rsplit(".", 1)[-1] == path.rsplit(".", 1)[-1]]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown override {path!r}{hint}; known: {', '.join(sorted(_OVERRIDES))}")
        text = text.strip()
        if name == "precision" and text in FP8_RECIPES:
            # dse spells both the precision and the FP8 scaling recipe as mixed_precision=...
            out["fp8_recipe"] = text
            continue
        if name == "precision" and text in _BRIDGE_FP8:
            out["fp8_recipe"] = _BRIDGE_FP8[text]
        out[name] = _convert(name, text, path)
    return out


# ------------------------------------------------------------------------------------------------- argv
# house: one add_argument per flag the payload takes; no logic to split
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipes.mcore",
        description="Minimal Megatron-core GPT pretraining on mock data; prints Megatron-LM-format iteration "
        "lines. Run one process per GPU with torchrun. Overrides (path=value, Megatron-Bridge "
        "spellings such as model.tensor_model_parallel_size=2 train.micro_batch_size=2) follow "
        "the flags and win over them.",
    )
    p.add_argument(
        "--model",
        default=SMALL_GQA.name,
        help=f"architecture preset (default {SMALL_GQA.name}); one of: {', '.join(known_models())}",
    )
    p.add_argument(
        "--factory",
        "--recipe",
        dest="factory",
        default=None,
        help="recipe name as dse sends it (llama3_8b, llama3_8b_recipe or Megatron-Bridge's "
        "llama3_8b_pretrain_config); sets --model",
    )
    p.add_argument("-y", "--yes", action="store_true", help="accepted for nemo-run compatibility; no effect")
    shape = p.add_argument_group("model shape (override the preset)")
    for flag in (
        "num-layers",
        "hidden-size",
        "num-attention-heads",
        "num-query-groups",
        "ffn-hidden-size",
        "vocab-size",
        "kv-channels",
        "num-experts",
        "moe-topk",
        "moe-ffn-hidden-size",
    ):
        shape.add_argument(f"--{flag}", type=int, default=None)
    shape.add_argument("--swiglu", dest="gated", action="store_true", default=None, help="gated SwiGLU MLP")
    shape.add_argument("--no-swiglu", dest="gated", action="store_false", help="plain GeLU MLP")
    lay = p.add_argument_group("layout and batch")
    for flag, help_ in (
        ("tp", "tensor-parallel size"),
        ("pp", "pipeline-parallel size"),
        ("ep", "expert-parallel size"),
        ("etp", "expert tensor-parallel size"),
        ("vp", "virtual-pipeline size"),
        ("mbs", "micro-batch size"),
        ("gbs", "global batch size"),
        ("seq-length", "sequence length"),
    ):
        lay.add_argument(f"--{flag}", type=int, default=None, help=help_)
    lay.add_argument(
        "--moe-grouped-gemm",
        dest="moe_grouped_gemm",
        action="store_true",
        default=None,
        help="MoE experts as TE grouped GEMMs (TEGroupedMLP; the default on the TE spec)",
    )
    lay.add_argument(
        "--no-moe-grouped-gemm",
        dest="moe_grouped_gemm",
        action="store_false",
        help="MoE experts one GEMM each (SequentialMLP)",
    )
    lay.add_argument("--recompute", choices=RECOMPUTE, default=None, help="activation recompute (default none)")
    lay.add_argument("--recompute-method", choices=RECOMPUTE_METHODS, default=None)
    lay.add_argument("--recompute-num-layers", type=int, default=None)
    run = p.add_argument_group("schedule")
    run.add_argument("--train-iters", type=int, default=None)
    run.add_argument("--log-interval", type=int, default=None)
    run.add_argument(
        "--timing-log-level",
        type=int,
        default=None,
        help="1: print Megatron-LM's level-1 timers (forward-backward, optimizer; two syncs per step), 0: none",
    )
    run.add_argument("--lr", type=float, default=None)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument(
        "--no-distributed-optimizer",
        dest="distributed_optimizer",
        action="store_false",
        default=None,
        help="plain Megatron mixed-precision Adam instead of the distributed optimizer",
    )
    run.add_argument(
        "--layer-spec",
        choices=LAYER_SPECS,
        default=None,
        help="transformer layer spec: te (Transformer Engine), local (megatron-core's torch modules) "
        "or auto (te when Transformer Engine imports; the default)",
    )
    run.add_argument(
        "--attention-backend",
        choices=LOCAL_ATTENTION + TE_ATTENTION,
        default=None,
        help="Megatron-Core AttnBackend (flash and fused need the TE spec)",
    )
    run.add_argument(
        "--fp8",
        dest="fp8_recipe",
        choices=FP8_RECIPES,
        default=None,
        help="FP8 (hybrid) with this scaling recipe; needs the TE spec",
    )
    run.add_argument(
        "--fake-process-group",
        action="store_true",
        help="probe: run rank RANK of a WORLD_SIZE-rank job alone on this GPU under PyTorch's fake process group "
        "(collectives skipped; the rank's weights, optimizer states, activations and kernels are real)",
    )
    run.add_argument(
        "--check-only",
        action="store_true",
        help="print the resolved configuration and the FLOPs per step as JSON and exit",
    )
    p.add_argument("overrides", nargs="*", metavar="path=value")
    return p


def _model_from(name: str) -> ModelArch:
    models = known_models()
    key = name.removesuffix("_recipe").removesuffix("_pretrain_config")
    if key not in models:
        raise ConfigError(f"unknown model {name!r}; one of {', '.join(models)}")
    return models[key]


def config_from_argv(argv: Sequence[str]) -> tuple[RunConfig, argparse.Namespace]:
    """The run configuration for a command line: preset < flags < ``path=value`` overrides."""
    ns = build_parser().parse_args(list(argv))
    arch = _model_from(ns.factory or ns.model)
    values: dict[str, Any] = dict(
        model=arch.name,
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        ffn_hidden_size=arch.ffn_hidden_size,
        vocab_size=arch.vocab_size,
        gated=arch.gated_mlp,
    )
    if arch.sliding_window:
        raise ConfigError(f"model {arch.name}: sliding-window attention is not wired into this payload")
    values.update({name: getattr(arch, name) for name in _ARCH_MOE})
    flag_names = {
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "ffn_hidden_size",
        "vocab_size",
        "gated",
        "kv_channels",
        "num_experts",
        "moe_topk",
        "moe_ffn_hidden_size",
        "moe_grouped_gemm",
        "tp",
        "pp",
        "ep",
        "etp",
        "vp",
        "mbs",
        "gbs",
        "seq_length",
        "recompute",
        "recompute_method",
        "recompute_num_layers",
        "train_iters",
        "log_interval",
        "timing_log_level",
        "lr",
        "seed",
        "distributed_optimizer",
        "layer_spec",
        "attention_backend",
        "fp8_recipe",
    }
    values.update({k: v for k, v in vars(ns).items() if k in flag_names and v is not None})
    if ns.fp8_recipe is not None:
        values["precision"] = "fp8"
    values.update(parse_overrides(ns.overrides))
    if values.pop("mtp_layers", arch.mtp_layers):
        # a model with multi-token prediction runs here without it (the MTP layers are not built): its slices
        # (recipes.models' deepseek_v3_8l, model.mtp_num_layers=null) drop it; the full model is refused rather
        # than run short of a layer
        raise ConfigError(f"model {arch.name}: multi-token prediction is not wired into this payload")
    preset = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        ffn_hidden_size=arch.ffn_hidden_size,
        vocab_size=arch.vocab_size,
        gated=arch.gated_mlp,
        **{name: getattr(arch, name) for name in _ARCH_MOE},
    )
    changed = {k for k, v in preset.items() if values[k] != v}
    if changed == {"num_layers"}:  # a scaled preset, as recipes.models names them (llama3_70b_16l)
        values["model"] = f"{arch.name}_{values['num_layers']}l"
    elif changed:
        values["model"] = f"{arch.name}_custom"
    return RunConfig(**values), ns


# ------------------------------------------------------------------------------------------ log lines
def format_iteration_line(
    *,
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    elapsed_ms: float,
    tflops_per_gpu: float | None,
    learning_rate: float,
    global_batch_size: int,
    losses: dict[str, float],
    loss_scale: float,
    grad_norm: float | None,
    skipped: int = 0,
    nan: int = 0,
    now: datetime | None = None,
) -> str:
    """One iteration line exactly as Megatron-LM's ``training_log`` prints it (log_throughput on).

    Field order and number formats follow ``megatron/training/training.py`` (``{:8d}`` iterations,
    ``{:12d}`` samples, ``{:.1f}`` ms and TFLOP/s, ``{:.6E}`` learning rate and losses, ``{:.3f}`` grad
    norm). The timestamp is ``[YYYY-MM-DD HH:MM:SS]`` as in Megatron-LM r0.x and Megatron-Bridge (the
    newest Megatron-LM adds microseconds; parsers accept both).
    """
    ts = (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S")
    s = f" [{ts}]"
    s += f" iteration {iteration:8d}/{train_iters:8d} |"
    s += f" consumed samples: {consumed_samples:12d} |"
    s += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if tflops_per_gpu is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops_per_gpu:.1f} |"
    s += f" learning rate: {learning_rate:.6E} |"
    s += f" global batch size: {global_batch_size:5d} |"
    for key, value in losses.items():
        if value >= 0.0:
            s += f" {key}: {value:.6E} |"
    s += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        s += f" grad norm: {grad_norm:.3f} |"
    s += f" number of skipped iterations: {skipped:3d} |"
    s += f" number of nan iterations: {nan:3d} |"
    return s


def header_lines(cfg: RunConfig, world: int, dp: int, device: str, host: str = "") -> list[str]:
    """The lines rank 0 prints before building the model: the run, the layer spec, the device (and ``host``, its
    CPU, where given: two machines of one GPU can differ in their hosts, which bound small steps), the precision, the
    model and (an MoE) its experts. bench/h200_real_runs.py, h200_te_runs.py and moe_gpu_runs.py read them back."""
    num_micro = cfg.gbs // (cfg.mbs * dp)
    fp8 = f"fp8 hybrid {cfg.fp8_recipe}" if cfg.precision == "fp8" else "bf16"
    lines = [
        f"> recipes.mcore: world size {world}, tp {cfg.tp}, pp {cfg.pp}, vp {cfg.vp}, dp {dp}, "
        f"mbs {cfg.mbs}, gbs {cfg.gbs} ({num_micro} micro-batches), seq {cfg.seq_length}, "
        f"recompute {cfg.recompute}, distributed optimizer {cfg.distributed_optimizer}",
        f"> recipes.mcore: layer spec {cfg.layer_spec}",
        f"> recipes.mcore: device {device}",
        *([f"> recipes.mcore: host {host}"] if host else []),
        f"> recipes.mcore: precision {fp8}, attention backend {cfg.attention_backend}, "
        f"cpu offload layers {cfg.cpu_offloading_num_layers if cfg.cpu_offloading else 0}",
        f"> model {cfg.model}: layers {cfg.num_layers}, hidden {cfg.hidden_size}, heads "
        f"{cfg.num_attention_heads}, query groups {cfg.num_query_groups}, ffn {cfg.ffn_hidden_size}, "
        f"vocab {cfg.vocab_size}, {'swiglu' if cfg.gated else 'gelu'}; model FLOPs per step "
        f"{model_flops_per_step(cfg):.6e} (causal convention)",
    ]
    if cfg.is_moe:
        lines.append(format_moe_line(cfg))
        if cfg.moe_expert_bias:
            lines.append("> recipes.mcore: router expert bias on (aux-loss-free balancing)")
    if cfg.is_mla:
        lines.append(
            f"> recipes.mcore: multi-latent attention, q lora rank {cfg.q_lora_rank}, kv lora rank {cfg.kv_lora_rank}, "
            f"qk head dim {cfg.qk_nope_head_dim} + rope {cfg.qk_rope_head_dim}, v head dim {cfg.v_head_dim}"
        )
    return lines


def probe_line(cfg: RunConfig, rank: int, world: int, stage: int) -> str:
    """The line a probe (``--fake-process-group``) prints after the header: which rank of which job it ran."""
    return (
        f"> recipes.mcore: probe of rank {rank} of {world} (pipeline stage {stage} of {cfg.pp}) on a fake "
        f"process group: collectives skipped, compute and memory real"
    )


def format_moe_line(cfg: RunConfig) -> str:
    """The payload's MoE header line (after the model line; bench/moe_gpu_runs.py reads it back)."""
    return (
        f"> recipes.mcore: moe experts {cfg.num_experts}, top-k {cfg.moe_topk}, expert ffn {cfg.expert_ffn}, "
        f"shared expert ffn {cfg.moe_shared_expert_size}, first dense layers {cfg.moe_first_dense_layers}, "
        f"ep {cfg.ep}, etp {cfg.etp}, dispatcher {cfg.moe_dispatcher}, grouped gemm {cfg.moe_grouped_gemm}, "
        f"permute fusion {cfg.moe_permute_fusion}, capacity factor {cfg.moe_capacity_factor}, "
        f"padded {cfg.moe_pad_to_capacity}, "
        f"router {cfg.moe_router_score} {cfg.moe_load_balancing}, kv channels {cfg.head_dim}"
    )


def format_timers(times_ms: dict[str, float]) -> str:
    """Megatron-LM's timers block (``Timers.log``, option minmax) for one rank: the min and max across ranks are
    this rank's own time (ms per iteration, averaged over the log interval)."""
    lines = ["(min, max) time across ranks (ms):"]
    lines += [f"    {(name + ' ').ljust(48, '.')}: ({ms:.2f}, {ms:.2f})" for name, ms in times_ms.items()]
    return "\n".join(lines)


def format_memory_line(
    rank: int, iteration: int, allocated: int, max_allocated: int, reserved: int, max_reserved: int
) -> str:
    """Megatron-LM's ``report_memory`` line (bytes in, MiB printed with Python's float repr)."""
    mb = 1024.0 * 1024.0
    s = f"(after {iteration} iterations) memory (MB)"
    s += f" | allocated: {allocated / mb}"
    s += f" | max allocated: {max_allocated / mb}"
    s += f" | reserved: {reserved / mb}"
    s += f" | max reserved: {max_reserved / mb}"
    return f"[Rank {rank}] {s}"


@dataclass
class LossAverager:
    """Sums of per-micro-batch loss over a log interval, as Megatron's ``total_loss_dict``."""

    sums: dict[str, float] = field(default_factory=dict)
    iters: int = 0

    def add(self, losses: dict[str, float]) -> None:
        for k, v in losses.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.iters += 1

    def pop(self) -> dict[str, float]:
        out = {k: v / max(1, self.iters) for k, v in self.sums.items()}
        self.sums, self.iters = {}, 0
        return out
