"""The reproducer workflow on twins: the 2-node reproducer's grid, ``dse calibrate`` on it, then the full-scale
study with ``dse run --calibration``; the twins of the two spaces share the seed's physics draws."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from dse.cli import app
from dse.perfmodel.calibrate import calibrated_params
from dse.perfmodel.model import predict
from dse.perfmodel.timing import DEFAULT_PARAMS
from dse.perfmodel.twin import make_twin, valid_trials
from dse.rules.space import load_space

runner = CliRunner()
SPACES = Path(__file__).resolve().parent.parent / "conf" / "spaces"
REPRO, FULL = SPACES / "llama3_70b_2node_space.toml", SPACES / "llama3_70b_space.toml"


def _memory_error(space, twin, trials, params) -> float:
    """Mean relative error of the model's peak memory against the twin's over ``trials``."""
    return float(
        np.mean([abs(predict(t, params=params).peak_memory_gib / twin.predict(t).peak_memory_gib - 1) for t in trials])
    )


def test_calibrating_on_the_reproducer_twin_teaches_the_full_scale_study(tmp_path):
    repro, cal, full = tmp_path / "repro", tmp_path / "cal.toml", tmp_path / "full"
    r = runner.invoke(app, ["run", "--space", str(REPRO), "--agent", "grid", "--twin-seed", "3", "--out", str(repro)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["calibrate", str(repro), "--out", str(cal)])
    assert r.exit_code == 0, r.output
    args = ["run", "--space", str(FULL), "--agent", "guided", "--twin-seed", "3", "--calibration", str(cal)]
    r = runner.invoke(app, [*args, "--trials", "6", "--out", str(full)])
    assert r.exit_code == 0, r.output
    meta = (full / "dse.json").read_text()
    assert hashlib.sha256(cal.read_bytes()).hexdigest() in meta  # the study ran with the calibration
    # what the reproducer taught transfers: the full space's twin (same seed: same memory reserve, fragmentation
    # and fitted parameters) is predicted far better by the calibrated model than by the shipped one
    space = load_space(FULL)
    trials = valid_trials(space)[::20]
    twin = make_twin(space, 3)
    calibrated = _memory_error(space, twin, trials, calibrated_params(str(cal)))
    assert calibrated < 0.5 * _memory_error(space, twin, trials, DEFAULT_PARAMS)


def test_a_calibration_that_does_not_load_is_one_line(tmp_path):
    r = runner.invoke(app, ["run", "--space", str(FULL), "--calibration", str(tmp_path / "no.toml")])
    assert r.exit_code == 2 and "--calibration: calibration file not found" in r.output
    assert "Traceback" not in r.output


def test_a_calibration_of_another_gpu_is_refused(tmp_path):
    repro, cal = tmp_path / "repro", tmp_path / "cal.toml"
    assert runner.invoke(app, ["run", "--space", str(REPRO), "--agent", "grid", "--out", str(repro)]).exit_code == 0
    assert runner.invoke(app, ["calibrate", str(repro), "--out", str(cal)]).exit_code == 0
    h200 = SPACES / "llama3_8b_4l_h200_te_space.toml"
    r = runner.invoke(app, ["run", "--space", str(h200), "--calibration", str(cal), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "calibrated on h100, not on h200" in r.output, r.output
    r = runner.invoke(app, ["run", "--space", str(FULL), "--systems", "h100,b200", "--calibration", str(cal)])
    assert r.exit_code == 2 and "--calibration" in r.output and "--systems" in r.output


def test_the_twins_of_two_spaces_share_the_seeds_physics():
    a, b = make_twin(load_space(REPRO), 5), make_twin(load_space(FULL), 5)
    assert a.params == b.params and a.params != make_twin(load_space(FULL), 6).params
    assert a.params != DEFAULT_PARAMS  # drawn around the shipped parameters, not equal to them
