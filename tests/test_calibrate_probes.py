"""``dse calibrate`` takes probes: a ``dse probe --out DIR`` (its probes.csv and the probe.json naming the space) or
a study's ``probes/probes.csv`` (screen = "probe"). Each probe is one pipeline stage's peak (or out-of-memory end)
and step time, compared with the model's figures of that stage: its peak, and its compute alone (a probe skips every
collective and never waits for another stage), so probes fit the compute terms and leave communication and the
bubble to the model."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path

import pytest

from dse.perfmodel.calibrate import errors, load_runs
from dse.perfmodel.timing import DEFAULT_PARAMS
from tests.helpers import dse, one_line_error

ROOT = Path(__file__).resolve().parent.parent
DSE_PROBE = ROOT / "bench/data/h100_dse_probe"
SCREEN = ROOT / "bench/data/h100_probe_screen"


def _probe_dir(tmp_path: Path) -> Path:
    """The H100's `dse probe` of the 64-GPU Llama 3 70B space (its probe.json names the space relative to it)."""
    assert json.loads((DSE_PROBE / "l70b" / "probe.json").read_text())["space"] == "../l70b_probe_space.toml"
    out = tmp_path / "l70b"
    shutil.copytree(DSE_PROBE / "l70b", out)
    (out / "probe.json").write_text(json.dumps({"space": str(DSE_PROBE / "l70b_probe_space.toml")}))
    return out


def test_the_shipped_probes_calibrate_as_docs_say():
    """docs/probe.md: dse calibrate bench/data/h100_dse_probe/l70b: the probes' peaks against the model's allocator
    part of their stage (2.0% shipped, 2.1% fitted), their step times against its compute of the stage (2.8% shipped,
    2.4% fitted)."""
    from dse.perfmodel.calibrate import calibrate

    cal, _ = calibrate([DSE_PROBE / "l70b"], loo=False)
    assert cal.runs == 4
    assert round(cal.fit["before"]["memory_mape"], 1) == 2.0 and round(cal.fit["after"]["memory_mape"], 1) == 2.1
    assert round(cal.fit["before"]["step_time_mape"], 1) == 2.8 and round(cal.fit["after"]["step_time_mape"], 1) == 2.4


def test_probes_are_stage_peaks_the_model_is_measured_against(tmp_path):
    out = _probe_dir(tmp_path)
    runs, gpu = load_runs([out])
    rows = list(csv.DictReader((out / "probes.csv").read_text().splitlines()))
    assert gpu == "h100" and [r.stage for r in runs] == ["first", "last", "first", "last"]
    assert [r.step_time_s for r in runs] == [pytest.approx(float(row["step_time_s"])) for row in rows]
    assert [r.peak_memory_gib for r in runs] == [pytest.approx(float(row["peak_memory_gib"])) for row in rows]
    # the model's error on them is against each probed stage's figure as dse probe gives it beside a probe: the
    # allocator's part (the probes.csv here recorded the model of its day)
    from dse.probe import model_stage_gib

    want = statistics.fmean(
        abs(model_stage_gib(r.trial)[r.stage] - r.peak_memory_gib) / r.peak_memory_gib for r in runs
    )
    assert errors(runs, DEFAULT_PARAMS)["memory_mape"] == pytest.approx(100 * want, rel=1e-6)


def test_dse_calibrate_fits_the_model_to_probes_alone(tmp_path):
    """The four H100 probes of Llama 3 70B (64 GPUs): their step times fit the compute terms, their peaks the memory
    terms, and the report shows each probed rank beside the model's figures of its stage, shipped and fitted."""
    out = _probe_dir(tmp_path)
    r = dse("calibrate", str(out), "--out", str(tmp_path / "cal.toml"))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "4 runs on h100" in text and "memory_fragmentation" in text and "elementwise_scale" in text
    st_before, st_after = (
        float(x) for x in text.split("step-time MAPE ")[1].split(" fitted")[0].replace("%", "").split(" shipped -> ")
    )
    mem_after = float(text.split("peak memory ")[1].split(" -> ")[1].split("%")[0])
    assert st_after < st_before and mem_after < 5
    assert "probe of point 0 rank 56" in text and "last" in text
    assert (tmp_path / "cal.toml").is_file()


def test_a_probes_step_is_the_stages_compute_alone():
    """The model's figure for a probe's step time leaves out what a fake process group skips: on the 64-GPU 70B
    layout (TP 8, PP 8) the whole step's bubble, pipeline and data-parallel traffic and tensor-parallel collectives;
    the last stage adds its output layer and loss to the first's layers."""
    from dse.perfmodel.calibrate import probe_rows, run_step_s
    from dse.perfmodel.model import prepare

    runs, _ = load_runs([DSE_PROBE / "l70b"])
    p = prepare(runs[0].trial)
    whole = p.step_time(DEFAULT_PARAMS)
    first, last = (run_step_s(p, DEFAULT_PARAMS, s) for s in ("first", "last"))
    assert first < last < whole.step_s - whole.bubble_s
    assert run_step_s(p, DEFAULT_PARAMS, None) == whole.step_s
    rows = probe_rows(runs, DEFAULT_PARAMS, DEFAULT_PARAMS)
    assert [r["stage"] for r in rows] == ["first", "last", "first", "last"]
    assert rows[0]["model_step_time_s"] == pytest.approx(first) and rows[0]["step_time_s"] > 1.0


def test_a_probed_studys_probes_join_its_runs(tmp_path):
    """The H100 study with screen = "probe": its one launched run, and its 4 probes (2 peaks, 2 out of memory),
    its screened points not counted again as runs."""
    study = tmp_path / "study"
    shutil.copytree(SCREEN / "study", study)
    shutil.copy(SCREEN / "grid_probe_space.toml", study)
    runs, _ = load_runs([study])
    assert [(r.name.split(" rank")[0], r.stage, r.oom) for r in runs] == [
        ("trial 1", None, False),
        ("probe of point 0", "first", False),
        ("probe of point 1", "first", False),
        ("probe of point 2", "first", True),
        ("probe of point 3", "first", True),
    ]


def test_a_probe_directory_without_its_space_is_refused_in_one_line(tmp_path):
    out = _probe_dir(tmp_path)
    (out / "probe.json").write_text(json.dumps({"space": str(tmp_path / "gone.toml")}))
    one_line_error(dse("calibrate", str(out), "--out", str(tmp_path / "c.toml")), "probe.json", "not found")
    (out / "probe.json").write_text("[1]")
    one_line_error(dse("calibrate", str(out), "--out", str(tmp_path / "c.toml")), "not a probe.json")
    assert not (tmp_path / "c.toml").exists()
