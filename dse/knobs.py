"""The knob catalogue: one canonical name per knob, its type, allowed values, and how payloads spell it.

The catalogue alone knows that NeMo 2 spells ``tp`` as ``trainer.strategy.tensor_model_parallel_size``
and Megatron-Bridge as ``model.tensor_model_parallel_size``; everything else (space files, CSV columns,
leaderboard, report) uses the canonical name. Environment knobs are ``env.NAME``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from dse import hardware
from dse.errors import UserError, did_you_mean
from recipes import contract
from recipes.models import Recipe
from recipes.nemo2.spec import FACTORY_SUFFIX as NEMO2_FACTORY_SUFFIX

ENV_PREFIX = "env."
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")  # full match: "FOO\n" is not a name
# Values that reach a shell are validated against this before quoting (belt and braces).
_ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:=/+\-]*")

# Environment variables that decide which program, library or startup code runs (the dynamic loader's,
# the shells', Python's and a few runtimes'), so a space that sets one could run anything. A space may set
# one only when it lists it in ``[backend] allow_env``.
_PROTECTED_ENV = {
    "PATH": "selects which programs run",
    "BASH_ENV": "bash runs that file at start", "ENV": "sh runs that file at start",
    "SHELLOPTS": "changes how bash runs scripts", "BASHOPTS": "changes how bash runs scripts",
    "IFS": "changes how the shell splits words", "PS4": "bash expands it for each traced line",
    "PROMPT_COMMAND": "bash runs it", "CDPATH": "changes where cd goes", "GLOBIGNORE": "changes shell globbing",
    "PYTHONPATH": "selects which Python modules are imported", "PYTHONHOME": "selects the Python installation",
    "PYTHONSTARTUP": "Python runs that file", "PYTHONUSERBASE": "selects which Python modules are imported",
    "PYTHONSAFEPATH": "changes which Python modules are imported", "PYTHONINSPECT": "changes what Python runs",
    "PYTHONEXECUTABLE": "changes which Python runs", "PYTHONBREAKPOINT": "selects code Python runs",
    "PYTHONWARNINGS": "imports the warning categories it names",
    "PERL5LIB": "selects which Perl modules load", "PERL5OPT": "adds Perl options",
    "NODE_OPTIONS": "adds Node.js options", "RUBYOPT": "adds Ruby options",
    "LD_PRELOAD": "loads that library into every program", "LD_LIBRARY_PATH": "selects which libraries load",
    "LD_AUDIT": "loads that library into every program", "HOME": "changes where startup files are read",
}
_PROTECTED_PREFIXES = {"LD_": "configures the dynamic loader", "DYLD_": "configures the dynamic loader",
                       "BASH_FUNC_": "defines a bash function", "GCONV_": "selects which libraries load"}


def protected_env(name: str) -> str | None:
    """Why setting environment variable ``name`` could change which program or library runs, or None."""
    if name in _PROTECTED_ENV:
        return _PROTECTED_ENV[name]
    return next((why for p, why in _PROTECTED_PREFIXES.items() if name.startswith(p)), None)


@dataclass(frozen=True)
class Knob:
    """One tunable setting.

    ``kind`` is ``int`` (``minimum``, optional ``power_of_two``), ``bool``, ``choice`` (``choices``) or
    ``str``. ``nemo2`` / ``mbridge`` are the override paths of the two payload flavours (several where one
    knob sets several fields), each set to the knob's value; knobs whose value is spelled differently
    (precision, recompute, fsdp, ...) are spelled by :func:`overrides` from the tables below the catalogue.
    ``nemo2_factory`` names the NeMo 2 factory argument for a knob that touches objects a dotted override
    cannot reach (a callback in the trainer's list).
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
    layout: bool = True  # part of the parallel layout (vs. run settings such as max_steps)

    def coerce(self, value: Any, *, file: str | None = None, field: str | None = None) -> Any:
        """Validate one value; return it in canonical form or raise :class:`UserError`."""
        field = field or self.name
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{value!r} is not an integer; {self.name} takes integers >= {self.minimum}",
                                file=file, field=field)
            if self.minimum is not None and value < self.minimum:
                raise UserError(f"{value} is out of range; {self.name} must be >= {self.minimum}",
                                file=file, field=field)
            if self.maximum is not None and value > self.maximum:
                raise UserError(f"{value} is out of range; {self.name} must be <= {self.maximum}",
                                file=file, field=field)
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise UserError(f"{value!r} is not a boolean; {self.name} takes true or false", file=file, field=field)
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise UserError(f"{value!r} is not allowed{did_you_mean(str(value), self.choices)}; "
                                f"{self.name} takes one of {', '.join(self.choices)}", file=file, field=field)
            return value
        # str (environment values): the characters that can never start a shell expansion
        text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not _ENV_VALUE.fullmatch(text):
            raise UserError(f"{value!r} is not allowed; {self.name} takes letters, digits and _.,:=/+-",
                            file=file, field=field)
        return text


