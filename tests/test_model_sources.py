"""The leave-one-source-out protocol of bench/model_sources.py: every published row names its source, sources do not
straddle one row id's container, the folds hold each source out of the fit that predicts it, and at least one whole
source stays out of every shipped fit. The accuracy figures themselves are bench output, not tests."""

from __future__ import annotations

import re

import pytest

from bench import model_accuracy, model_heldout, model_moe, model_sources
from dse.perfmodel import DEFAULT_PARAMS

TABLES = {
    "calibration": model_accuracy.load_rows(),
    "held-out": model_heldout.load_rows(),
    "moe": model_moe.load_rows(),
}
KEY = re.compile(r"(bridge|nemo)-\d\d\.\d\d(\.\d\d)?(-long)?|llama3-paper|megatron-lm-2021|dgxc-benchmarking")


def test_every_row_names_its_source():
    for name, rows in TABLES.items():
        for r in rows:
            assert KEY.fullmatch(r["source_key"]), (name, r["id"], r["source_key"])
            assert r["source"].strip(), (name, r["id"])


def test_a_container_source_holds_only_its_containers_rows():
    """A container summary's rows carry its release in their id (mb2604_..., nemo2502_...)."""
    for rows in TABLES.values():
        for r in rows:
            m = re.fullmatch(r"(bridge|nemo)-(\d\d)\.(\d\d)(?:\.(\d\d))?(-long)?", r["source_key"])
            if m:
                prefix = ("mb" if m[1] == "bridge" else "nemo") + m[2] + m[3] + (m[4] or "")
                assert r["id"].split("_")[0] == prefix, r["id"]


def test_some_source_is_out_of_every_shipped_fit():
    fitted = {r["source_key"] for rows in TABLES.values() for r in rows if r["id"] in model_sources.dense_fit_ids()}
    fitted |= {r["source_key"] for r in TABLES["moe"] if r["split"] == "fit"}
    every = {r["source_key"] for rows in TABLES.values() for r in rows}
    assert every - fitted  # e.g. bridge-26.04.01 and bridge-26.06
    assert fitted  # and the fits do see some


def test_a_source_outside_the_dense_fit_keeps_the_shipped_parameters():
    rows = model_sources.dense_rows()
    assert model_sources.dense_fold("bridge-26.06", rows) is DEFAULT_PARAMS


def test_the_moe_fold_never_sees_its_source(monkeypatch):
    seen = []
    monkeypatch.setattr(model_moe, "fit", lambda rows, base: seen.extend(rows) or base)
    rows = model_sources.moe_rows()
    model_sources.moe_fold("bridge-26.04", rows, DEFAULT_PARAMS)
    assert seen and all(r["source_key"] != "bridge-26.04" for r in seen)
    assert {r["split"] for r in seen} == {"fit"}
    assert len(seen) == sum(1 for x in rows if x["row"]["source_key"] != "bridge-26.04")


def test_a_row_stating_no_fp8_recipe_runs_its_container_familys():
    by_id = {r["id"]: r for r in TABLES["held-out"]}
    nemo24 = by_id["nemo2407_h100_llama3_8b"]  # "not stated", NeMo 24.07: Transformer Engine 1.x
    assert nemo24["fp8_recipe"] == "not stated"
    assert model_heldout.fp8_recipe(nemo24) == "delayed"
    assert model_heldout.row_trial(nemo24).layout.fp8_recipe == "delayed"
    assert model_heldout.fp8_recipe({**nemo24, "fp8_recipe": "cs"}) == "tensorwise"  # what a row states wins
    cal = {r["id"]: r for r in TABLES["calibration"]}
    assert model_accuracy.row_trial(cal["nemo2407_h100_70b"]).layout.fp8_recipe == "delayed"
    assert model_accuracy.row_trial(cal["mb2511_h100_8b"]).layout.fp8_recipe == "tensorwise"


def test_the_folds_can_be_narrowed_to_named_sources():
    out = model_sources.run_folds(
        model_sources.dense_rows(), model_sources.moe_rows(), refit_dense=False, only=("bridge-26.06",)
    )
    assert out and {x["row"]["source_key"] for x in out} == {"bridge-26.06"}
    assert all("pred" in x for x in out)


def test_an_unknown_source_is_refused_naming_the_known_ones():
    with pytest.raises(SystemExit, match="no published row has source_key nope; known: .*bridge-26.06"):
        model_sources.run_folds(model_sources.dense_rows(), [], refit_dense=False, only=("nope",))


def test_terms_prints_a_groups_rows_with_their_time_terms(capsys):
    model_sources.main(["--terms", "llama3_70b:h100"])
    out = capsys.readouterr().out
    rows = [x for x in model_sources.dense_rows() if (x["row"]["model"], x["row"]["gpu"]) == ("llama3_70b", "h100")]
    assert rows and all(x["row"]["id"] in out for x in rows)
    assert "layer_compute" in out and "published" in out and "predicted" in out
    assert "fold" not in out  # no folds are run


def test_terms_refuses_an_unknown_group_naming_the_known_ones():
    with pytest.raises(SystemExit, match="no published row is in group nope:h100; known: .*llama3_70b:h100"):
        model_sources.main(["--terms", "nope:h100"])


def test_sources_rho_ranks_each_layouts_first_source_against_its_last():
    """The published figures' own agreement in a group: a layout's figure in its first source (by key) against its
    last; a layout one source measured counts alike in both, and a group without any such layout has no figure."""

    def row(source: str, tokens: float) -> dict:
        return {"row": {"source_key": source, "tokens_per_s_per_gpu": str(tokens)}}

    lays = {
        "a": [row("bridge-26.02", 100.0), row("bridge-26.04", 300.0)],  # drift that swaps a and b
        "b": [row("bridge-26.02", 200.0), row("bridge-26.04", 150.0)],
        "c": [row("bridge-26.04", 400.0)],
    }
    assert model_sources.sources_rho(lays) == pytest.approx(0.5)
    assert model_sources.sources_rho({k: v for k, v in lays.items() if k == "c"}) is None
    steady = {"a": [row("bridge-26.02", 100.0), row("bridge-26.04", 110.0)], "b": [row("nemo-25.04", 200.0)]}
    assert model_sources.sources_rho(steady) == pytest.approx(1.0)
