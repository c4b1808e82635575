"""A baseline in every study: the recipe's default layout measured first (or predicted when the space lacks it),
the best's gain over it in the summary, the report and ``dse compare``; the ``mfu`` column."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dse.facts.hardware import HARDWARE
from dse.rules.space import load_space
from dse.study import loop as study_mod
from dse.study.leaderboard import Baseline, Summary
from dse.study.store import TrialRecord

SHIPPED = Path(__file__).resolve().parents[1] / "conf" / "spaces" / "llama3_70b_space.toml"
# the 70B space lists bf16 and fp8: the baseline is the recipe's layout at the precision the model predicts faster
DEFAULT = {"tp": 4, "pp": 8, "vp": 5, "cp": 1, "mbs": 1, "recompute": "none", "precision": "fp8"}


def _space(tmp_path: Path, tp: str = "[1, 2, 4, 8]"):
    text = SHIPPED.read_text().replace("tp = [1, 2, 4, 8]", f"tp = {tp}")
    path = tmp_path / "space.toml"
    path.write_text(text)
    return load_space(path)


def test_baseline_in_the_space_runs_first_and_the_summary_says_the_gain(tmp_path):
    space = _space(tmp_path)
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="random", trials=5))
    meta = json.loads((tmp_path / "out" / "dse.json").read_text())
    assert meta["baseline"]["in_space"] and meta["baseline"]["knobs"] == DEFAULT
    first = min(res.records, key=lambda r: r.number)
    assert first.number == 0 and first.knobs == DEFAULT  # measured before the agent proposes
    line = res.summary.baseline_line()
    best, base = res.summary.best.metrics["tflops_per_gpu"], first.metrics["tflops_per_gpu"]
    if res.summary.best.number == 0:
        assert line == "the best is NVIDIA's preset for h100/fp8 itself (trial 0)"
    else:
        # the simulated backend's figures are the model's: the gain says so
        assert (
            line
            == f"{best / base - 1:+.1%} over NVIDIA's preset for h100/fp8 (trial 0): predicted (simulated, truth exact)"
        )


def test_a_resumed_study_does_not_run_its_baseline_again(tmp_path):
    space = _space(tmp_path)
    study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="random", trials=2))
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="random", trials=4, resume=True))
    assert sum(r.knobs == DEFAULT for r in res.records) == 1


def test_baseline_outside_the_space_is_predicted_and_shown_as_a_reference(tmp_path):
    space = _space(tmp_path, "[1, 2, 8]")
    base = study_mod.baseline_of(space)
    assert not base.in_space and base.knobs["tp"] == 4 and "tp not among the space's values" in base.note
    from dse.perfmodel import predict
    from dse.rules.trial import resolve

    assert base.predicted["tflops_per_gpu"] == pytest.approx(
        predict(resolve(space, {"precision": "fp8"})).tflops_per_gpu
    )
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="random", trials=3))
    assert all(r.knobs["tp"] != 4 for r in res.records)  # never launched
    line = res.summary.baseline_line()
    gain = res.summary.best.metrics["tflops_per_gpu"] / base.predicted["tflops_per_gpu"] - 1
    assert line.startswith(f"{gain:+.1%} over NVIDIA's preset for h100/fp8 as the model predicts it (")
    assert "not measured: tp not among the space's values" in line


def test_screened_baseline_says_so():
    base = Baseline(DEFAULT, True, "tflops_per_gpu", "maximize")
    s = Summary(5, baseline=base)
    s.add(TrialRecord(0, DEFAULT, "screened", 0.0, reason="predicted peak memory 99 GiB > 80 GiB"))
    s.add(TrialRecord(1, {**DEFAULT, "tp": 8}, "ok", 500.0, metrics={"tflops_per_gpu": 500.0}))
    assert s.baseline_line() == (
        "the recipe's layout (trial 0, tp=4, pp=8, vp=5, cp=1, mbs=1, recompute=none, precision=fp8) was "
        "screened: predicted peak memory 99 GiB > 80 GiB"
    )


def test_gain_of_a_minimised_metric_is_the_speed_up():
    base = Baseline(DEFAULT, True, "step_time_s", "minimize")
    assert base.gain(best=9.0, base=10.0) == pytest.approx(10.0 / 9.0 - 1)


def test_mfu_is_tflops_over_the_dense_peak_of_the_runs_precision(tmp_path):
    space = _space(tmp_path)
    study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="random", trials=8))
    lb = pd.read_csv(tmp_path / "out" / "leaderboard.csv")
    cols = list(lb.columns)
    assert cols.index("mfu") == cols.index("peak_memory_gib") + 1
    ok = lb[lb.status == "ok"]
    assert len(ok) and {"bf16", "fp8"} & set(ok.precision)
    h100 = HARDWARE["h100"]
    for _, row in ok.iterrows():
        peak = h100.fp8_tflops if row.precision == "fp8" else h100.bf16_tflops
        assert row.mfu == pytest.approx(row.tflops_per_gpu / peak)
    assert lb[lb.status != "ok"].mfu.isna().all()


def test_the_baseline_takes_the_precision_the_model_predicts_faster(tmp_path):
    """A space listing bf16 and fp8: the recipe's fp8 layout (NVIDIA's, predicted faster), not bf16's; a space of
    bf16 alone: the recipe's bf16 layout."""
    from dse.perfmodel import predict
    from dse.rules.trial import resolve

    both = _space(tmp_path)
    assert both.knobs["precision"] == ["bf16", "fp8"]
    fast = {p: predict(resolve(both, {"precision": p})).tflops_per_gpu for p in ("bf16", "fp8")}
    assert fast["fp8"] > fast["bf16"] and study_mod.baseline_of(both).knobs["precision"] == "fp8"
    text = SHIPPED.read_text().replace('precision = ["bf16", "fp8"]', 'precision = ["bf16"]')
    assert text != SHIPPED.read_text()
    (tmp_path / "bf16.toml").write_text(text)
    base = study_mod.baseline_of(load_space(tmp_path / "bf16.toml"))
    assert base.knobs["precision"] == "bf16" and (base.knobs["pp"], base.knobs["cp"]) == (4, 2)


