"""The catalogue entry owns every fact of a knob: order, recipe layout, model argument, import path, spelling."""

from __future__ import annotations

import inspect

import pytest

from dse import knobs
from dse.errors import UserError
from dse.perfmodel.model import predict_layout
from recipes.contract import PAYLOADS
from recipes.models import RECIPES


def test_every_payload_flavour_has_a_spelling():
    assert set(knobs.SPELLINGS) == set(PAYLOADS)
    assert knobs.SPELLINGS["sim"] is knobs.SPELLINGS["nemo2"] and knobs.SPELLINGS["mcore"] is knobs.SPELLINGS["mbridge"]
    with pytest.raises(UserError, match="unknown payload flavour 'nemo3'"):
        knobs.spelling_of("nemo3")


def test_ordinal_knobs_are_the_catalogues_listed_ascending():
    varied = {"tp": [1, 2, 4], "pp": [4, 2], "recompute": ["none", "selective"], "max_steps": [10, 20],
              "env.NCCL_ALGO": ["Ring", "Tree"], "cpu_offload_layers": [0, 8]}
    assert knobs.ordinal_knobs(varied) == ["tp", "cpu_offload_layers"]  # pp unsorted; max_steps a run setting


def test_recipe_layout_knobs_are_what_a_recipe_chooses():
    chosen = set(RECIPES["llama3_70b"].default_values("gb200", "fp8"))
    assert set(knobs.recipe_layout_knobs()) == chosen
    assert RECIPES["llama3_70b"].default_values("gb200", "fp8")["cpu_offload_layers"] == 40


def test_model_args_are_predict_layouts_keywords():
    params = inspect.signature(predict_layout).parameters
    values = {n: k.default for n, k in knobs.CATALOGUE.items()}
    args = knobs.model_args(values)
    assert set(args) <= set(params) and {"tp", "sp", "precision", "cpu_offload_layers"} <= set(args)
    # every predict_layout keyword named like a knob is fed by that knob: none is left to hand plumbing
    assert {n for n in params if n in knobs.CATALOGUE} == set(args)
    assert "max_steps" not in args and "num_nodes" not in args  # the model reads the world size instead


def test_imported_paths_carry_the_value_itself():
    assert knobs.CATALOGUE["cpu_offload_layers"].imported_from == ("model.config.cpu_offloading_num_layers",)
    assert knobs.CATALOGUE["precision"].imported_from == ()  # trainer.plugins is read by the importer's own rule
    assert knobs.CATALOGUE["tp"].imported_from == ("trainer.strategy.tensor_model_parallel_size",)


def test_a_knob_spells_itself_where_it_has_its_own_spelling_else_by_its_paths():
    def on_off(knob, value, values, sp):
        return [f"{sp.model}graph_impl={'local' if value else 'none'}"]

    knob = knobs.Knob("graphs", "bool", "demo", False, nemo2=("model.config.enable_graph",),
                      mbridge=("model.enable_graph",), spell={"mbridge": on_off})
    assert knobs.NEMO2.spell(knob, True, {}) == ["model.config.enable_graph=true"]
    assert knobs.MBRIDGE.spell(knob, True, {}) == ["model.graph_impl=local"]
    assert knobs.NEMO2.spell(knob, None, {}) == []  # an unresolved auto boolean is the payload's own default