# Upper bounds of the int knobs: far beyond any real job (the largest runs have ~10^5 GPUs, ~10^3 layers,
# contexts of ~10^6 tokens), low enough that no value makes a simulated log or a step time unbounded.
PARALLEL_MAX = 2**16
BATCH_MAX = 2**24
LAYERS_MAX = 10_000
NODES_MAX = 100_000
STEPS_MAX = 1_000_000


def _int(name: str, help: str, default: int, minimum: int = 1, nemo2=(), mbridge=(), layout=True,
         maximum: int = PARALLEL_MAX) -> Knob:
    return Knob(name, "int", help, default, minimum=minimum, maximum=maximum, nemo2=tuple(nemo2),
                mbridge=tuple(mbridge), layout=layout)


ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
_S = "trainer.strategy."
_M = "model.config."
_OFFLOAD = ("cpu_offloading", "cpu_offloading_num_layers", "cpu_offloading_activations", "cpu_offloading_weights")
CATALOGUE: dict[str, Knob] = {k.name: k for k in (
    _int("tp", "tensor-parallel size", 1, nemo2=[_S + "tensor_model_parallel_size"],
         mbridge=["model.tensor_model_parallel_size"]),
    _int("pp", "pipeline-parallel size", 1, nemo2=[_S + "pipeline_model_parallel_size"],
         mbridge=["model.pipeline_model_parallel_size"]),
    _int("vp", "virtual-pipeline (interleaving) size; 1 = no interleaving", 1,
         nemo2=[_S + "virtual_pipeline_model_parallel_size"], mbridge=["model.virtual_pipeline_model_parallel_size"]),
    _int("cp", "context-parallel size", 1, nemo2=[_S + "context_parallel_size"],
         mbridge=["model.context_parallel_size"]),
    _int("ep", "expert-parallel size (dense models: 1)", 1, nemo2=[_S + "expert_model_parallel_size"],
         mbridge=["model.expert_model_parallel_size"]),
    Knob("sp", "bool", "sequence parallelism (default: on when tp > 1)", None,
         nemo2=(_S + "sequence_parallel",), mbridge=("model.sequence_parallel",)),
    _int("mbs", "micro-batch size", 1, nemo2=["data.micro_batch_size"], mbridge=["train.micro_batch_size"]),
    _int("gbs", "global batch size", 128, maximum=BATCH_MAX, nemo2=["data.global_batch_size"], mbridge=["train.global_batch_size"]),
    _int("seq_length", "sequence length", 8192, minimum=2, maximum=BATCH_MAX, nemo2=["data.seq_length", "model.config.seq_length"],
         mbridge=["model.seq_length", "dataset.sequence_length"]),
    Knob("recompute", "choice", "activation recompute", "none", choices=("none", "selective", "full"),
         nemo2=("model.config.recompute_granularity",), mbridge=("model.recompute_granularity",)),
    _int("recompute_num_layers", "layers per stage recomputed under full recompute (0 = all)", 0, minimum=0,
         maximum=LAYERS_MAX,
         nemo2=["model.config.recompute_num_layers"], mbridge=["model.recompute_num_layers"]),
    Knob("precision", "choice", "training precision", "bf16", choices=("bf16", "fp8"),
         nemo2=("trainer.plugins",), mbridge=("mixed_precision",)),
    Knob("fp8_recipe", "choice", "FP8 scaling recipe (precision=fp8)", "tensorwise",
         choices=("delayed", "tensorwise", "mxfp8", "blockwise"),
         nemo2=("trainer.plugins",), mbridge=("mixed_precision",)),
    Knob("fsdp", "bool", "Megatron FSDP instead of the distributed optimizer", False,
         nemo2=(), mbridge=("ddp.use_megatron_fsdp",), nemo2_factory="fsdp"),
    Knob("tp_comm_overlap", "bool", "overlap TP collectives with GEMMs (userbuffers); default: on when tp > 1 "
         "with sp and NeMo has a userbuffer config for it, as NVIDIA's performance recipes", None,
         nemo2=(), mbridge=("comm_overlap.tp_comm_overlap",), nemo2_factory="tp_comm_overlap"),
    _int("cpu_offload_layers", "transformer layers whose activations are offloaded to host memory (0 = off)", 0,
         minimum=0, maximum=LAYERS_MAX, nemo2=[_M + f for f in _OFFLOAD], mbridge=["model." + f for f in _OFFLOAD]),
    # Megatron-Core's AttnBackend (megatron/core/transformer/enums.py): auto lets Transformer Engine pick (flash
    # or cuDNN fused), unfused is TE's unfused DotProductAttention, local Megatron's own (no TE). NeMo 2: a factory
    # argument, because nemo-run's CLI cannot parse an enum-typed field (model.config.attention_backend=flash
    # fails with "Unsupported type: <enum 'AttnBackend'>"); Megatron-Bridge: the model field.
    Knob("attention_backend", "choice", "attention kernel (Megatron-Core AttnBackend)", "auto",
         choices=ATTENTION_BACKENDS, nemo2=(), mbridge=("model.attention_backend",),
         nemo2_factory="attention_backend"),
    _int("num_nodes", "nodes in the job", 1, maximum=NODES_MAX, nemo2=["trainer.num_nodes"], mbridge=[], layout=True),
    _int("max_steps", "training steps per trial", 50, maximum=STEPS_MAX, nemo2=["trainer.max_steps"], mbridge=["train.train_iters"],
         layout=False),
)}

