"""The catalogue entry owns every fact of a knob: order, recipe layout, model argument, import path, spelling."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from dse.errors import UserError
from dse.facts import knobs
from dse.perfmodel.calibrate import knob_values_from_row
from dse.perfmodel.layout import ModelLayout
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


def test_a_recipes_layout_starts_from_the_catalogues_defaults():
    """recipes.models (data both the controller and the payloads read, so it imports no catalogue) writes its
    default layout's fields; each is the catalogue's default of that knob."""
    from dse.recipes.models import Layout

    fields = {f.name: f.default for f in dataclasses.fields(Layout) if f.name in knobs.CATALOGUE}
    assert set(fields) == set(knobs.recipe_layout_knobs()) - {"seq_length"}  # the recipe's own, not its layout's
    assert fields == {n: knobs.CATALOGUE[n].default for n in fields}


def test_recipe_layout_knobs_are_what_a_recipe_chooses():
    chosen = set(RECIPES["llama3_70b"].default_values("gb200", "fp8"))
    assert set(knobs.recipe_layout_knobs()) == chosen
    assert RECIPES["llama3_70b"].default_values("gb200", "fp8")["cpu_offload_layers"] == 40


def test_every_model_layout_field_of_a_knob_is_the_catalogues_with_its_default():
    layout = {f.name: f for f in dataclasses.fields(ModelLayout)}
    model_knobs = {n: k for n, k in knobs.CATALOGUE.items() if k.model_arg}
    assert {k.model_arg for k in model_knobs.values()} == {n for n in layout if n in knobs.CATALOGUE}
    for name, knob in model_knobs.items():
        assert knob.model_arg == name and layout[name].default == knob.default, name  # no default written twice
    # the rest are what the system gives: the world, its links and fabric, the container; not knobs
    rest = set(layout) - set(model_knobs)
    assert rest == {"num_gpus", "dropout", "nvlink_domain", "scaleout_gbps", "container", "pod_gpus"} | {
        "pod_oversubscription",
        "rank_order",
    }
    assert "max_steps" not in layout and "num_nodes" not in layout  # the model reads the world size instead
    values = {n: k.default for n, k in knobs.CATALOGUE.items()}
    assert set(knobs.model_args(values)) == set(model_knobs)


def test_an_unset_sequence_parallel_in_a_model_layout_takes_the_catalogues_rule():
    assert ModelLayout(num_gpus=8, tp=4).sp is True and ModelLayout(num_gpus=8).sp is False
    assert ModelLayout(num_gpus=8, tp=4, sp=False).sp is False


def test_derived_defaults_are_the_catalogues_and_settle_writes_only_the_settled_ones():
    assert {n for n, k in knobs.CATALOGUE.items() if k.auto} == {"sp", "tp_comm_overlap"}
    where = knobs.Where("h100", 8192, "nemo2")
    values = {n: k.default for n, k in knobs.CATALOGUE.items()} | {"tp": 4, "recompute_modules": "mlp,core_attn"}
    knobs.settle(values, where)
    assert values["sp"] is None and knobs.effective("sp", values) is True  # read as tp > 1, recorded as unset
    assert values["tp_comm_overlap"] is True  # NVIDIA ships a bf16 userbuffer config for H100, 8192 wide, tp 4
    assert values["recompute_modules"] == "core_attn,mlp"
    assert knobs.settle({**values, "tp_comm_overlap": None, "tp": 3}, where)["tp_comm_overlap"] is False


def test_moe_knobs_are_the_catalogues_moe_only_entries():
    assert knobs.MOE_KNOBS == {
        "etp",
        "moe_dispatcher",
        "moe_grouped_gemm",
        "moe_a2a_overlap",
        "moe_permute_fusion",
        "moe_token_drop",
    }
    assert all(knobs.CATALOGUE[n].moe_only for n in knobs.MOE_KNOBS) and "ep" not in knobs.MOE_KNOBS


def test_every_calibration_column_of_a_knob_comes_from_the_catalogue():
    with open("bench/data/h200_real_runs.tsv") as f:
        header = f.readline().rstrip("\n").split("\t")
    with open("bench/data/moe_gpu_runs.tsv") as f:
        header += f.readline().rstrip("\n").split("\t")
    columns = {n for n, k in knobs.CATALOGUE.items() if k.column}
    # every knob named by a shipped TSV's header is read by its catalogue column, and each column is in one
    assert {h for h in header if h in knobs.CATALOGUE} == columns
    row = {h: "" for h in header} | {"tp": "2", "pp": "1", "mbs": "1", "gbs": "8", "seq_length": "4096"}
    row |= {"recompute": "none", "num_experts": "8", "moe_grouped_gemm": "False", "ep": "4"}
    values = knob_values_from_row(row)
    assert set(values) == columns
    assert values["attention_backend"] == "local" and values["precision"] == knobs.BF16  # empty cells
    assert values["ep"] == 4 and values["moe_grouped_gemm"] is False and values["moe_dispatcher"] == "alltoall"
    dense = knob_values_from_row({**row, "num_experts": "0"})
    assert not set(dense) & {n for n, k in knobs.CATALOGUE.items() if k.column and k.column.moe}


def test_bf16_is_one_constant():
    assert knobs.CATALOGUE["precision"].default == knobs.BF16 and knobs.BF16 in knobs.NEMO2_PRECISION


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
    assert {f.name: f.default for f in dataclasses.fields(knobs.KnobValues)} == {
        n: k.default for n, k in knobs.CATALOGUE.items()
    }
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


def test_the_knob_example_design_names_is_four_code_files_at_most():
    """DESIGN.md's "how to add a knob" names a commit and its --stat: at most four code files (tests and docs aside),
    and, in a checkout that has the commit, the files git lists for it."""
    root = Path(__file__).resolve().parent.parent
    found = re.search(
        r"is\s+commit ([0-9a-f]{7,40}), four code files.*?```text\n(.*?)```", (root / "DESIGN.md").read_text(), re.S
    )
    assert found, "DESIGN.md names no knob example commit"
    commit, stat = found.groups()
    files = [line.split("|")[0].strip() for line in stat.splitlines() if "|" in line]
    code = [f for f in files if not f.startswith(("tests/", "docs/"))]
    assert "dse/knobs.py" in code and len(code) <= 4  # the catalogue's path at that commit (now dse/facts/knobs.py)
    shown = subprocess.run(
        ["git", "show", "--stat=200", "--format=", commit], cwd=root, capture_output=True, text=True, check=False
    )
    if shown.returncode == 0:  # a shallow clone may not hold the commit
        assert [line.split("|")[0].strip() for line in shown.stdout.splitlines() if "|" in line] == files
