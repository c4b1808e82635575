"""The catalogue entry owns every fact of a knob: order, recipe layout, model argument, import path, spelling."""

from __future__ import annotations

import dataclasses
import inspect
from types import MappingProxyType
from typing import Any

import pytest

from dse import knobs
from dse.errors import UserError
from dse.perfmodel.model import prepare_layout
from dse.perfmodel.trials import make_trial
from dse.recipes.contract import PAYLOADS
from dse.recipes.models import RECIPES


def test_every_payload_flavour_has_a_spelling():
    assert set(knobs.SPELLINGS) == set(PAYLOADS)
    assert knobs.SPELLINGS["sim"] is knobs.SPELLINGS["nemo2"] and knobs.SPELLINGS["mcore"] is knobs.SPELLINGS["mbridge"]
    with pytest.raises(UserError, match="unknown payload flavour 'nemo3'"):
        knobs.spelling_of("nemo3")


def test_ordinal_knobs_are_the_catalogues_listed_ascending():
    varied: dict[str, list[Any]] = {
        "tp": [1, 2, 4],
        "pp": [4, 2],
        "recompute": ["none", "selective"],
        "max_steps": [10, 20],
        "env.NCCL_ALGO": ["Ring", "Tree"],
        "cpu_offload_layers": [0, 8],
    }
    assert knobs.ordinal_knobs(varied) == ["tp", "cpu_offload_layers"]  # pp unsorted; max_steps a run setting


def test_recipe_layout_knobs_are_what_a_recipe_chooses():
    chosen = set(RECIPES["llama3_70b"].default_values("gb200", "fp8"))
    assert set(knobs.recipe_layout_knobs()) == chosen
    assert RECIPES["llama3_70b"].default_values("gb200", "fp8")["cpu_offload_layers"] == 40


def test_model_args_are_prepare_layouts_keywords():
    params = inspect.signature(prepare_layout).parameters
    values = {n: k.default for n, k in knobs.CATALOGUE.items()}
    args = knobs.model_args(values)
    assert set(args) <= set(params) and {"tp", "sp", "precision", "cpu_offload_layers"} <= set(args)
    # every prepare_layout keyword named like a knob is fed by that knob: none is left to hand plumbing
    assert {n for n in params if n in knobs.CATALOGUE} == set(args)
    assert "max_steps" not in args and "num_nodes" not in args  # the model reads the world size instead


def test_imported_paths_carry_the_value_itself():
    assert knobs.CATALOGUE["cpu_offload_layers"].imported_from == ("model.config.cpu_offloading_num_layers",)
    assert knobs.CATALOGUE["precision"].imported_from == ()  # trainer.plugins is read by the importer's own rule
    assert knobs.CATALOGUE["tp"].imported_from == ("trainer.strategy.tensor_model_parallel_size",)


def test_a_knob_spells_itself_where_it_has_its_own_spelling_else_by_its_paths():
    def on_off(knob, value, values, sp):
        return [f"{sp.model}graph_impl={'local' if value else 'none'}"]

    knob = knobs.Knob(
        "graphs",
        "bool",
        "demo",
        False,
        nemo2=("model.config.enable_graph",),
        mbridge=("model.enable_graph",),
        spell={"mbridge": on_off},
    )
    assert knobs.NEMO2.spell(knob, True, {}) == ["model.config.enable_graph=true"]
    assert knobs.MBRIDGE.spell(knob, True, {}) == ["model.graph_impl=local"]
    assert knobs.NEMO2.spell(knob, None, {}) == []  # an unresolved auto boolean is the payload's own default


def test_the_typed_layout_has_a_field_of_the_right_type_per_knob():
    declared = {f.name: f.type for f in dataclasses.fields(knobs.KnobValues)}  # annotations as text
    assert list(declared) == list(knobs.CATALOGUE)
    for name, knob in knobs.CATALOGUE.items():
        expected = {
            "int": "int",
            "choice": "str",
            "modules": "str",  # the set as one canonical comma-joined string (knobs.canonical_modules)
            "bool": "bool" if knob.default is not None else "bool | None",
        }
        assert declared[name] == expected[knob.kind], name  # a bool whose default is None is "auto"


def test_a_trial_reads_its_knobs_typed_and_refuses_a_missing_one():
    t = make_trial(RECIPES["llama3_70b"], "h100", 64, tp=4, pp=4, vp=5)
    assert (t.layout.tp, t.layout.pp, t.layout.vp, t.layout.num_nodes) == (4, 4, 5, 8)
    assert dataclasses.replace(t, values=MappingProxyType({**t.values, "tp": 8})).layout.tp == 8
    with pytest.raises(AttributeError):
        _ = t.tp  # type: ignore[attr-defined]  # no knob reads as an attribute of the trial itself
    with pytest.raises(KeyError, match="max_steps"):
        dataclasses.replace(t, values=MappingProxyType({k: v for k, v in t.values.items() if k != "max_steps"}))