ENV_KNOB = Knob("env", "str", "environment variable for the training process", None, layout=False)


def is_env(name: str) -> bool:
    return name.startswith(ENV_PREFIX)


def get(name: str, *, file: str | None = None, field: str | None = None) -> Knob:
    """The knob called ``name`` (``env.NAME`` for environment knobs); unknown names are a :class:`UserError`."""
    if is_env(name):
        var = name[len(ENV_PREFIX):]
        if not _ENV_NAME.fullmatch(var):
            raise UserError(f"{var!r} is not an environment variable name (A-Z, 0-9, _)", file=file, field=field or name)
        return Knob(name, "str", ENV_KNOB.help, layout=False)
    try:
        return CATALOGUE[name]
    except KeyError:
        raise UserError(f"unknown knob {name!r}{did_you_mean(name, CATALOGUE)}; known knobs: "
                        f"{', '.join(CATALOGUE)} and env.NAME", file=file, field=field or name) from None


FLAVOURS = contract.PAYLOADS
# Flavours that take Megatron-Bridge's spelling: Bridge itself, and the megatron-core payload (recipes.mcore),
# which accepts Bridge's override paths so that the same trial runs on a GPU without NeMo or Bridge.
BRIDGE_SPELLING = ("mbridge", "mcore")


def _spell_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- value-dependent spellings -------------------------------------------------------------------------------
# NeMo 2 precision: fields of MegatronMixedPrecision as NeMo's own plugin factories set them
# (nemo.collections.llm.recipes.precision.mixed_precision): bf16_with_fp8_mixed (delayed),
# bf16_with_fp8_current_scaling_mixed (tensorwise; first/last layers kept in fp8 as NVIDIA's performance scripts
# do), bf16_with_mxfp8_mixed, bf16_with_fp8_subchannel_scaling_mixed (blockwise). The recipe's base plugin is
# bf16_mixed, so bf16 needs no override (and cannot clear fp8 by one: nemo-run reads "null" for the str-typed
# MegatronMixedPrecision.fp8 as the string "null", which would switch FP8 on).
_P = "trainer.plugins."
NEMO2_PRECISION: dict[str, tuple[str, ...]] = {
    "bf16": (),
    "delayed": (_P + "fp8=hybrid", _P + "fp8_recipe=delayed", _P + "fp8_margin=0", _P + "fp8_amax_history_len=1024",
                _P + "fp8_amax_compute_algo=max", _P + "fp8_param_gather=true"),
    "tensorwise": (_P + "fp8=hybrid", _P + "fp8_recipe=tensorwise", _P + "first_last_layers_bf16=false",
                   _P + "fp8_param_gather=true"),
    "mxfp8": (_P + "fp8=e4m3", _P + "fp8_recipe=mxfp8", _P + "fp8_param_gather=true",
              _P + "reuse_grad_buf_for_mxfp8_param_ag=true"),
    "blockwise": (_P + "fp8=hybrid", _P + "fp8_recipe=blockwise", _P + "fp8_param_gather=false"),
}
# Megatron-Bridge: a mixed-precision recipe by name (megatron.bridge.training.mixed_precision); the payload's
# entry point resolves it, as Bridge's ConfigContainer does for a string.
MBRIDGE_PRECISION: dict[str, str] = {
    "bf16": "bf16_mixed",
    "delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "tensorwise": "bf16_with_fp8_current_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
}
# Megatron FSDP on Bridge: NVIDIA's set_megatron_fsdp_overrides (scripts/performance/utils/helpers.py).
MBRIDGE_FSDP = ("ddp.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=optim_grads_params",
                "ddp.average_in_collective=false", "model.init_model_with_meta_device=true",
                "optimizer.use_precision_aware_optimizer=false")
