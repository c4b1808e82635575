"""The report as a person sees it: rendered in real headless Chromium, with no console error, every plot
drawn with data, every table within a 1400 px page, and no literal ``None``/``nan`` on the page."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.results import report
from dse.study.loop import open_store
from tests.report_browser import chromium, probe

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _study(tmp_path: Path, space: str, *args: str) -> Path:
    out = tmp_path / Path(space).stem
    r = runner.invoke(app, ["run", "--space", str(ROOT / "conf/spaces" / space), "--out", str(out), *args])
    assert r.exit_code == 0, r.output
    return out


def _check(found: dict, *, plots: int) -> None:
    assert found["errors"] == [], found["errors"]
    assert len(found["plots"]) >= plots, found["plots"]
    for p in found["plots"]:
        assert p["points"] > 0 and p["drawn"] > 0, f"plot drew no data: {p}"
        if p["title"].startswith("Parallel coordinates"):  # its title on its axes' titles was unreadable
            assert p["titleBottom"] is not None and p["titleBottom"] <= p["headsTop"], f"title on the axes': {p}"
    assert max(found["tables"]) <= 1400, f"a table is wider than the page: {found['tables']}"
    words = set(found["text"].split())
    assert not words & {"None", "nan", "NaN"}, words & {"None", "nan", "NaN"}


def test_quick_start_study_report_in_chromium(tmp_path):
    chromium()
    out = _study(tmp_path, "llama3_405b_space.toml", "--trials", "40")
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    shot = tmp_path / "report.png"
    found = probe(out / "report.html", tmp_path, screenshot=shot)
    _check(found, plots=5)
    assert "launch command" in found["text"] and "Failures by class" in found["text"]
    assert shot.stat().st_size > 10_000
    assert str(tmp_path) not in found["text"] and str(ROOT) not in found["text"]  # the page names no machine path


def test_step_time_study_report_plots_seconds_in_chromium(tmp_path):
    """A minimising study (``step_time_s``): every plot of the objective names step time on its axis, and the best
    so far, as Chromium draws it, only goes down."""
    chromium()
    from tests.helpers import SMALL_SPACE, write_space

    space = write_space(tmp_path, SMALL_SPACE.replace('metric = "tflops_per_gpu"', 'metric = "step_time_s"'))
    out = tmp_path / "steps"
    r = runner.invoke(app, ["run", "--space", str(space), "--out", str(out), "--agent", "random", "--trials", "16"])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    found = probe(out / "report.html", tmp_path)
    _check(found, plots=6)
    by_trial = next(p for p in found["plots"] if "by trial" in p["title"])
    assert by_trial["ytitle"] == "step time (s)" and "lower is better" in by_trial["title"]
    best = [y for y in by_trial["best"] if y is not None]
    assert best and all(y > 0 for y in best), best  # seconds, not the reward's negative seconds
    assert all(b <= a for a, b in zip(best, best[1:])) and best[-1] < best[0], best
    knob_plots = [
        p for p in found["plots"] if p["title"].startswith("step time (s) by ") and "by trial" not in p["title"]
    ]
    assert len(knob_plots) == 4 and all(p["ytitle"] == "step time (s)" for p in knob_plots), knob_plots
    assert "Parallel coordinates: knobs against step time (s) (ok trials)" in [p["title"] for p in found["plots"]]
    assert "predicted by the performance model" in found["text"]


def test_failed_heavy_study_report_in_chromium(tmp_path):
    """Two thirds of the trials failed, in every class, with long reasons: still one readable page."""
    chromium()
    out = _study(tmp_path, "llama3_70b_2node_space.toml", "--agent", "random", "--trials", "24", "--seed", "3")
    store, meta = open_store(out)
    recs = store.records()
    store.close()
    classes = [
        ("oom", "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity; " * 3),
        ("nccl_error", "NCCL watchdog thread terminated with exception: collective operation timeout"),
        ("timeout", "job exceeded its time limit"),
        ("rejected", "tp*cp must divide the GPUs of a node"),
    ]
    failed = [
        dataclasses.replace(r, status=classes[i % 4][0], reason=classes[i % 4][1], reward=0.0, metrics={})
        if i % 3
        else r
        for i, r in enumerate(recs)
    ]
    page = tmp_path / "failed.html"
    report.write(failed, meta, page)
    found = probe(page, tmp_path)
    _check(found, plots=3)
    for status, _ in classes:
        assert status in found["text"]


def test_all_failed_study_report_in_chromium(tmp_path):
    chromium()
    meta = {"study_name": "nothing", "knobs": {"tp": [2, 4]}}
    from dse.study.store import TrialRecord

    recs = [TrialRecord(i, {"tp": 2}, "oom", 0.0, "CUDA out of memory", {}, f"/r/{i}", "h100", 8) for i in range(3)]
    page = tmp_path / "none.html"
    report.write(recs, meta, page)
    found = probe(page, tmp_path)
    assert found["errors"] == [] and "No trial succeeded." in found["text"]
    assert all(p["drawn"] > 0 for p in found["plots"] if p["points"])


def test_compare_page_in_chromium(tmp_path):
    chromium()
    from tests.helpers import write_space

    out = tmp_path / "gen"
    r = runner.invoke(
        app,
        [
            "run",
            "--space",
            str(write_space(tmp_path)),
            "--systems",
            "h100,b200,gb200",
            "--out",
            str(out),
            "--agent",
            "random",
            "--trials",
            "6",
        ],
    )
    assert r.exit_code == 0, r.output
    found = probe(out / "compare.html", tmp_path)
    _check(found, plots=1)
    assert "Across generations" in found["text"] and "(baseline)" in found["text"]
    import pandas as pd

    for changed in pd.read_csv(out / "compare.csv").changed_knobs:  # whole on the page, within its width
        assert changed in found["text"], changed


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_slurm_study_report_and_compare_in_chromium(tmp_path):
    """A study through the local Slurm cluster: its report in Chromium, and `dse compare` against a sim study."""
    chromium()
    from dse.rules.space import load_space
    from dse.study import loop as study
    from tests.trials import DATA

    space = load_space(DATA / "spaces" / "llama3_70b_16l_local_slurm.toml")
    slurm_out = tmp_path / "slurm"
    study.run_study(space, study.Request(out_dir=slurm_out, agent="grid", backend="slurm"))
    study.run_study(space, study.Request(out_dir=tmp_path / "sim", agent="grid", backend="sim"))
    assert runner.invoke(app, ["report", str(slurm_out)]).exit_code == 0
    _check(probe(slurm_out / "report.html", tmp_path), plots=2)
    r = runner.invoke(app, ["compare", str(slurm_out), str(tmp_path / "sim"), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    _check(probe(tmp_path / "compare.html", tmp_path), plots=1)
