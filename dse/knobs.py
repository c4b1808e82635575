"""The knob catalogue: one canonical name per knob, its type, allowed values, and how payloads spell it.

The catalogue alone knows that NeMo 2 spells ``tp`` as ``trainer.strategy.tensor_model_parallel_size``
and Megatron-Bridge as ``model.tensor_model_parallel_size``; everything else (space files, CSV columns,
leaderboard, report) uses the canonical name. Environment knobs are ``env.NAME``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dse.errors import UserError, did_you_mean

ENV_PREFIX = "env."
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Values that reach a shell are validated against this before quoting (belt and braces).
_ENV_VALUE = re.compile(r"^[A-Za-z0-9_.,:=/+\-]*$")


@dataclass(frozen=True)
class Knob:
    """One tunable setting.

    ``kind`` is ``int`` (``minimum``, optional ``power_of_two``), ``bool``, ``choice`` (``choices``) or
    ``str``. ``nemo2`` / ``mbridge`` are the override paths of the two payload flavours (several where one
    knob sets several fields); an empty tuple means the payload derives it (see ``dse.launch``).
    """

    name: str
    kind: str
    help: str
    default: Any = None
    minimum: int | None = None
    choices: tuple[str, ...] = ()
    nemo2: tuple[str, ...] = ()
    mbridge: tuple[str, ...] = ()
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
        if not isinstance(text, str) or not _ENV_VALUE.match(text):
            raise UserError(f"{value!r} is not allowed; {self.name} takes letters, digits and _.,:=/+-",
                            file=file, field=field)
        return text


def _int(name: str, help: str, default: int, minimum: int = 1, nemo2=(), mbridge=(), layout=True) -> Knob:
    return Knob(name, "int", help, default, minimum=minimum, nemo2=tuple(nemo2), mbridge=tuple(mbridge),
                layout=layout)


_S = "trainer.strategy."
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
    _int("gbs", "global batch size", 128, nemo2=["data.global_batch_size"], mbridge=["train.global_batch_size"]),
    _int("seq_length", "sequence length", 8192, minimum=2, nemo2=["data.seq_length", "model.config.seq_length"],
         mbridge=["model.seq_length", "dataset.sequence_length"]),
    Knob("recompute", "choice", "activation recompute", "none", choices=("none", "selective", "full"),
         nemo2=("model.config.recompute_granularity",), mbridge=("model.recompute_granularity",)),
    _int("recompute_num_layers", "layers per stage recomputed under full recompute (0 = all)", 0, minimum=0,
         nemo2=["model.config.recompute_num_layers"], mbridge=["model.recompute_num_layers"]),
    Knob("precision", "choice", "training precision", "bf16", choices=("bf16", "fp8"),
         nemo2=("trainer.plugins.fp8",), mbridge=("mixed_precision",)),
    Knob("fp8_recipe", "choice", "FP8 scaling recipe (precision=fp8)", "tensorwise",
         choices=("delayed", "tensorwise", "mxfp8", "blockwise"),
         nemo2=("trainer.plugins.fp8_recipe",), mbridge=("mixed_precision",)),
    Knob("fsdp", "bool", "Megatron FSDP instead of the distributed optimizer", False,
         nemo2=(_S + "fsdp",), mbridge=("ddp.use_megatron_fsdp",)),
    Knob("tp_comm_overlap", "bool", "overlap TP collectives with GEMMs (userbuffers)", False,
         nemo2=(), mbridge=("comm_overlap.tp_comm_overlap",)),
    _int("num_nodes", "nodes in the job", 1, nemo2=["trainer.num_nodes"], mbridge=[], layout=True),
    _int("max_steps", "training steps per trial", 50, nemo2=["trainer.max_steps"], mbridge=["train.train_iters"],
         layout=False),
)}

ENV_KNOB = Knob("env", "str", "environment variable for the training process", None, layout=False)


def is_env(name: str) -> bool:
    return name.startswith(ENV_PREFIX)


def get(name: str, *, file: str | None = None, field: str | None = None) -> Knob:
    """The knob called ``name`` (``env.NAME`` for environment knobs); unknown names are a :class:`UserError`."""
    if is_env(name):
        var = name[len(ENV_PREFIX):]
        if not _ENV_NAME.match(var):
            raise UserError(f"{var!r} is not an environment variable name (A-Z, 0-9, _)", file=file, field=field or name)
        return Knob(name, "str", ENV_KNOB.help, layout=False)
    try:
        return CATALOGUE[name]
    except KeyError:
        raise UserError(f"unknown knob {name!r}{did_you_mean(name, CATALOGUE)}; known knobs: "
                        f"{', '.join(CATALOGUE)} and env.NAME", file=file, field=field or name) from None


FLAVOURS = ("nemo2", "mbridge", "sim")


def _spell_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def overrides(values: dict[str, Any], flavour: str) -> list[str]:
    """``path=value`` overrides that set ``values`` (canonical knob -> value) in a payload's config.

    The simulated trainer (``sim``) takes the NeMo 2 spelling, so that it exercises the same command line.
    Knobs with no path in a flavour are left to the payload (it derives them). Values are validated
    against the catalogue first; callers shell-quote the result.
    """
    if flavour not in FLAVOURS:
        raise UserError(f"unknown payload flavour {flavour!r}; one of {', '.join(FLAVOURS)}", field="backend.payload")
    out: list[str] = []
    for name, value in values.items():
        knob = CATALOGUE.get(name)
        if knob is None:
            continue
        paths = knob.mbridge if flavour == "mbridge" else knob.nemo2
        if name == "recompute" and value == "none":
            value = None
        if name == "vp" and value == 1:
            value = None
        out.extend(f"{p}={_spell_value(value)}" for p in paths)
    return out