MBRIDGE_WARMUP_ITERS = 10  # learning-rate warm-up of NVIDIA's Bridge performance runs (set_common_perf_overrides)


def _precision_key(values: Mapping[str, Any]) -> str:
    precision = values.get("precision", CATALOGUE["precision"].default)
    return "bf16" if precision == "bf16" else values.get("fp8_recipe", CATALOGUE["fp8_recipe"].default)


def _recompute(values: Mapping[str, Any], prefix: str) -> list[str]:
    """Recompute granularity, method and layer count together: none/selective clear the method and count;
    full recomputes every layer (uniform, 1 layer per chunk) or the first N layers of each stage (block, N)."""
    mode = values.get("recompute", "none")
    n = values.get("recompute_num_layers", 0) or 0
    if mode == "full":
        method, layers = ("block", n) if n > 0 else ("uniform", 1)
        return [f"{prefix}recompute_granularity=full", f"{prefix}recompute_method={method}",
                f"{prefix}recompute_num_layers={layers}"]
    granularity = None if mode == "none" else mode
    return [f"{prefix}recompute_granularity={_spell_value(granularity)}", f"{prefix}recompute_method=null",
            f"{prefix}recompute_num_layers=null"]


def _cpu_offload(n: int, prefix: str) -> list[str]:
    """Megatron-Core's activation offloading (``ModelParallelConfig.cpu_offloading*``): on for ``n`` layers,
    activations only (weights stay on the GPU); 0 switches it off explicitly, so that a recipe's own setting
    never disagrees with the trial."""
    if not n:
        return [f"{prefix}cpu_offloading=false", f"{prefix}cpu_offloading_num_layers=0"]
    return [f"{prefix}cpu_offloading=true", f"{prefix}cpu_offloading_num_layers={n}",
            f"{prefix}cpu_offloading_activations=true", f"{prefix}cpu_offloading_weights=false"]


def _spell(name: str, value: Any, values: Mapping[str, Any], flavour: str) -> list[str]:
    knob = CATALOGUE[name]
    mbridge = flavour in BRIDGE_SPELLING
    if name in ("precision", "fp8_recipe"):
        if name == "fp8_recipe" and "precision" in values:
            return []  # spelled once, with precision
        key = _precision_key(values)
        return [f"mixed_precision={MBRIDGE_PRECISION[key]}"] if mbridge else list(NEMO2_PRECISION[key])
    if name in ("recompute", "recompute_num_layers"):
        if name == "recompute_num_layers" and "recompute" in values:
            return []  # spelled once, with recompute
        return _recompute(values, "model." if mbridge else "model.config.")
    if name == "cpu_offload_layers":
        return _cpu_offload(value, "model." if mbridge else "model.config.")
    if name == "vp" and value == 1:
        value = None  # no interleaving is spelled null, as NVIDIA's set_primary_perf_configs does
    if name == "sp" and value is None:
        if "tp" not in values:
            return []
        value = values["tp"] > 1  # the default: on exactly when tensor parallel
    if value is None and knob.kind == "bool":
        return []  # an unresolved "auto" (dse.trial.resolve_auto settles it): the payload's own default
    if name == "attention_backend" and value == CATALOGUE[name].default:
        return []  # auto: the recipe's own choice (Transformer Engine picks), so the scripts stay as they were
    if mbridge and name == "fsdp" and value:
        return list(MBRIDGE_FSDP)
    paths = knob.mbridge if mbridge else knob.nemo2
    out = [f"{p}={_spell_value(value)}" for p in paths]
    if mbridge and name == "max_steps":
        out += [f"scheduler.lr_decay_iters={value}",
                f"scheduler.lr_warmup_iters={MBRIDGE_WARMUP_ITERS if value > MBRIDGE_WARMUP_ITERS else 0}"]
    return out


