"""``TrialConfig``: one fully resolved point of a space — knobs, recipe defaults and system together.

Immutable. Derived values (world size, data-parallel size, number of micro-batches, effective sequence
parallelism) are properties, computed from the knobs, never stored beside them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dse.facts import knobs
from dse.recipes.models import Recipe
from dse.rules.space import Space, System


@dataclass(frozen=True)
class TrialConfig:
    """One resolved point: ``values`` by name for code that walks the catalogue, ``layout`` typed for code that
    reads a knob (``trial.layout.tp``), both of every catalogue knob."""

    recipe: Recipe
    system: System
    values: Mapping[str, Any]  # canonical knob name -> value, every catalogue knob present
    env: Mapping[str, str] = field(default_factory=dict)  # NAME -> value from env.NAME knobs
    varied: tuple[str, ...] = ()  # the knobs the space varies (in space order), incl. env.NAME
    # the first value the space lists for each varied knob: the one a knob that has no effect is pinned to
    first_listed: Mapping[str, Any] = field(default_factory=dict)
    # the payload that runs it (the space's [backend] payload): the performance model reads what that payload's
    # code does beyond the knobs (its loss, its FP8 weights: dse.perfmodel.stack)
    payload: str = "nemo2"
    # the knob values typed (cfg.layout.tp, ...), built from ``values``: a trial missing a knob fails here
    layout: knobs.KnobValues = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", knobs.KnobValues.of(self.values))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles (a mapping proxy does not): its mappings as dicts, read-only again when unpickled, so that an
        environment holding trials crosses to another process (Gymnasium's async vector form)."""
        maps = (dict(self.values), dict(self.env), dict(self.first_listed))
        return _unpickle_trial, (self.recipe, self.system, *maps, self.varied, self.payload)

    # -- derived -----------------------------------------------------------------------------------
    @property
    def arch(self):
        return self.recipe.arch

    @property
    def num_gpus(self) -> int:
        return self.layout.num_nodes * self.system.gpus_per_node

    @property
    def model_parallel(self) -> int:
        return self.layout.tp * self.layout.pp * self.layout.cp

    @property
    def dp(self) -> int:
        """Data-parallel size (0 when the world is not divisible; constraints reject such points)."""
        mp = self.model_parallel
        return self.num_gpus // mp if mp and self.num_gpus % mp == 0 else 0

    @property
    def sequence_parallel(self) -> bool:
        return bool(knobs.effective("sp", self.values))

    @property
    def uneven_stages(self) -> bool:
        """Whether the first or the last pipeline stage has a size of its own (``pp_first_layers``,
        ``pp_last_layers``)."""
        return bool(self.layout.pp_first_layers or self.layout.pp_last_layers)

    @property
    def pipeline_layers(self) -> int:
        """Layers the pipeline splits: the transformer layers, or two more when they do not divide by pp*vp
        but would with the embedding and the loss counted as layers (Megatron's
        ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``, which Megatron-Core
        refuses together with uneven first and last stages)."""
        layers, chunks = self.arch.num_layers, self.layout.pp * self.layout.vp
        if self.uneven_stages:
            return layers
        if self.layout.pp > 1 and layers % chunks and (layers + 2) % chunks == 0:
            return layers + 2
        return layers

    @property
    def num_microbatches(self) -> int:
        denom = self.layout.mbs * self.dp
        return self.layout.gbs // denom if denom else 0

    def knob(self, name: str) -> Any:
        """A knob's value by canonical name, env.NAME included (None for an unset env knob)."""
        if knobs.is_env(name):
            return self.env.get(name[len(knobs.ENV_PREFIX) :])
        return self.values[name]

    def varied_values(self) -> dict[str, Any]:
        return {n: self.knob(n) for n in self.varied}

    def as_dict(self) -> dict[str, Any]:
        """Every knob (env as env.NAME) plus the recipe, GPU and world size: a row for tables and JSON."""
        out: dict[str, Any] = {"recipe": self.recipe.name, "gpu": self.system.gpu, "num_gpus": self.num_gpus}
        out.update(self.values)
        out["sp"] = self.sequence_parallel
        out.update({f"{knobs.ENV_PREFIX}{k}": v for k, v in self.env.items()})
        return out


def resolve_auto(values: dict[str, Any], recipe: Recipe, system: System, payload: str = "nemo2") -> dict[str, Any]:
    """Settle the knobs whose default depends on the rest of the layout, in place, by the catalogue's rules
    (``dse.facts.knobs.settle``): ``tp_comm_overlap`` left unset takes its derived default; ``sp`` left unset stays None
    and reads as tp > 1 (:attr:`TrialConfig.sequence_parallel`); ``recompute_modules`` is written in its canonical
    spelling. Every path to a trial goes through here, so one layout has one prediction."""
    return knobs.settle(values, knobs.Where(system.gpu, recipe.arch.hidden_size, payload))


def resolve(space: Space, point: Mapping[str, Any], *, recipe: Recipe | None = None) -> TrialConfig:
    """The trial for one point of ``space``: catalogue defaults < recipe defaults < settings < point.

    ``recipe`` replaces the space's registered recipe (``dse predict --model-file``: an architecture outside
    the registry)."""
    recipe = recipe or space.recipe_obj
    values: dict[str, Any] = {name: k.default for name, k in knobs.CATALOGUE.items()}
    precision = point.get("precision", space.settings.get("precision", values["precision"]))
    defaults = recipe.default_values(space.system.gpu, precision, space.num_nodes * space.system.gpus_per_node)
    values.update({name: defaults[name] for name in knobs.recipe_layout_knobs()})
    values["num_nodes"] = space.num_nodes
    env: dict[str, str] = {}
    for source in (space.settings, point):
        for name, value in source.items():
            if knobs.is_env(name):
                env[name[len(knobs.ENV_PREFIX) :]] = knobs.get(name).coerce(value)
            else:
                values[name] = value
    if (
        values["recompute"] != "selective"
        and "recompute_modules" not in space.settings
        and "recompute_modules" not in point
    ):
        # the recipe's recompute modules go with its selective recompute: another recompute drops them
        values["recompute_modules"] = knobs.CATALOGUE["recompute_modules"].default
    resolve_auto(values, recipe, space.system, space.backend.payload)
    return TrialConfig(
        recipe=recipe,
        system=space.system,
        values=MappingProxyType(values),
        env=MappingProxyType(env),
        varied=tuple(space.knobs),
        first_listed=MappingProxyType({k: v[0] for k, v in space.knobs.items() if v}),
        payload=space.backend.payload,
    )


def _unpickle_trial(recipe, system, values, env, first_listed, varied, payload) -> TrialConfig:
    """A pickled :class:`TrialConfig` rebuilt (see its ``__reduce__``)."""
    proxy = MappingProxyType
    return TrialConfig(recipe, system, proxy(values), proxy(env), varied, proxy(first_listed), payload)
