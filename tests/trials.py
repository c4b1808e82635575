"""Small builders of spaces and trials for tests (not fixtures: plain functions, fresh values each call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dse.rules.space import Space, System, load_system
from dse.rules.trial import TrialConfig, resolve

DATA = Path(__file__).parent / "data"
LOCAL_SLURM = DATA / "systems" / "local_slurm.toml"


def system(ref: str | Path = "h100", **update: Any) -> System:
    s = load_system(ref)
    if "slurm" in update:
        update["slurm"] = s.slurm.model_copy(update=update["slurm"])
    return s.model_copy(update=update) if update else s


def space(
    recipe: str = "llama3_70b_16l",
    sys: System | None = None,
    num_nodes: int = 2,
    settings: dict[str, Any] | None = None,
    knobs: dict[str, list] | None = None,
    **extra: Any,
) -> Space:
    return Space.model_validate(
        {
            "name": "test",
            "recipe": recipe,
            "system": sys or system(),
            "num_nodes": num_nodes,
            "settings": settings or {},
            "knobs": knobs or {},
            **extra,
        }
    )


def trial(recipe: str = "llama3_70b_16l", sys: System | None = None, num_nodes: int = 2, **values: Any) -> TrialConfig:
    """One trial with ``values`` fixed (knob names; env knobs as ``env_NAME=...``)."""
    settings = {(f"env.{k[4:]}" if k.startswith("env_") else k): v for k, v in values.items()}
    return resolve(space(recipe, sys, num_nodes, settings), {})
