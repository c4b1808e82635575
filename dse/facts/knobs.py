"""The knob catalogue: one canonical name per knob, its type, allowed values, and how payloads spell it.

The catalogue alone knows that NeMo 2 spells ``tp`` as ``trainer.strategy.tensor_model_parallel_size``
and Megatron-Bridge as ``model.tensor_model_parallel_size``; everything else (space files, CSV columns,
leaderboard, report) uses the canonical name. Environment knobs are ``env.NAME``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from dse.errors import UserError, did_you_mean
from dse.facts import hardware
from dse.recipes import contract
from dse.recipes.models import RECIPES, Recipe
from dse.recipes.nemo2.spec import FACTORY_SUFFIX as NEMO2_FACTORY_SUFFIX

ENV_PREFIX = "env."
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")  # full match: "FOO\n" is not a name
# Values that reach a shell are validated against this before quoting (belt and braces).
_ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:=/+\-]*")
# The longest environment value a space may set: settings are short (the longest real one, an allocator setting,
# is under 100 characters), and Linux refuses to start a program with one string of its environment over 128 KiB
# ("Argument list too long"), which would fail every trial of the study instead of its validation.
MAX_ENV_VALUE = 4096

# Which environment names a space may set at all is dse.facts.allowlists' (default deny).


# A knob's own spelling for one payload family: (knob, value, every value of the trial, the payload's spelling)
# -> overrides. A knob without one is spelled by its paths (:meth:`Spelling.plain`).
SpellFn = Callable[["Knob", Any, Mapping[str, Any], "Spelling"], list[str]]


@dataclass(frozen=True)
class Where:
    """What a knob's derived default may read besides the trial's knobs: the GPU, the model's hidden size and the
    payload that runs it."""

    gpu: str
    hidden_size: int
    payload: str


# A knob's derived default ("auto"): its value when a space leaves it unset (None), from the trial's other values
# and, for a rule that :func:`settle` writes into the trial, where it runs (None for a rule read where it is used).
AutoFn = Callable[[Mapping[str, Any], "Where | None"], Any]


@dataclass(frozen=True)
class Column:
    """How a calibration TSV (bench/data/h200_real_runs.tsv's format, read by ``dse.perfmodel.calibrate``) gives a knob: a
    ``required`` column, or an optional one whose empty or absent cell is ``empty`` (None: the knob's default);
    ``moe``: read from MoE rows only (a dense row runs the knob's default). An int column is refused outside the
    knob's range; a bool column reads "True" / "False"."""

    required: bool = False
    moe: bool = False
    empty: Any = None


@dataclass(frozen=True)
class Fallback:
    """The value ``dse predict`` takes instead of a recipe's default ``replaces`` for the knob that rule ``rule``
    alone rejects (when the user did not pass the knob), with the note it prints (``{payload}`` and ``{gpu}``
    filled in); a study never does this (``dse.cli.model``)."""

    rule: str
    replaces: Any
    value: Any
    note: str


@dataclass(frozen=True)
class Knob:
    """One tunable setting, with every fact about it: the catalogue entry is the only place a knob is described.

    ``kind`` is ``int`` (``minimum``, ``maximum``), ``bool``, ``choice`` (``choices``), ``modules`` (a set of
    ``choices``, written comma-joined: :func:`canonical_modules`) or ``str``. ``nemo2`` / ``mbridge`` are the
    override paths of the two payload families (several where one knob sets several fields), each set to the
    knob's value; ``spell`` maps a family ("nemo2", "mbridge") to the knob's own spelling where the value is
    spelled differently (precision, recompute, fsdp, ...).
    ``nemo2_factory`` names the NeMo 2 factory argument for a knob that touches objects a dotted override
    cannot reach (a callback in the trainer's list). ``ordinal``: its values have an order a sampler can use.
    ``recipe_layout``: a recipe's default layout sets it (``recipes.models.Recipe.default_values``).
    ``model_arg``: the field of :class:`dse.perfmodel.layout.ModelLayout` it feeds, with the knob's default, and
    so a flag of ``dse predict`` (None: the model does not read it, nor does predict take it). ``nemo2_reads``:
    the NeMo 2 paths whose value is the knob's, which an importer reads back (None: its ``nemo2`` paths).
    ``auto``: its derived default (:data:`AutoFn`), which :func:`settle` writes into a trial where ``settled``, and
    which is read where the value is used otherwise (:func:`effective`). ``moe_only``: spelled for a MoE model only
    (:data:`MOE_KNOBS`). ``column``: how a calibration TSV gives it (:class:`Column`; None: no column, the
    default). ``fallback``: what ``dse predict`` takes for a recipe default its payload cannot run (:class:`Fallback`).
    """

    name: str
    kind: str
    help: str
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None  # every int knob has one: a value past it only makes a trial absurdly long
    choices: tuple[str, ...] = ()
    nemo2: tuple[str, ...] = ()
    mbridge: tuple[str, ...] = ()
    nemo2_factory: str | None = None
    spell: Mapping[str, SpellFn] = field(default_factory=dict, hash=False)
    ordinal: bool = False
    recipe_layout: bool = False
    model_arg: str | None = None
    nemo2_reads: tuple[str, ...] | None = None
    auto: AutoFn | None = field(default=None, hash=False)
    settled: bool = False
    moe_only: bool = False
    column: Column | None = None
    fallback: Fallback | None = None

    @property
    def imported_from(self) -> tuple[str, ...]:
        """NeMo 2 config paths whose value is this knob's value (an importer maps them back to the knob)."""
        return self.nemo2 if self.nemo2_reads is None else self.nemo2_reads

    def coerce(self, value: Any, *, file: str | None = None, field: str | None = None) -> Any:
        """Validate one value; return it in canonical form or raise :class:`UserError`."""
        field = field or self.name
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(
                    f"{value!r} is not an integer; {self.name} takes integers >= {self.minimum}", file=file, field=field
                )
            if self.minimum is not None and value < self.minimum:
                raise UserError(
                    f"{value} is out of range; {self.name} must be >= {self.minimum}", file=file, field=field
                )
            if self.maximum is not None and value > self.maximum:
                raise UserError(
                    f"{value} is out of range; {self.name} must be <= {self.maximum}", file=file, field=field
                )
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise UserError(f"{value!r} is not a boolean; {self.name} takes true or false", file=file, field=field)
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise UserError(
                    f"{value!r} is not allowed{did_you_mean(str(value), self.choices)}; "
                    f"{self.name} takes one of {', '.join(self.choices)}",
                    file=file,
                    field=field,
                )
            return value
        if self.kind == "modules":
            return canonical_modules(value, self, file=file, field=field)
        return self._env_text(value, file=file, field=field)

    def _env_text(self, value: Any, *, file: str | None, field: str | None) -> str:
        """An environment value: the characters that can never start a shell expansion, at most
        :data:`MAX_ENV_VALUE` of them; a number as its text, but nan and inf are no setting a program reads."""
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(
                f"{value!r} is not allowed; {self.name} takes a finite number or text", file=file, field=field
            )
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_ENV_VALUE:
            value = "9" * (MAX_ENV_VALUE + 1)  # its text would be too long (and str() refuses past 4,300 digits)
        text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        if isinstance(text, str) and len(text) > MAX_ENV_VALUE:
            raise UserError(
                f"a value of {len(text):,} characters; {self.name} takes at most {MAX_ENV_VALUE:,} (the kernel "
                "refuses to start a program whose environment holds one far longer)",
                file=file,
                field=field,
            )
        if not isinstance(text, str) or not _ENV_VALUE.fullmatch(text):
            raise UserError(
                f"{str(value)[:80]!r} is not allowed; {self.name} takes letters, digits and _.,:=/+-",
                file=file,
                field=field,
            )
        return text


# Upper bounds of the int knobs: far beyond any real job (the largest runs have ~10^5 GPUs, ~10^3 layers,
# contexts of ~10^6 tokens), low enough that no value makes a simulated log or a step time unbounded.
PARALLEL_MAX = 2**16
BATCH_MAX = 2**24
LAYERS_MAX = 10_000
NODES_MAX = 100_000
STEPS_MAX = 1_000_000


def spell_value(value: Any) -> str:
    """A knob's value as a space file and the payloads' overrides write it: ``null``, ``true`` / ``false``, else
    ``str``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Megatron-Core's fine-grained recompute modules (TransformerConfig.recompute_modules, megatron/core/transformer/
# transformer_config.py; read only with recompute_granularity="selective"; None there means ["core_attn"]), in
# that file's order. Its other names (gdn_norm_out, gdp_in_proj, gdp_qkv, mhc) belong to architectures dse has not.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = "core_attn"


def canonical_modules(
    value: Any, knob: Knob | None = None, *, file: str | None = None, field: str | None = None
) -> str:
    """A set of recompute modules as one canonical string: the names comma-joined in Megatron-Core's order, each
    once (``"mlp,core_attn"`` and ``["core_attn", "mlp"]`` are both ``"core_attn,mlp"``), so that a space lists a
    combination as one value; a :class:`UserError` names an unknown module and the allowed ones."""
    name = knob.name if knob else "recompute_modules"
    allowed = knob.choices if knob else RECOMPUTE_MODULES
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise UserError(
            f"{value!r} is not a list of modules; {name} takes comma-joined names from {', '.join(allowed)}",
            file=file,
            field=field or name,
        )
    names = {i.strip() for i in items if i.strip()}
    unknown = sorted(names - set(allowed))
    if unknown or not names:
        what = f"{unknown[0]!r} is not a module{did_you_mean(unknown[0], allowed)}" if unknown else "no module given"
        raise UserError(
            f"{what}; {name} takes comma-joined names from {', '.join(allowed)}", file=file, field=field or name
        )
    return ",".join(m for m in allowed if m in names)


@dataclass(frozen=True)
class Spelling:
    """How one payload family spells overrides: which of a knob's paths it writes (``paths``), the key of the
    knobs' own spellings (``family``), and where Megatron-Core's model config (``model``) and the pipeline-split
    fields (``strategy``) sit in its config tree."""

    family: str
    paths: Callable[[Knob], tuple[str, ...]]
    model: str
    strategy: str

    def plain(self, knob: Knob, value: Any) -> list[str]:
        """Every path of ``knob`` set to ``value``; an unresolved "auto" boolean (None, settled by
        ``dse.rules.trial.resolve_auto``) is left to the payload's own default."""
        if value is None and knob.kind == "bool":
            return []
        return [f"{p}={spell_value(value)}" for p in self.paths(knob)]

    def spell(self, knob: Knob, value: Any, values: Mapping[str, Any]) -> list[str]:
        """``knob`` = ``value`` (with the trial's other ``values``) in this family's overrides."""
        own = knob.spell.get(self.family)
        return own(knob, value, values, self) if own else self.plain(knob, value)


NEMO2 = Spelling("nemo2", attrgetter("nemo2"), model="model.config.", strategy="trainer.strategy.")
MBRIDGE = Spelling("mbridge", attrgetter("mbridge"), model="model.", strategy="model.")
FLAVOURS = contract.PAYLOADS
# The simulated trainer (sim) takes NeMo 2's spelling, so that it exercises the same command line; the
# megatron-core payload (recipes.mcore) accepts Bridge's override paths, so that the same trial runs on a GPU
# without NeMo or Bridge.
SPELLINGS: dict[str, Spelling] = {"nemo2": NEMO2, "sim": NEMO2, "mbridge": MBRIDGE, "mcore": MBRIDGE}
BRIDGE_SPELLING = tuple(f for f, s in SPELLINGS.items() if s is MBRIDGE)


# --- knobs' own spellings ------------------------------------------------------------------------------------
# NeMo 2 precision: fields of MegatronMixedPrecision as NeMo's own plugin factories set them
# (nemo.collections.llm.recipes.precision.mixed_precision): bf16_with_fp8_mixed (delayed),
# bf16_with_fp8_current_scaling_mixed (tensorwise; first/last layers kept in fp8 as NVIDIA's performance scripts
# do), bf16_with_mxfp8_mixed, bf16_with_fp8_subchannel_scaling_mixed (blockwise). The recipe's base plugin is
# bf16_mixed, so bf16 needs no override (and cannot clear fp8 by one: nemo-run reads "null" for the str-typed
# MegatronMixedPrecision.fp8 as the string "null", which would switch FP8 on).
_P = "trainer.plugins."
# The one spelling of bf16 training: the precision knob's default, its value in the spelling tables and the model.
BF16 = "bf16"
NEMO2_PRECISION: dict[str, tuple[str, ...]] = {
    BF16: (),
    "delayed": (
        _P + "fp8=hybrid",
        _P + "fp8_recipe=delayed",
        _P + "fp8_margin=0",
        _P + "fp8_amax_history_len=1024",
        _P + "fp8_amax_compute_algo=max",
        _P + "fp8_param_gather=true",
    ),
    "tensorwise": (
        _P + "fp8=hybrid",
        _P + "fp8_recipe=tensorwise",
        _P + "first_last_layers_bf16=false",
        _P + "fp8_param_gather=true",
    ),
    "mxfp8": (
        _P + "fp8=e4m3",
        _P + "fp8_recipe=mxfp8",
        _P + "fp8_param_gather=true",
        _P + "reuse_grad_buf_for_mxfp8_param_ag=true",
    ),
    "blockwise": (_P + "fp8=hybrid", _P + "fp8_recipe=blockwise", _P + "fp8_param_gather=false"),
    # NVFP4: the fields of Megatron-Bridge's bf16_with_nvfp4_mixed (Megatron-Core's fp4 / fp4_recipe), for the sim
    # payload, which takes NeMo 2's spelling; NeMo 2 itself has no FP4 plugin factory, so the nemo2 payload
    # refuses precision=nvfp4 (dse.rules.constraints.nvfp4_payload)
    "nvfp4": (_P + "fp4=e2m1", _P + "fp4_recipe=nvfp4", _P + "fp8_param_gather=false"),
}
# Megatron-Bridge: a mixed-precision recipe by name (megatron.bridge.training.mixed_precision); the payload's
# entry point resolves it, as Bridge's ConfigContainer does for a string.
MBRIDGE_PRECISION: dict[str, str] = {
    BF16: "bf16_mixed",
    "delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "tensorwise": "bf16_with_fp8_current_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
    # fp4="e2m1", fp4_recipe="nvfp4", fp8=None, fp8_param_gather=False: what NVIDIA's Bridge performance recipes
    # run as compute dtype "nvfp4" (megatron/bridge/perf_recipes/_common.py _perf_precision, Bridge 26.x)
    "nvfp4": "bf16_with_nvfp4_mixed",
}
# Megatron FSDP on Bridge: NVIDIA's set_megatron_fsdp_overrides (scripts/performance/utils/helpers.py).
MBRIDGE_FSDP = (
    "ddp.use_megatron_fsdp=true",
    "ddp.data_parallel_sharding_strategy=optim_grads_params",
    "ddp.average_in_collective=false",
    "model.init_model_with_meta_device=true",
    "optimizer.use_precision_aware_optimizer=false",
)
MBRIDGE_WARMUP_ITERS = 10  # learning-rate warm-up of NVIDIA's Bridge performance runs (set_common_perf_overrides)


def _spelled_by(lead: str, knob: Knob, values: Mapping[str, Any]) -> bool:
    """Whether ``knob`` is spelled by the knob ``lead`` it shares its fields with (spelled once, at the lead)."""
    return knob.name != lead and lead in values


def _precision_key(values: Mapping[str, Any]) -> str:
    """The precision recipe a trial runs: bf16, nvfp4 (which ignores ``fp8_recipe``), or the FP8 recipe."""
    precision = effective("precision", values)
    if precision in (BF16, "nvfp4"):
        return str(precision)
    return str(effective("fp8_recipe", values))


def _nemo2_precision(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    return [] if _spelled_by("precision", knob, values) else list(NEMO2_PRECISION[_precision_key(values)])


def _mbridge_precision(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    if _spelled_by("precision", knob, values):
        return []
    return [f"mixed_precision={MBRIDGE_PRECISION[_precision_key(values)]}"]


def _recompute(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    """Recompute granularity, method and layer count together: none/selective clear the method and count;
    full recomputes every layer (uniform, 1 layer per chunk) or the first N layers of each stage (block, N)."""
    if _spelled_by("recompute", knob, values):
        return []
    mode = effective("recompute", values)
    n = effective("recompute_num_layers", values) or 0
    prefix = sp.model
    if mode == "full":
        method, layers = ("block", n) if n > 0 else ("uniform", 1)
        return [
            f"{prefix}recompute_granularity=full",
            f"{prefix}recompute_method={method}",
            f"{prefix}recompute_num_layers={layers}",
        ]
    granularity = None if mode == "none" else mode
    out = [
        f"{prefix}recompute_granularity={spell_value(granularity)}",
        f"{prefix}recompute_method=null",
        f"{prefix}recompute_num_layers=null",
    ]
    modules = canonical_modules(effective("recompute_modules", values))
    if mode == "selective" and modules != DEFAULT_RECOMPUTE_MODULES:
        out.append(f"{prefix}recompute_modules={_spell_list(modules.split(','), sp)}")
    return out


def _spell_list(items: list[str], sp: Spelling) -> str:
    """A list of names as the family's override parser reads it: a Python literal for nemo-run (NeMo 2's CLI
    parses values with ``ast.literal_eval``), Hydra's list syntax for Megatron-Bridge (``[a,b]``), as their
    performance scripts' ``--recompute_modules`` lists arrive in ``model.config.recompute_modules`` /
    ``model.recompute_modules``."""
    if sp.family == "nemo2":
        return "[" + ",".join(repr(i) for i in items) + "]"
    return "[" + ",".join(items) + "]"


def _cpu_offload(knob: Knob, n: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    """Megatron-Core's activation offloading (``ModelParallelConfig.cpu_offloading*``): on for ``n`` layers,
    activations only (weights stay on the GPU); 0 switches it off explicitly, so that a recipe's own setting
    never disagrees with the trial."""
    prefix = sp.model
    if not n:
        return [f"{prefix}cpu_offloading=false", f"{prefix}cpu_offloading_num_layers=0"]
    return [
        f"{prefix}cpu_offloading=true",
        f"{prefix}cpu_offloading_num_layers={n}",
        f"{prefix}cpu_offloading_activations=true",
        f"{prefix}cpu_offloading_weights=false",
    ]


def _vp(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    # no interleaving is spelled null, as NVIDIA's set_primary_perf_configs does
    return sp.plain(knob, None if value == 1 else value)


def _sp(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    if value is None:
        if "tp" not in values:
            return []
        value = effective(knob.name, values)
    return sp.plain(knob, value)


# --- derived defaults ("auto") ----------------------------------------------------------------------------------
def _sp_auto(values: Mapping[str, Any], where: Where | None) -> bool:
    """Sequence parallelism left unset: on exactly when tensor parallel, as NVIDIA's recipes set it; the trial keeps
    None (its recorded point), read as this wherever it is used."""
    return bool(values["tp"] > 1)


def _tp_comm_overlap_auto(values: Mapping[str, Any], where: Where | None) -> bool:
    """TP communication overlap left unset: on exactly when tp > 1 with sequence parallelism and the payload ships a
    userbuffer config that NVIDIA's scripts use for (GPU, precision, hidden size, tp), as NeMo's and
    Megatron-Bridge's performance recipes turn it on (``dse.facts.hardware.userbuffer_config``), and never under NVFP4,
    which those scripts run without it (``dse.rules.constraints.nvfp4_no_tp_comm_overlap``). Without ``where`` (a layout
    the model is given directly) it is off."""
    tp, precision = values["tp"], values["precision"]
    return bool(
        where is not None
        and tp > 1
        and precision != "nvfp4"
        and effective("sp", values)
        and hardware.userbuffer_config(where.gpu, precision, where.hidden_size, tp, where.payload) is not None
    )


def _unless_default(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    # the default is the recipe's own setting (attention auto: Transformer Engine picks; overlap_param_gather: the
    # recipes' True), spelled by nothing, so the scripts stay as they were
    return [] if value == knob.default else sp.plain(knob, value)


def _mbridge_fsdp(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    return list(MBRIDGE_FSDP) if value else sp.plain(knob, value)


def _mbridge_max_steps(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    warmup = MBRIDGE_WARMUP_ITERS if value > MBRIDGE_WARMUP_ITERS else 0
    return [*sp.plain(knob, value), f"scheduler.lr_decay_iters={value}", f"scheduler.lr_warmup_iters={warmup}"]


# CUDA graphs. Megatron-Core's TransformerConfig (megatron/core/transformer/transformer_config.py, core_v0.16.0):
# ``cuda_graph_impl`` none | local (Megatron-Core's own CudaGraphManager: per-layer graphs, or with scope
# full_iteration one graph of the whole forward-backward) | transformer_engine (TE's make_graphed_callables, per
# layer); ``cuda_graph_scope`` a list of CudaGraphScope names, "full" (deprecated, the default) or empty meaning
# the whole layer. dse offers the scope as a choice of the combinations NVIDIA's scripts use (Megatron-Bridge
# scripts/performance/configs/*_workload_base_configs.py @ df0289c18: "full_iteration", "mlp", ["attn",
# "moe_router", "moe_preprocess"], ["moe_router", "moe_preprocess"], ["mamba", "attn"], ["mamba"], []) plus the
# single scopes Megatron-Core documents, each a comma-joined name: a sampler sees a handful of values instead of
# every subset, and each value is one Megatron-Core accepts as it stands (no "moe" with "moe_router").
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine")
CUDA_GRAPH_SCOPES = (
    "full",
    "full_iteration",
    "attn",
    "mlp",
    "attn,mlp",
    "moe",
    "moe_router",
    "moe_router,moe_preprocess",
    "attn,moe_router,moe_preprocess",
    "mamba",
    "mamba,attn",
)
# What Bridge's performance scripts set with a graph (scripts/performance/utils/overrides.py
# _set_cuda_graph_overrides @ df0289c18): TE's RNG tracker in the model and the rng config, which graph capture
# needs (Megatron-LM's arguments.py turns it on itself); with full_iteration, the NaN checks off
# (Bridge's ConfigContainer.validate asserts rerun_state_machine.check_for_nan_in_loss=False; Megatron-LM's
# arguments.py asks for --no-check-for-nan-in-loss-and-grad), as _set_common_perf_overrides sets for every run.
MBRIDGE_GRAPH = ("model.use_te_rng_tracker=true", "rng.te_rng_tracker=true")
MBRIDGE_FULL_ITERATION = ("rerun_state_machine.check_for_nan_in_loss=false", "ddp.check_for_nan_in_grad=false")
# NeMo 2: its performance scripts (scripts/performance/helpers.py set_cuda_graph_configs) spell a graph as
# enable_cuda_graph (Megatron-Core's deprecated flag for cuda_graph_impl="local", whole-layer scope) with TE's RNG
# tracker; nothing else (dse.rules.constraints.cuda_graph_payload refuses what NeMo 2 cannot express this way).
NEMO2_GRAPH = ("model.config.enable_cuda_graph=true", "trainer.strategy.use_te_rng_tracker=true")


def _cuda_graph(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    """The graph implementation and scope together, as each family's performance scripts spell them; ``none``
    (the recipes' own default: Bridge's ``cuda_graph_impl="none"``, NeMo's ``enable_cuda_graph=False``) adds
    nothing, so that ungraphed command lines stay as they were."""
    if _spelled_by("cuda_graph", knob, values):
        return []
    impl = effective("cuda_graph", values)
    if impl == "none":
        return []
    if sp.family == "nemo2":
        return list(NEMO2_GRAPH)
    scope = effective("cuda_graph_scope", values)
    names = "" if scope == "full" else scope  # "full": the whole layer, an empty list since core 0.16
    out = [f"model.cuda_graph_impl={impl}", f"model.cuda_graph_scope=[{names}]", *MBRIDGE_GRAPH]
    return out + list(MBRIDGE_FULL_ITERATION) if scope == "full_iteration" else out


def _nccl_ub(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    """NCCL user-buffer registration of the data-parallel buffers, with what NVIDIA's performance scripts set
    beside it; off spells nothing (the recipes' default, ``DistributedDataParallelConfig.nccl_ub=False``).

    Megatron-Bridge (``scripts/performance/utils/overrides.py``, ``_set_nccl_ub_overrides``, 26.02-26.06):
    ``ddp.nccl_ub=true`` and ``ddp.average_in_collective=false`` (NCCL's symmetric kernels have no AVG
    reduction), with Megatron FSDP also ``ddp.fsdp_manual_registration=true``; and the double buffer the FSDP
    registration needs (Megatron-Core's ``DistributedDataParallelConfig.fsdp_double_buffer``: "necessary ... to
    register user buffer (nccl_ub=True) for the Megatron FSDP"; Megatron-LM's arguments.py sets both with
    --use-nccl-ub). NeMo 2 (``scripts/performance/helpers.py``, ``set_perf_optimization_configs``):
    ``trainer.strategy.ddp.nccl_ub`` and, with FSDP, ``trainer.strategy.ddp.fsdp_double_buffer``."""
    if not value:
        return []
    fsdp = bool(values.get("fsdp"))
    if sp.family == "nemo2":
        return ["trainer.strategy.ddp.nccl_ub=true"] + (
            ["trainer.strategy.ddp.fsdp_double_buffer=true"] if fsdp else []
        )
    out = ["ddp.nccl_ub=true", "ddp.average_in_collective=false"]
    return out + (["ddp.fsdp_manual_registration=true", "ddp.fsdp_double_buffer=true"] if fsdp else [])


# --- mixture of experts ---------------------------------------------------------------------------------------
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
# flex: Megatron-Core's MoEFlexTokenDispatcher. Megatron-Bridge picks its kernels by moe_flex_dispatcher_backend
# (megatron/bridge/training/flex_dispatcher_backend.py apply_flex_dispatcher_backend, which also clears
# moe_shared_expert_overlap); NVIDIA's Bridge presets name "hybridep" throughout
# (scripts/performance/configs/*/*_workload_base_configs.py). NeMo 2 enables DeepEP as its performance scripts do
# (scripts/performance/llm/pretrain_deepseek_v3.py: moe_enable_deepep, moe_shared_expert_overlap=False).
FLEX_BACKEND = "hybridep"


def _moe_dispatcher(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    out = sp.plain(knob, value)
    if value != "flex":
        return out
    if sp.family == "nemo2":
        return [*out, f"{sp.model}moe_enable_deepep=true", f"{sp.model}moe_shared_expert_overlap=false"]
    return [*out, f"{sp.model}moe_flex_dispatcher_backend={FLEX_BACKEND}", f"{sp.model}moe_shared_expert_overlap=false"]


def _moe_a2a_overlap(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    """The expert all-to-all overlapped with computation: Megatron-Bridge's _set_moe_a2a_overlap_overrides
    (scripts/performance/utils/overrides.py) also delays the weight-gradient GEMMs and clears the shared-expert
    overlap; both are TransformerConfig fields (overlap_moe_expert_parallel_comm, delay_wgrad_compute)."""
    out = sp.plain(knob, value)
    if not value:
        return out
    lead = "comm_overlap." if sp.family == "mbridge" else sp.model
    return [*out, f"{lead}delay_wgrad_compute=true", f"{sp.model}moe_shared_expert_overlap=false"]


def _moe_token_drop(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    """Token drop as NVIDIA's performance scripts set it: a capacity factor of 1.0 with each expert's input padded
    to it (Megatron-Bridge's ``apply_moe_token_drop``, megatron/bridge/training/utils/moe_token_drop.py, which the
    25.09 scripts applied to Qwen3 and to DeepSeek-V3 on Blackwell; NeMo 2's ``MegatronTokenDropCallback`` sets the
    same two fields). Off spells nothing: every recipe dse launches is dropless (their model configs leave
    ``moe_expert_capacity_factor`` unset; the token drop is the scripts' separate step), so a dropless space's
    scripts stay as they were."""
    if not value:
        return []
    return [f"{sp.model}moe_expert_capacity_factor=1.0", f"{sp.model}moe_pad_expert_input_to_capacity=true"]


def _stage_layers(knob: Knob, value: Any, values: Mapping[str, Any], sp: Spelling) -> list[str]:
    # spelled with the rest of the pipeline split, which needs the architecture: pipeline_split_overrides
    return []


def _both(fn: SpellFn) -> dict[str, SpellFn]:
    return {"nemo2": fn, "mbridge": fn}


# --- the catalogue -------------------------------------------------------------------------------------------
def _int(
    name: str,
    help: str,
    default: int,
    minimum: int = 1,
    nemo2=(),
    mbridge=(),
    maximum: int = PARALLEL_MAX,
    **facts: Any,
) -> Knob:
    """An int knob; ordinal unless ``facts`` says otherwise (a count or a size: its values have an order)."""
    return Knob(
        name,
        "int",
        help,
        default,
        minimum=minimum,
        maximum=maximum,
        nemo2=tuple(nemo2),
        mbridge=tuple(mbridge),
        **{"ordinal": True, **facts},
    )


ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
_S = "trainer.strategy."
_M = "model.config."
_OFFLOAD = ("cpu_offloading", "cpu_offloading_num_layers", "cpu_offloading_activations", "cpu_offloading_weights")
_LAYOUT = dict(recipe_layout=True)
_REQUIRED = Column(required=True)  # a calibration TSV's required column (dse.perfmodel.calibrate)
_MOE_COLUMN = Column(
    moe=True
)  # a calibration TSV's column read in MoE rows  # the recipe's default layout sets it (recipes.models.Recipe.default_values)
CATALOGUE: dict[str, Knob] = {
    k.name: k
    for k in (
        _int(
            "tp",
            "tensor-parallel size",
            1,
            nemo2=[_S + "tensor_model_parallel_size"],
            mbridge=["model.tensor_model_parallel_size"],
            model_arg="tp",
            column=_REQUIRED,
            **_LAYOUT,
        ),
        _int(
            "pp",
            "pipeline-parallel size",
            1,
            nemo2=[_S + "pipeline_model_parallel_size"],
            mbridge=["model.pipeline_model_parallel_size"],
            model_arg="pp",
            column=_REQUIRED,
            **_LAYOUT,
        ),
        _int(
            "vp",
            "virtual-pipeline (interleaving) size; 1 = no interleaving",
            1,
            nemo2=[_S + "virtual_pipeline_model_parallel_size"],
            mbridge=["model.virtual_pipeline_model_parallel_size"],
            spell=_both(_vp),
            model_arg="vp",
            **_LAYOUT,
        ),
        _int(
            "cp",
            "context-parallel size",
            1,
            nemo2=[_S + "context_parallel_size"],
            mbridge=["model.context_parallel_size"],
            model_arg="cp",
            **_LAYOUT,
        ),
        _int(
            "ep",
            "expert-parallel size: the GPUs each MoE layer's experts are spread over (dense models: 1)",
            1,
            nemo2=[_S + "expert_model_parallel_size"],
            mbridge=["model.expert_model_parallel_size"],
            **_LAYOUT,
            model_arg="ep",
            column=_MOE_COLUMN,
        ),
        _int(
            "etp",
            "expert tensor-parallel size: the tensor-parallel split of each expert (MoE models only)",
            1,
            nemo2=[_S + "expert_tensor_parallel_size"],
            mbridge=["model.expert_tensor_parallel_size"],
            **_LAYOUT,
            model_arg="etp",
            column=_MOE_COLUMN,
            moe_only=True,
        ),
        Knob(
            "moe_dispatcher",
            "choice",
            "MoE token dispatcher: alltoall, allgather, or flex (HybridEP / DeepEP kernels; MoE models only)",
            "alltoall",
            choices=MOE_DISPATCHERS,
            nemo2=(_M + "moe_token_dispatcher_type",),
            mbridge=("model.moe_token_dispatcher_type",),
            spell=_both(_moe_dispatcher),
            recipe_layout=True,
            model_arg="moe_dispatcher",
            # the MoE recipes' layouts are Megatron-Bridge's presets, whose flex is HybridEP; NeMo 2 spells flex as
            # DeepEP, which does not run on GB200/GB300, and NeMo's own performance scripts use alltoall there
            fallback=Fallback(
                "moe_dispatcher_supported",
                "flex",
                "alltoall",
                "(Megatron-Bridge's HybridEP preset) replaced by alltoall: the {payload} payload's flex dispatcher "
                "does not run on {gpu}, and NeMo's scripts use alltoall there",
            ),
            column=_MOE_COLUMN,
            moe_only=True,
        ),
        Knob(
            "moe_grouped_gemm",
            "bool",
            "run a stage's experts as one grouped GEMM rather than one GEMM per expert (MoE models only)",
            True,
            nemo2=(_M + "moe_grouped_gemm",),
            mbridge=("model.moe_grouped_gemm",),
            recipe_layout=True,
            model_arg="moe_grouped_gemm",
            column=_MOE_COLUMN,
            moe_only=True,
        ),
        Knob(
            "moe_a2a_overlap",
            "bool",
            "overlap the expert all-to-all with another micro-batch's computation (MoE models only)",
            False,
            nemo2=(_M + "overlap_moe_expert_parallel_comm",),
            mbridge=("comm_overlap.overlap_moe_expert_parallel_comm",),
            spell=_both(_moe_a2a_overlap),
            recipe_layout=True,
            model_arg="moe_a2a_overlap",
            moe_only=True,
        ),
        Knob(
            "moe_token_drop",
            "bool",
            "drop the tokens beyond each expert's capacity (capacity factor 1.0) and pad every expert's input to it, "
            "as NVIDIA's token-drop benchmarks do: static shapes, no host sync in the dispatch (MoE models only; the "
            "alltoall dispatcher)",
            False,
            nemo2=(_M + "moe_expert_capacity_factor", _M + "moe_pad_expert_input_to_capacity"),
            mbridge=("model.moe_expert_capacity_factor", "model.moe_pad_expert_input_to_capacity"),
            spell=_both(_moe_token_drop),
            model_arg="moe_token_drop",
            column=_MOE_COLUMN,
            moe_only=True,
        ),
        Knob(
            "moe_permute_fusion",
            "bool",
            "fused token permutation and unpermutation kernels (MoE models only)",
            False,
            nemo2=(_M + "moe_permute_fusion",),
            mbridge=("model.moe_permute_fusion",),
            recipe_layout=True,
            model_arg="moe_permute_fusion",
            column=_MOE_COLUMN,
            moe_only=True,
        ),
        _int(
            "pp_first_layers",
            "decoder layers on the first pipeline stage (0 = an even split)",
            0,
            minimum=0,
            maximum=LAYERS_MAX,
            nemo2=[_S + "num_layers_in_first_pipeline_stage"],
            mbridge=["model.num_layers_in_first_pipeline_stage"],
            spell=_both(_stage_layers),
            **_LAYOUT,
            model_arg="pp_first_layers",
        ),
        _int(
            "pp_last_layers",
            "decoder layers on the last pipeline stage (0 = an even split)",
            0,
            minimum=0,
            maximum=LAYERS_MAX,
            nemo2=[_S + "num_layers_in_last_pipeline_stage"],
            mbridge=["model.num_layers_in_last_pipeline_stage"],
            spell=_both(_stage_layers),
            **_LAYOUT,
            model_arg="pp_last_layers",
        ),
        Knob(
            "sp",
            "bool",
            "sequence parallelism (default: on when tp > 1)",
            None,
            nemo2=(_S + "sequence_parallel",),
            mbridge=("model.sequence_parallel",),
            spell=_both(_sp),
            model_arg="sp",
            auto=_sp_auto,
        ),
        _int(
            "mbs",
            "micro-batch size",
            1,
            nemo2=["data.micro_batch_size"],
            mbridge=["train.micro_batch_size"],
            model_arg="mbs",
            column=_REQUIRED,
            **_LAYOUT,
        ),
        _int(
            "gbs",
            "global batch size",
            128,
            maximum=BATCH_MAX,
            nemo2=["data.global_batch_size"],
            mbridge=["train.global_batch_size"],
            model_arg="gbs",
            column=_REQUIRED,
            **_LAYOUT,
        ),
        _int(
            "seq_length",
            "sequence length",
            8192,
            minimum=2,
            maximum=BATCH_MAX,
            nemo2=["data.seq_length", "model.config.seq_length"],
            mbridge=["model.seq_length", "dataset.sequence_length"],
            model_arg="seq_length",
            column=_REQUIRED,
            **_LAYOUT,
        ),
        Knob(
            "recompute",
            "choice",
            "activation recompute",
            "none",
            choices=("none", "selective", "full"),
            nemo2=("model.config.recompute_granularity",),
            mbridge=("model.recompute_granularity",),
            spell=_both(_recompute),
            model_arg="recompute",
            column=_REQUIRED,
            recipe_layout=True,
        ),
        _int(
            "recompute_num_layers",
            "layers per stage recomputed under full recompute (0 = all)",
            0,
            minimum=0,
            maximum=LAYERS_MAX,
            nemo2=["model.config.recompute_num_layers"],
            mbridge=["model.recompute_num_layers"],
            spell=_both(_recompute),
            model_arg="recompute_num_layers",
        ),
        # a set of modules, one value of a space: the names comma-joined ("core_attn,mlp"), in any order, each from
        # Megatron-Core's list; read with recompute=selective only (the rule recompute_modules_need_selective)
        Knob(
            "recompute_modules",
            "modules",
            "modules recomputed under recompute=selective, comma-joined (Megatron-Core's recompute_modules; "
            "default core_attn, its own)",
            DEFAULT_RECOMPUTE_MODULES,
            choices=RECOMPUTE_MODULES,
            nemo2=("model.config.recompute_modules",),
            mbridge=("model.recompute_modules",),
            spell=_both(_recompute),
            model_arg="recompute_modules",
            recipe_layout=True,
        ),
        Knob(
            "precision",
            "choice",
            "training precision: bf16, fp8 (its scaling recipe is fp8_recipe) or nvfp4 (Blackwell's 4-bit "
            "E2M1 with 16-element E4M3 block scales; fp8_recipe is ignored)",
            BF16,
            choices=(BF16, "fp8", "nvfp4"),
            nemo2=("trainer.plugins",),
            mbridge=("mixed_precision",),
            nemo2_reads=(),
            spell={"nemo2": _nemo2_precision, "mbridge": _mbridge_precision},
            model_arg="precision",
            column=Column(),
        ),
        Knob(
            "fp8_recipe",
            "choice",
            "FP8 scaling recipe (precision=fp8; ignored with bf16 and nvfp4)",
            "tensorwise",
            choices=("delayed", "tensorwise", "mxfp8", "blockwise"),
            nemo2=("trainer.plugins",),
            mbridge=("mixed_precision",),
            nemo2_reads=(),
            spell={"nemo2": _nemo2_precision, "mbridge": _mbridge_precision},
            model_arg="fp8_recipe",
            column=Column(),
        ),
        Knob(
            "fsdp",
            "bool",
            "Megatron FSDP instead of the distributed optimizer",
            False,
            nemo2=(),
            mbridge=("ddp.use_megatron_fsdp",),
            nemo2_factory="fsdp",
            spell={"mbridge": _mbridge_fsdp},
            model_arg="fsdp",
            recipe_layout=True,
        ),
        Knob(
            "tp_comm_overlap",
            "bool",
            "overlap TP collectives with GEMMs (userbuffers); default: on when tp > 1 "
            "with sp and the payload ships a userbuffer config NVIDIA's scripts use for the layout",
            None,
            nemo2=(),
            mbridge=("comm_overlap.tp_comm_overlap",),
            nemo2_factory="tp_comm_overlap",
            model_arg="tp_comm_overlap",
            auto=_tp_comm_overlap_auto,
            settled=True,
        ),
        Knob(
            "nccl_ub",
            "bool",
            "register the data-parallel (DP/FSDP) buffers with NCCL (user buffers): zero-copy collectives on "
            "few SMs (Megatron-Core's ddp nccl_ub)",
            False,
            nemo2=("trainer.strategy.ddp.nccl_ub",),
            mbridge=("ddp.nccl_ub",),
            spell=_both(_nccl_ub),
            model_arg="nccl_ub",
        ),
        # Megatron-Core's DistributedDataParallelConfig.overlap_param_gather (default False there); NeMo 2's and
        # Megatron-Bridge's pretraining recipes set it True (their DistributedDataParallelConfig)
        Knob(
            "overlap_param_gather",
            "bool",
            "overlap the distributed optimizer's weight all-gather with the next step's forward (Megatron-Core's "
            "ddp overlap_param_gather); off: the weights are gathered right after the optimizer step",
            True,
            nemo2=(_S + "ddp.overlap_param_gather",),
            mbridge=("ddp.overlap_param_gather",),
            spell=_both(_unless_default),
            model_arg="overlap_param_gather",
        ),
        # the one NeMo 2 field of the offloading spelling that carries the value is what an importer reads back
        _int(
            "cpu_offload_layers",
            "transformer layers whose activations are offloaded to host memory (0 = off)",
            0,
            minimum=0,
            maximum=LAYERS_MAX,
            nemo2=[_M + f for f in _OFFLOAD],
            mbridge=["model." + f for f in _OFFLOAD],
            spell=_both(_cpu_offload),
            nemo2_reads=(_M + "cpu_offloading_num_layers",),
            model_arg="cpu_offload_layers",
            column=Column(),
            **_LAYOUT,
        ),
        # Megatron-Core's AttnBackend (megatron/core/transformer/enums.py): auto lets Transformer Engine pick (flash
        # or cuDNN fused), unfused is TE's unfused DotProductAttention, local Megatron's own (no TE). NeMo 2: a factory
        # argument, because nemo-run's CLI cannot parse an enum-typed field (model.config.attention_backend=flash
        # fails with "Unsupported type: <enum 'AttnBackend'>"); Megatron-Bridge: the model field.
        Knob(
            "attention_backend",
            "choice",
            "attention kernel (Megatron-Core AttnBackend)",
            "auto",
            choices=ATTENTION_BACKENDS,
            nemo2=(),
            mbridge=("model.attention_backend",),
            nemo2_factory="attention_backend",
            spell=_both(_unless_default),
            model_arg="attention_backend",
            column=Column(empty="local"),  # the calibration runs' local layer spec
        ),
        Knob(
            "cuda_graph",
            "choice",
            "CUDA graph implementation (Megatron-Core cuda_graph_impl): none, local (Megatron-Core's, per layer or "
            "the full iteration) or transformer_engine (TE's make_graphed_callables, per layer)",
            "none",
            choices=CUDA_GRAPH_IMPLS,
            nemo2=("model.config.enable_cuda_graph", "trainer.strategy.use_te_rng_tracker"),
            mbridge=("model.cuda_graph_impl", "model.use_te_rng_tracker", "rng.te_rng_tracker"),
            nemo2_reads=(),
            spell=_both(_cuda_graph),
            model_arg="cuda_graph",
        ),
        Knob(
            "cuda_graph_scope",
            "choice",
            "what a CUDA graph captures (Megatron-Core cuda_graph_scope, comma-joined): full (the whole layer), "
            "full_iteration (local only: the whole forward-backward), or the layer's parts NVIDIA's scripts graph",
            "full",
            choices=CUDA_GRAPH_SCOPES,
            nemo2=("model.config.enable_cuda_graph",),
            mbridge=("model.cuda_graph_scope",),
            nemo2_reads=(),
            spell=_both(_cuda_graph),
            model_arg="cuda_graph_scope",
        ),
        # the model reads the world size (num_nodes x the system's GPUs per node), not the node count
        _int("num_nodes", "nodes in the job", 1, maximum=NODES_MAX, nemo2=["trainer.num_nodes"], mbridge=[]),
        _int(
            "max_steps",
            "training steps per trial",
            50,
            maximum=STEPS_MAX,
            nemo2=["trainer.max_steps"],
            mbridge=["train.train_iters"],
            spell={"mbridge": _mbridge_max_steps},
            ordinal=False,
        ),
    )
}


# The knobs only a MoE recipe spells: a dense recipe's scripts carry none of them (:func:`overrides`), so
# that they stay as they were before MoE support. ``ep`` is spelled for every recipe, as it always was.
MOE_KNOBS = frozenset(n for n, k in CATALOGUE.items() if k.moe_only)


def _catalogue_defaults(cls: type) -> type:
    """Each field of ``cls`` (named as a catalogue knob) takes that knob's default: the typed layouts' defaults are
    the catalogue's, written nowhere else."""
    for name in cls.__annotations__:
        setattr(cls, name, CATALOGUE[name].default)
    return cls


@dataclass(slots=True, kw_only=True)
@_catalogue_defaults
class ModelKnobs:
    """The values of the knobs the performance model reads (the catalogue's ``model_arg``), typed, each field named
    as its knob with the knob's default: the base of :class:`dse.perfmodel.layout.ModelLayout` and of
    :class:`KnobValues` (a test keeps the fields and the catalogue in step). ``None`` in ``sp`` and
    ``tp_comm_overlap`` is "auto" (:func:`effective`, :func:`settle`). Never changed once built."""

    tp: int
    pp: int
    vp: int
    cp: int
    ep: int
    etp: int
    moe_dispatcher: str
    moe_grouped_gemm: bool
    moe_a2a_overlap: bool
    moe_token_drop: bool
    moe_permute_fusion: bool
    pp_first_layers: int
    pp_last_layers: int
    sp: bool | None
    mbs: int
    gbs: int
    seq_length: int
    recompute: str
    recompute_num_layers: int
    recompute_modules: str
    precision: str
    fp8_recipe: str
    fsdp: bool
    tp_comm_overlap: bool | None
    nccl_ub: bool
    overlap_param_gather: bool
    cpu_offload_layers: int
    attention_backend: str
    cuda_graph: str
    cuda_graph_scope: str


@dataclass(slots=True, kw_only=True)
@_catalogue_defaults
class KnobValues(ModelKnobs):
    """Every catalogue knob's value, typed: the model's knobs and the run's (``num_nodes``, ``max_steps``), one
    field per catalogue entry in its order, so that readers of a trial (``TrialConfig.layout.tp``) are checked by
    mypy."""

    num_nodes: int
    max_steps: int

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> KnobValues:
        """The typed values of ``values`` (canonical name -> value; every catalogue knob present)."""
        return cls(**{f.name: values[f.name] for f in fields(cls)})


ENV_KNOB = Knob("env", "str", "environment variable for the training process", None)


def is_env(name: str) -> bool:
    return name.startswith(ENV_PREFIX)


def get(name: str, *, file: str | None = None, field: str | None = None) -> Knob:
    """The knob called ``name`` (``env.NAME`` for environment knobs); unknown names are a :class:`UserError`."""
    if is_env(name):
        var = name[len(ENV_PREFIX) :]
        if not _ENV_NAME.fullmatch(var):
            raise UserError(
                f"{var!r} is not an environment variable name (A-Z, 0-9, _)", file=file, field=field or name
            )
        return Knob(name, "str", ENV_KNOB.help)
    try:
        return CATALOGUE[name]
    except KeyError:
        raise UserError(
            f"unknown knob {name!r}{did_you_mean(name, CATALOGUE)}; known knobs: {', '.join(CATALOGUE)} and env.NAME",
            file=file,
            field=field or name,
        ) from None


def ordinal_knobs(varied: Mapping[str, Sequence[Any]]) -> list[str]:
    """The knobs of ``varied`` (a space's ``[knobs]``) a sampler can treat as ordered: ordinal knobs whose values
    the space lists in ascending order (an unsorted list has no order to use)."""
    return [n for n, v in varied.items() if n in CATALOGUE and CATALOGUE[n].ordinal and list(v) == sorted(v)]


def recipe_layout_knobs() -> tuple[str, ...]:
    """The knobs a recipe's default layout sets (``dse.rules.trial.resolve``), beyond the catalogue's defaults."""
    return tuple(n for n, k in CATALOGUE.items() if k.recipe_layout)


def model_args(values: Mapping[str, Any]) -> dict[str, Any]:
    """The model's layout fields (``dse.perfmodel.layout.ModelLayout``'s, by ``model_arg``) from a trial's knob values."""
    return {k.model_arg: values.get(n, k.default) for n, k in CATALOGUE.items() if k.model_arg}


def effective(name: str, values: Mapping[str, Any], where: Where | None = None) -> Any:
    """The value knob ``name`` runs with: its value in ``values`` (its default where absent), or where unset
    (None) its derived default (:attr:`Knob.auto`) from the other values."""
    knob = CATALOGUE[name]
    value = values.get(name, knob.default)
    return knob.auto(values, where) if value is None and knob.auto is not None else value


def settle(values: dict[str, Any], where: Where) -> dict[str, Any]:
    """Settle a trial's values in place, as NVIDIA's recipes run: each knob whose derived default the trial records
    (:attr:`Knob.settled`) and that is unset (None) takes it; each set of modules is written in its canonical
    spelling (:func:`canonical_modules`), whatever order or form the space gave. Knobs whose derived default is
    not recorded (``sp``) stay None and read as it where used (:func:`effective`). Every path to a trial
    (``dse run``, ``dse predict``, ``dse dry-run``, the benches) goes through here, so one layout has one
    prediction."""
    for name, knob in CATALOGUE.items():
        if knob.kind == "modules" and name in values:
            values[name] = canonical_modules(values[name], knob)
        elif knob.auto is not None and knob.settled and values.get(name) is None:
            values[name] = knob.auto(values, where)
    return values


def spelling_of(flavour: str) -> Spelling:
    """The :class:`Spelling` of a payload flavour (``sim`` and ``nemo2`` share one, ``mbridge`` and ``mcore``)."""
    if flavour not in SPELLINGS:
        raise UserError(f"unknown payload flavour {flavour!r}; one of {', '.join(FLAVOURS)}", field="backend.payload")
    return SPELLINGS[flavour]


def overrides(values: Mapping[str, Any], flavour: str, *, moe: bool = False) -> list[str]:
    """Dotted ``path=value`` overrides that set ``values`` (canonical knob -> value) in a payload's config.

    Each flavour spells through its :class:`Spelling` (:data:`SPELLINGS`). Knobs that several fields spell
    together (precision with fp8_recipe, recompute with recompute_num_layers) are spelled once, at the first of
    them. Knobs with no path in a flavour are left to the payload, or reach it as factory arguments
    (:func:`factory_args`). The MoE-only knobs (:data:`MOE_KNOBS`) are spelled for a MoE model only (``moe``), so
    that a dense model's scripts stay as they were. Callers validate values first and shell-quote the result.
    """
    spelling = spelling_of(flavour)
    return [
        o
        for name, value in values.items()
        if name in CATALOGUE and (moe or name not in MOE_KNOBS)
        for o in spelling.spell(CATALOGUE[name], value, values)
    ]


def factory_args(values: Mapping[str, Any], *, gpu: str, hidden_size: int) -> dict[str, Any]:
    """Arguments of the NeMo 2 factory (``llama3_8b_recipe(...)``) for the knobs a dotted override cannot set.

    Only values that differ from the factory's defaults are given. With ``tp_comm_overlap`` the factory also gets
    the name of NeMo's tuned userbuffer config for (GPU, precision, width, tp), where one exists.
    """
    args: dict[str, Any] = {}
    for name, knob in CATALOGUE.items():
        # the factory's own default: False for a boolean whose catalogue default is "auto" (None)
        factory_default = False if knob.kind == "bool" and knob.default is None else knob.default
        if knob.nemo2_factory and values.get(name, factory_default) not in (factory_default, None):
            args[knob.nemo2_factory] = values[name]
    if args.get("tp_comm_overlap"):
        config = userbuffer_name(values, gpu=gpu, hidden_size=hidden_size, payload="nemo2")
        if config:
            args["tp_comm_overlap_cfg"] = config
    return args


def userbuffer_name(values: Mapping[str, Any], *, gpu: str, hidden_size: int, payload: str) -> str | None:
    """The userbuffer config ``payload`` loads for the trial's (GPU, precision, width, tp), as NVIDIA's scripts
    for that payload do (``dse.facts.hardware.userbuffer_config``); None without one."""
    precision, tp = effective("precision", values), effective("tp", values)
    return hardware.userbuffer_config(gpu, precision, hidden_size, tp, payload)


def factory_call(name: str, args: Mapping[str, Any]) -> str:
    """``name`` or ``name(k=v,...)`` in the syntax nemo-run's ``--factory`` parses (Python literals, no spaces)."""
    if not args:
        return name
    # strings in double quotes: the whole call is shell-quoted in single quotes, which then stay readable
    return f"{name}({','.join(f'{k}={json.dumps(v) if isinstance(v, str) else repr(v)}' for k, v in args.items())})"


def pipeline_layout(num_layers: int, pp: int, vp: int, first: int, last: int, mtp_layers: int = 0) -> str:
    """Megatron-Core's ``pipeline_model_parallel_layout`` string (``PipelineParallelLayerLayout.from_str``) of an
    uneven split: ``first`` decoder layers on the first pipeline rank, ``last`` on the last (0: an even share),
    the rest evenly over the middle ranks, each rank's layers over its ``vp`` virtual chunks; chunk ``v*pp + r``
    is rank r's v-th. The first rank's chunks are filled from the back and the last rank's from the front, so the
    embedding and the loss (with the MTP layers) share a chunk with fewer layers: with DeepSeek-V3's 61 layers
    this gives NVIDIA's own layouts, "Et|(tt|)*30mL" for (pp 8, vp 4, first 7, last 6) and "Et*4|(t*4|)*14tmL"
    for (pp 2, vp 8, first 32, last 29) (Megatron-Bridge scripts/performance/configs/deepseek/
    deepseek_workload_base_configs.py), written out chunk by chunk."""
    middle = pp - bool(first) - bool(last)
    share = (num_layers - first - last) // middle if middle else 0
    per_rank = [first or share, *[share] * (pp - 2), last or share] if pp > 1 else [num_layers]
    chunks = [[0] * vp for _ in range(pp)]
    for rank, n in enumerate(per_rank):
        cap = -(-n // vp)
        order = range(vp - 1, -1, -1) if rank == 0 else range(vp)
        for v in order:
            chunks[rank][v] = min(cap, n)
            n -= chunks[rank][v]
    text = ["t" * chunks[i % pp][i // pp] for i in range(pp * vp)]
    text[0] = "E" + text[0]
    text[-1] += "m" * mtp_layers + "L"
    return "|".join(text)


def pipeline_split_overrides(
    num_layers: int, values: Mapping[str, Any], flavour: str, *, mtp_layers: int = 0, explicit: bool = False
) -> list[str]:
    """How the pipeline splits the layers, always spelled out.

    ``account_for_embedding/loss_in_pipeline_split`` is on when pp*vp does not divide the layers but divides two
    more (Llama 3.1 405B: 126 + 2 = 128 over pp=8, vp=8), as ``dse.rules.trial.TrialConfig.pipeline_layers`` and the
    ``layers_divisible`` rule assume. Spelled either way so that a recipe's own setting (NeMo's 405B recipe turns
    it on) never disagrees with the layout, e.g. on a scaled reproducer whose layers divide evenly.

    Uneven first and last stages (``pp_first_layers``, ``pp_last_layers``) are Megatron's
    ``num_layers_in_first/last_pipeline_stage`` without interleaving and a ``pipeline_model_parallel_layout``
    (:func:`pipeline_layout`) with it, since Megatron-Core wants the first and last stage's layers divisible by vp.
    With ``explicit`` (an MoE recipe, whose NeMo 2 and Bridge recipes set a split of their own: NeMo's DeepSeek-V3
    first 3 and last 2 layers, Bridge's its layouts) the four fields are spelled even for an even split.
    """
    pp, vp = effective("pp", values), effective("vp", values) or 1
    first, last = effective("pp_first_layers", values) or 0, effective("pp_last_layers", values) or 0
    chunks = pp * vp
    uneven = bool(first or last)
    on = not uneven and pp > 1 and num_layers % chunks != 0 and (num_layers + 2) % chunks == 0
    prefix = spelling_of(flavour).strategy
    out = [
        f"{prefix}account_for_embedding_in_pipeline_split={spell_value(on)}",
        f"{prefix}account_for_loss_in_pipeline_split={spell_value(on)}",
    ]
    if not (uneven or explicit):
        return out
    # recipes.mcore builds its model from recipes.models (no recipe layout to clear) and takes no layout: the
    # stage sizes, which it refuses with its reason where it cannot split so
    layouts = flavour != "mcore"
    layout = pipeline_layout(num_layers, pp, vp, first, last, mtp_layers) if layouts and uneven and vp > 1 else None
    counts = (first, last) if layout is None else (0, 0)
    return [
        *out,
        f"{prefix}num_layers_in_first_pipeline_stage={spell_value(counts[0] or None)}",
        f"{prefix}num_layers_in_last_pipeline_stage={spell_value(counts[1] or None)}",
        *([f"{prefix}pipeline_model_parallel_layout={spell_value(layout)}"] if layouts else []),
    ]


def payload_args(
    flavour: str, recipe: Recipe, values: Mapping[str, Any], *, gpu: str, gpus_per_node: int
) -> tuple[str, ...]:
    """Everything after ``python -m recipes.<flavour>`` for one trial: recipe, factory arguments, overrides.

    ``nemo2`` and ``sim``: ``--factory <model>_recipe[(args)] -y`` then the overrides, ``trainer.devices`` and,
    for a scaled reproducer, ``model.config.num_layers``. ``mbridge``: ``--recipe <bridge recipe>`` and, with
    ``tp_comm_overlap``, ``--tp-comm-overlap-cfg NAME``, the config Bridge's performance scripts load for the
    layout (``recipes.mbridge.userbuffers``), then the overrides. ``mcore`` (the megatron-core payload,
    ``recipes/mcore``): spelled as ``mbridge`` (it has no userbuffers, so no ``--tp-comm-overlap-cfg``; the
    controller refuses tp_comm_overlap there); a recipe Bridge lacks goes by its dse name.
    """
    base = recipe.scaled_from or recipe.name
    split = pipeline_split_overrides(
        recipe.arch.num_layers, values, flavour, mtp_layers=recipe.arch.mtp_layers, explicit=recipe.arch.is_moe
    )
    if flavour in BRIDGE_SPELLING:
        if not recipe.mbridge_recipe and flavour == "mbridge":
            raise UserError(
                f"recipe {recipe.name!r} has no Megatron-Bridge recipe; use the nemo2 payload", field="backend.payload"
            )
        # recipes.mcore knows every architecture of recipes.models by its name, and Bridge's recipe names too
        argv = ["--recipe", recipe.mbridge_recipe or base]
        ub = userbuffer_name(values, gpu=gpu, hidden_size=recipe.arch.hidden_size, payload=flavour)
        if ub and values.get("tp_comm_overlap"):
            argv += ["--tp-comm-overlap-cfg", ub]
        argv += overrides(values, flavour, moe=recipe.arch.is_moe) + split + scaled_overrides(recipe, flavour)
        return tuple(argv)
    args = factory_args(values, gpu=gpu, hidden_size=recipe.arch.hidden_size)
    argv = [
        "--factory",
        factory_call(base + NEMO2_FACTORY_SUFFIX, args),
        "-y",
        *overrides(values, flavour, moe=recipe.arch.is_moe),
        *split,
        f"trainer.devices={gpus_per_node}",
        *scaled_overrides(recipe, flavour),
    ]
    return tuple(argv)


def scaled_overrides(recipe: Recipe, flavour: str) -> list[str]:
    """What a scaled reproducer changes in its base recipe's model: the layer count and, for a MoE reproducer,
    the experts and which layers are MoE (Megatron-Core's ``moe_layer_freq``: DeepSeek-V3's providers give a
    list of one entry per layer, [0]*3 + [1]*58, which must follow the layer count; ``recipes.mcore`` builds it
    from the architecture itself); a slice that drops its base's multi-token prediction (deepseek_v3_8l) says so
    (Megatron-Core's ``mtp_num_layers``, null: none)."""
    if not recipe.scaled_from:
        return []
    arch, model = recipe.arch, spelling_of(flavour).model
    out = [f"{model}num_layers={arch.num_layers}"]
    if arch.mtp_layers != RECIPES[recipe.scaled_from].arch.mtp_layers:
        out.append(f"{model}mtp_num_layers={arch.mtp_layers or 'null'}")
    if arch.is_moe:
        out.append(f"{model}num_moe_experts={arch.num_experts}")
        if arch.moe_first_dense_layers and flavour != "mcore":  # recipes.mcore reads it from recipes.models
            freq = [0] * arch.moe_first_dense_layers + [1] * arch.moe_layers
            out.append(f"{model}moe_layer_freq=[{','.join(map(str, freq))}]")
    return out
