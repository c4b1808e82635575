"""Every figure says where it came from: ``leaderboard.csv``'s ``backend``, ``truth`` and ``calibration``
columns, the terminal summary's line, and ``best/`` ("predicted by the model" for a simulated best, "measured"
for one the local backend ran)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from dse.rules.space import load_space
from dse.study.leaderboard import HEAD, SIMULATED_NOTE, Provenance
from tests.helpers import SMALL_SPACE, dse, write_space
from tests.test_parse import LOGS

PROVENANCE = ["backend", "truth", "calibration"]


def run(tmp_path: Path, text: str = SMALL_SPACE, *extra: str):
    out = tmp_path / "out"
    r = dse("run", "--space", write_space(tmp_path, text), "--out", out, "--trials", "6", *extra)
    assert r.exit_code == 0, r.output
    return out, r


def test_a_simulated_study_says_its_figures_are_predicted(tmp_path):
    out, r = run(tmp_path)
    board = pd.read_csv(out / "leaderboard.csv")
    assert list(board.columns[: len(HEAD) + 3]) == [*HEAD, *PROVENANCE]  # after the metrics, before the knobs
    assert set(board.backend) == {"sim"} and set(board.truth) == {"exact"} and set(board.calibration) == {"none"}
    assert f"{SIMULATED_NOTE} (sim backend, truth exact, calibration none)" in " ".join(r.stdout.split())
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["figures"] == "predicted by the model"
    assert best["provenance"] == {"backend": "sim", "truth": "exact", "calibration": "none"}
    readme = (out / "best" / "README").read_text()
    assert "predicted by the model, not measured" in readme
    assert "(the trial's, predicted by the model)" in readme  # the time limit's step time is the model's too
    again = dse("leaderboard", out, "--csv", tmp_path / "all.csv")  # the same columns from dse.json
    assert again.exit_code == 0 and SIMULATED_NOTE in " ".join(again.stdout.split())
    assert pd.read_csv(tmp_path / "all.csv")[PROVENANCE].equals(board[PROVENANCE])


def test_a_twin_truth_names_its_seed_and_uses_no_calibration(tmp_path):
    out, _ = run(tmp_path, SMALL_SPACE + '\n[backend]\nkind = "sim"\ntruth = "twin"\ntwin_seed = 3\n')
    board = pd.read_csv(out / "leaderboard.csv")
    assert set(board.truth) == {"twin (seed 3)"} and set(board.calibration) == {"none"}
    assert "twin (seed 3)" in (out / "best" / "README").read_text()


def test_a_calibrated_model_is_named_by_its_file(tmp_path):
    space = load_space(write_space(tmp_path))
    calibrated = space.model_copy(
        update={"backend": space.backend.model_copy(update={"calibration": str(tmp_path / "h100_cal.toml")})}
    )
    assert Provenance.of_space(calibrated, "sim") == Provenance("sim", "exact", "h100_cal.toml")
    # the sim payload under the local backend prints the (calibrated) model's figures too; no twin there
    sim_payload = calibrated.model_copy(update={"backend": calibrated.backend.model_copy(update={"payload": "sim"})})
    assert Provenance.of_space(sim_payload, "local") == Provenance("local", "exact", "h100_cal.toml")
    assert Provenance.of_space(space, "slurm") == Provenance("slurm")  # measured: no truth, no calibration


def test_a_study_recorded_before_provenance_reads_as_unknown():
    assert Provenance.of_meta({"backend": "sim"}) == Provenance("sim", "unknown", "unknown")
    assert not Provenance.of_meta({"backend": "slurm"}).simulated


FAKE_TORCHRUN = f"#!/bin/bash\ncat {LOGS / 'nemo2_ok.log'}\n"  # the trainer's log, as a real run printed it
LOCAL = """
name = "loc"
recipe = "llama3_8b_4l"
system = "h100"
num_nodes = 1

[settings]
seq_length = 2048
gbs = 8
max_steps = 12

[knobs]
tp = [1, 2]

[search]
agent = "grid"

[backend]
kind = "local"
payload = "nemo2"

[backend.early_stop]  # the local backend runs launch.sh (torchrun) when it follows the log
enabled = true
min_steps = 1000
poll_s = 0.1
"""


def test_a_local_backend_study_says_its_figures_are_measured(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out, r = run(tmp_path, LOCAL)
    board = pd.read_csv(out / "leaderboard.csv")
    assert set(board.status) == {"ok"} and set(board.backend) == {"local"}
    assert board.truth.isna().all() and board.calibration.isna().all()  # empty: measured figures
    assert "measured: local backend" in r.stdout and SIMULATED_NOTE not in r.stdout
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["figures"] == "measured" and best["provenance"]["backend"] == "local"
    readme = (out / "best" / "README").read_text()
    assert "Its figures were measured (local backend)." in readme and "figures were predicted" not in readme
    assert "(the trial's, measured)" in readme


@pytest.mark.parametrize("truth", ["exact", "twin"])
def test_dse_json_records_the_provenance(tmp_path, truth):
    out, _ = run(tmp_path, SMALL_SPACE + f'\n[backend]\nkind = "sim"\ntruth = "{truth}"\n')
    meta = json.loads((out / "dse.json").read_text())
    assert meta["provenance"]["backend"] == "sim" and meta["provenance"]["truth"].startswith(truth)
