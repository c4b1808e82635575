"""Command line of the Megatron-Bridge payload, parsed without importing Megatron.

``--recipe NAME`` is a function of its family's module of ``megatron.bridge.recipes`` (``llama``, ``deepseek``,
``qwen``, ``gpt_oss``) returning a ``ConfigContainer``;
``--tp-comm-overlap-cfg NAME`` a tuned userbuffer config of ``megatron.bridge.training.comm_overlap``; every
other argument is a Hydra-style ``path=value`` override applied by Bridge's own ``omegaconf_utils``, except
``mixed_precision=NAME``, which names one of Bridge's precision recipes and is resolved to its config first
(a string cannot replace the dataclass node through OmegaConf).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .. import contract

ENV_RECIPE = contract.ENV_MBRIDGE_RECIPE
# The family modules under ``megatron.bridge.recipes``; a recipe function's name starts with its family's:
# Bridge keeps its recipes per model family (megatron/bridge/recipes/{llama,deepseek,qwen,gpt_oss}/__init__.py
# export ``llama3_8b_pretrain_config``, ``deepseek_v3_pretrain_config``, ``qwen3_30b_a3b_pretrain_config``,
# ``gpt_oss_120b_pretrain_config``, ...). Importing one family keeps the start-up short (the package's own
# ``__init__`` imports every family, vision models included).
RECIPE_FAMILIES = ("llama", "deepseek", "qwen", "gpt_oss")
# the override paths that set the pipeline split; a recipe's own ``pipeline_model_parallel_layout`` (DeepSeek-V3's,
# built for its default pp and vp) is cleared when the command line sets the split or a layout, since Megatron-Core
# refuses a layout together with ``num_layers_in_first/last_pipeline_stage`` or ``account_for_*_in_pipeline_split``
# (TransformerConfig.__post_init__) and a layout for other pp / vp sizes
PIPELINE_SPLIT_KEYS = (
    "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size",
    "model.num_layers_in_first_pipeline_stage",
    "model.num_layers_in_last_pipeline_stage",
)
LAYOUT_KEY = "model.pipeline_model_parallel_layout"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Hydra override grammar subset used here: optional +/~ prefix, dotted key, '=', value.
_OVERRIDE = re.compile(r"^[+~]?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*=.*$")


@dataclass(frozen=True)
class BridgeArgs:
    recipe: str
    overrides: tuple[str, ...]
    mixed_precision: str | None = None
    tp_comm_overlap_cfg: str | None = None

    @property
    def recipe_module(self) -> str:
        """The module of ``megatron.bridge.recipes`` that holds the recipe function (see :data:`RECIPE_FAMILIES`)."""
        return recipe_module(self.recipe)

    @property
    def clears_layout(self) -> bool:
        """Whether the recipe's own pipeline layout is to be cleared before the overrides apply: they set the
        pipeline split or a layout of their own (which then replaces an empty field rather than the recipe's
        list of lists)."""
        keys = {o.split("=", 1)[0].lstrip("+~") for o in self.overrides}
        return any(k in keys for k in (*PIPELINE_SPLIT_KEYS, LAYOUT_KEY))

    @property
    def needs_comm_overlap(self) -> bool:
        """Whether the config must have a CommOverlapConfig before the overrides are applied."""
        return bool(self.tp_comm_overlap_cfg) or any(o.startswith("comm_overlap.") for o in self.overrides)


def recipe_module(recipe: str) -> str:
    """``megatron.bridge.recipes.<family>`` for a recipe function's name; ValueError for a family dse does not know."""
    for family in RECIPE_FAMILIES:
        if recipe.startswith(family):
            return f"megatron.bridge.recipes.{family}"
    known = ", ".join(RECIPE_FAMILIES)
    raise ValueError(f"recipe {recipe!r} is of no Megatron-Bridge family dse knows (names starting with {known})")


def _name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r} is not a Python identifier")
    return value


def parse(argv: Sequence[str], env: dict[str, str] | None = None) -> BridgeArgs:
    """Split the payload's argv into recipe, precision recipe, userbuffer config and overrides; ValueError if bad."""
    parser = argparse.ArgumentParser(prog="python -m recipes.mbridge", add_help=True)
    parser.add_argument("--recipe", default=(env or {}).get(ENV_RECIPE))
    parser.add_argument("--tp-comm-overlap-cfg", default=None)
    known, rest = parser.parse_known_args(list(argv))
    if not known.recipe:
        raise ValueError(f"no recipe: pass --recipe NAME or set {ENV_RECIPE}")
    overrides: list[str] = []
    precision = None
    for arg in rest:
        if not _OVERRIDE.match(arg):
            raise ValueError(f"{arg!r} is not an override of the form path.to.field=value")
        key, value = arg.split("=", 1)
        if key == "mixed_precision":
            precision = _name(value, "mixed_precision")
        else:
            overrides.append(arg)
    cfg = known.tp_comm_overlap_cfg
    return BridgeArgs(
        recipe=_name(known.recipe, "recipe"),
        overrides=tuple(overrides),
        mixed_precision=precision,
        tp_comm_overlap_cfg=_name(cfg, "--tp-comm-overlap-cfg") if cfg else None,
    )