def overrides(values: Mapping[str, Any], flavour: str) -> list[str]:
    """Dotted ``path=value`` overrides that set ``values`` (canonical knob -> value) in a payload's config.

    The simulated trainer (``sim``) takes the NeMo 2 spelling, so that it exercises the same command line.
    Knobs that several fields spell together (precision with fp8_recipe, recompute with recompute_num_layers)
    are spelled once, at the first of them. Knobs with no path in a flavour are left to the payload, or reach
    it as factory arguments (:func:`factory_args`). Callers validate values first and shell-quote the result.
    """
    if flavour not in FLAVOURS:
        raise UserError(f"unknown payload flavour {flavour!r}; one of {', '.join(FLAVOURS)}", field="backend.payload")
    out: list[str] = []
    for name, value in values.items():
        if name in CATALOGUE:
            out.extend(_spell(name, value, values, flavour))
    return out


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
        precision = "bf16" if values.get("precision", "bf16") == "bf16" else "fp8"
        name = hardware.userbuffer_config(gpu, precision, hidden_size, values.get("tp", 1))
        if name:
            args["tp_comm_overlap_cfg"] = name
    return args


def factory_call(name: str, args: Mapping[str, Any]) -> str:
    """``name`` or ``name(k=v,...)`` in the syntax nemo-run's ``--factory`` parses (Python literals, no spaces)."""
    if not args:
        return name
    # strings in double quotes: the whole call is shell-quoted in single quotes, which then stay readable
    return f"{name}({','.join(f'{k}={json.dumps(v) if isinstance(v, str) else repr(v)}' for k, v in args.items())})"


def pipeline_split_overrides(num_layers: int, values: Mapping[str, Any], flavour: str) -> list[str]:
    """Whether the pipeline counts the embedding and the loss as one layer each, always spelled out.

    On when pp*vp does not divide the layers but divides two more (Llama 3.1 405B: 126 + 2 = 128 over pp=8,
    vp=8), as ``dse.trial.TrialConfig.pipeline_layers`` and the ``layers_divisible`` rule assume. Spelled
    either way so that a recipe's own setting (NeMo's 405B recipe turns it on) never disagrees with the
    layout, e.g. on a scaled reproducer whose layers divide evenly.
    """
    pp, vp = values.get("pp", 1), values.get("vp", 1) or 1
    chunks = pp * vp
    on = pp > 1 and num_layers % chunks != 0 and (num_layers + 2) % chunks == 0
    prefix = "model." if flavour in BRIDGE_SPELLING else "trainer.strategy."
    return [f"{prefix}account_for_embedding_in_pipeline_split={_spell_value(on)}",
            f"{prefix}account_for_loss_in_pipeline_split={_spell_value(on)}"]


def payload_args(flavour: str, recipe: Recipe, values: Mapping[str, Any], *, gpu: str,
                 gpus_per_node: int) -> tuple[str, ...]:
    """Everything after ``python -m recipes.<flavour>`` for one trial: recipe, factory arguments, overrides.

    ``nemo2`` and ``sim``: ``--factory <model>_recipe[(args)] -y`` then the overrides, ``trainer.devices`` and,
    for a scaled reproducer, ``model.config.num_layers``. ``mbridge``: ``--recipe <bridge recipe>`` and
    ``--tp-comm-overlap-cfg NAME`` where a tuned userbuffer config exists, then the overrides. ``mcore`` (the
    megatron-core payload, ``recipes/mcore``): spelled as ``mbridge`` (it has no userbuffers, so no
    ``--tp-comm-overlap-cfg``; it refuses tp_comm_overlap with the reason); a recipe Bridge lacks goes by its dse name.
    """
    base = recipe.scaled_from or recipe.name
    num_layers = recipe.arch.num_layers if recipe.scaled_from else None
    split = pipeline_split_overrides(recipe.arch.num_layers, values, flavour)
    if flavour in BRIDGE_SPELLING:
        if not recipe.mbridge_recipe and flavour == "mbridge":
            raise UserError(f"recipe {recipe.name!r} has no Megatron-Bridge recipe; use the nemo2 payload",
                            field="backend.payload")
        # recipes.mcore knows every architecture of recipes.models by its name, and Bridge's recipe names too
        argv = ["--recipe", recipe.mbridge_recipe or base]
        ub = factory_args(values, gpu=gpu, hidden_size=recipe.arch.hidden_size).get("tp_comm_overlap_cfg")
        if ub and flavour == "mbridge":
            argv += ["--tp-comm-overlap-cfg", ub]
        argv += overrides(values, flavour) + split
        if num_layers:
            argv.append(f"model.num_layers={num_layers}")
        return tuple(argv)
    args = factory_args(values, gpu=gpu, hidden_size=recipe.arch.hidden_size)
    argv = ["--factory", factory_call(base + NEMO2_FACTORY_SUFFIX, args), "-y", *overrides(values, flavour),
            *split, f"trainer.devices={gpus_per_node}"]
    if num_layers:
        argv.append(f"model.config.num_layers={num_layers}")
    return tuple(argv)
