"""``dse calibrate`` takes probes as memory observations: a ``dse probe --out DIR`` (its probes.csv and the
probe.json naming the space) or a study's ``probes/probes.csv`` (screen = "probe"). Each probe is one pipeline
stage's peak (or out-of-memory end), compared with the model's figure of that stage; it has no step time."""

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
    """docs/probe.md: dse calibrate bench/data/h100_dse_probe/l70b moves the peak-memory error from 4.5% to 3.0%."""
    from dse.perfmodel.calibrate import calibrate

    cal, _ = calibrate([DSE_PROBE / "l70b"], loo=False)
    assert cal.runs == 4
    assert round(cal.fit["before"]["memory_mape"], 1) == 4.5 and round(cal.fit["after"]["memory_mape"], 1) == 3.0


def test_probes_are_stage_peaks_the_model_is_measured_against(tmp_path):
    out = _probe_dir(tmp_path)
    runs, gpu = load_runs([out])
    rows = list(csv.DictReader((out / "probes.csv").read_text().splitlines()))
    assert gpu == "h100" and [r.stage for r in runs] == ["first", "last", "first", "last"]
    assert all(r.step_time_s is None for r in runs)
    assert [r.peak_memory_gib for r in runs] == [pytest.approx(float(row["peak_memory_gib"])) for row in rows]
    # the model's error on them is against each probed stage's figure, as dse probe printed it beside the probe
    want = statistics.fmean(
        abs(float(r["model_peak_memory_gib"]) - float(r["peak_memory_gib"])) / float(r["peak_memory_gib"]) for r in rows
    )
    assert errors(runs, DEFAULT_PARAMS)["memory_mape"] == pytest.approx(100 * want, rel=1e-6)


def test_dse_calibrate_fits_the_memory_model_to_probes_alone(tmp_path):
    out = _probe_dir(tmp_path)
    r = dse("calibrate", str(out), "--out", str(tmp_path / "cal.toml"))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "4 runs on h100" in text and "memory_fragmentation" in text and "elementwise" not in text
    before, after = (float(x) for x in text.split("peak memory ")[1].split(",")[0].replace("%", "").split(" -> "))
    assert after < before
    assert (tmp_path / "cal.toml").is_file()


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
