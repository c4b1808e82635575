"""``LaunchPlan``: what a backend needs to run one trial — command, overrides, environment, pre-steps.

The overrides come from the knob catalogue for the payload's flavour (``nemo2``, ``mbridge`` or ``sim``);
the environment is what NeMo's PerfEnvPlugin would set, plus the space's ``env.NAME`` knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from dse.trial import TrialConfig


@dataclass(frozen=True)
class PreStep:
    """A command run once per node before training (vboost), as its own srun step."""

    name: str
    command: tuple[str, ...]


@dataclass(frozen=True)
class LaunchPlan:
    trial: TrialConfig
    payload: str  # "nemo2" | "mbridge" | "sim"
    argv: tuple[str, ...]  # the training command inside the container, one process per GPU
    overrides: tuple[str, ...]  # key=value, already part of argv; kept for display and tests
    env: Mapping[str, str] = field(default_factory=dict)
    pre_steps: tuple[PreStep, ...] = ()


def build_plan(trial: TrialConfig, *, payload: str = "nemo2") -> LaunchPlan:
    """The launch plan of ``trial`` for a payload flavour (first cut: overrides and argv only)."""
    from dse.knobs import overrides

    ov = tuple(overrides(dict(trial.values), payload))
    module = f"recipes.{payload}"
    argv = ("python", "-m", module, "--factory", f"{trial.recipe.nemo2_recipe}_recipe", "-y", *ov)
    return LaunchPlan(trial=trial, payload=payload, argv=argv, overrides=ov, env=dict(trial.env))
