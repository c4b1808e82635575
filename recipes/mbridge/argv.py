"""Command line of the Megatron-Bridge payload, parsed without importing Megatron.

``--recipe NAME`` is a function of ``megatron.bridge.recipes.llama`` returning a ``ConfigContainer``;
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
    def needs_comm_overlap(self) -> bool:
        """Whether the config must have a CommOverlapConfig before the overrides are applied."""
        return bool(self.tp_comm_overlap_cfg) or any(o.startswith("comm_overlap.") for o in self.overrides)


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