def test_a_predicted_baseline_is_never_launched(tmp_path):
    """``[search] baseline = "predict"``: the recipe's layout, though in the space, is the model's reference only."""
    text = SHIPPED.read_text().replace("[search]", '[search]\nbaseline = "predict"')
    assert text != SHIPPED.read_text()
    (tmp_path / "p.toml").write_text(text)
    space = load_space(tmp_path / "p.toml")
    base = study_mod.baseline_of(space)
    assert not base.in_space and base.predicted and base.note == '[search] baseline = "predict"'
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid", trials=3))
    assert all(r.knobs != base.knobs for r in res.records)
    assert '; not measured: [search] baseline = "predict")' in res.summary.baseline_line()


SPACES = sorted((Path(__file__).resolve().parents[1] / "conf" / "spaces").glob("*.toml"))


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_every_shipped_space_has_a_baseline_with_a_figure_and_says_which_layout_it_is(path):
    """Measured first (in the space) or predicted: never "no prediction". Where dse ships NVIDIA's preset for the
    GPU and precision, the baseline is that preset and says so; otherwise it says it is the recipe's layout."""
    space = load_space(path)
    base = study_mod.baseline_of(space)
    assert base.in_space or (base.predicted or {}).get(space.objective.metric), (base.note, base.knobs)
    recipe = space.recipe_obj
    precision = base.knobs.get("precision", space.settings.get("precision", "bf16"))
    if not recipe.scaled_from and f"{space.system.gpu}/{precision}" in recipe.defaults:
        assert base.source == f"NVIDIA's preset for {space.system.gpu}/{precision}"
    else:
        assert base.source.startswith("the recipe's layout (")


@pytest.mark.parametrize("name", ["llama3_405b_gb300_nvfp4_space", "llama3_70b_b300_nvfp4_space"])
def test_an_nvfp4_space_runs_nvidias_nvfp4_preset_first(name):
    """The recipe leaves cuda_graph_scope at "full", which with no CUDA graph is the same run as the space's first
    listed scope: the baseline is NVIDIA's NVFP4 preset, in the space, not a broken BF16 layout."""
    space = load_space(Path(__file__).resolve().parents[1] / "conf" / "spaces" / f"{name}.toml")
    base = study_mod.baseline_of(space)
    gpu = space.system.gpu
    preset = space.recipe_obj.defaults[f"{gpu}/nvfp4"]
    assert base.in_space and base.knobs["precision"] == "nvfp4" and base.source == f"NVIDIA's preset for {gpu}/nvfp4"
    assert (base.knobs["tp"], base.knobs["pp"], base.knobs["vp"]) == (preset.tp, preset.pp, preset.vp)
    assert base.knobs["cuda_graph"] == "none" and base.knobs["cuda_graph_scope"] == space.knobs["cuda_graph_scope"][0]


def test_the_summary_names_the_preset():
    base = Baseline(DEFAULT, True, "tflops_per_gpu", "maximize", source="NVIDIA's preset for h100/fp8")
    s = Summary(5, baseline=base)
    s.add(TrialRecord(0, DEFAULT, "ok", 400.0, metrics={"tflops_per_gpu": 400.0}))
    s.add(TrialRecord(1, {**DEFAULT, "tp": 8}, "ok", 500.0, metrics={"tflops_per_gpu": 500.0}))
    assert s.baseline_line() == "+25.0% over NVIDIA's preset for h100/fp8 (trial 0): measured"
    # a dse.json written before dse said which layout it is
    assert Baseline.of_meta({"baseline": {"knobs": DEFAULT}}).source == "the recipe's layout"
