"""``dse calibrate`` checks its input before fitting: wrong units, conflicting repeats, values out of their
ranges, oversized files and a fit the model cannot follow are one-line refusals, and no file is written that the
calibration reader would refuse."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from tests.helpers import dse, one_line_error

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "bench" / "data" / "h200_real_runs.tsv"
MOE = ROOT / "bench" / "data" / "moe_gpu_runs.tsv"


def _rows(src: Path = REAL) -> list[dict]:
    with open(src, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _write(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]), delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def _edit(rows: list[dict], i: int, **values) -> list[dict]:
    return [{**r, **values} if j == i else r for j, r in enumerate(rows)]


def _scaled(rows: list[dict], column: str, factor: float) -> list[dict]:
    return [{**r, column: str(float(r[column]) * factor)} for r in rows]


CASES = {
    "tp 0": (lambda rows: _edit(rows, 1, tp="0"), "tp"),
    "tp -2": (lambda rows: _edit(rows, 1, tp="-2"), "tp"),
    "0 layers": (lambda rows: _edit(rows, 1, num_layers="0"), "num_layers"),
    "mbs 0": (lambda rows: _edit(rows, 1, mbs="0"), "mbs"),
    "hidden 1e9": (lambda rows: _edit(rows, 1, hidden_size="1e9"), "hidden_size"),
    "hidden 10^9": (lambda rows: _edit(rows, 1, hidden_size="1000000000"), "hidden_size"),
    "5000 digits": (lambda rows: _edit(rows, 1, gbs="9" * 5000), "gbs"),
    "empty tp": (lambda rows: _edit(rows, 1, tp=""), "tp"),
    "step times in seconds": (lambda rows: _scaled(rows, "step_time_ms", 1e-3), "a unit error"),
    "step times in ns": (lambda rows: _scaled(rows, "step_time_ms", 1e6), "a unit error"),
    "1e308": (lambda rows: _edit(rows, 2, step_time_ms="1e308"), "a unit error"),
    "memory in bytes": (lambda rows: _scaled(rows, "peak_allocated_gib", 2**30), "peak memory"),
    "conflicting repeats": (lambda rows: rows + _scaled(rows[:1], "step_time_ms", 3.0), "repeats that disagree"),
    "unknown gpu": (lambda rows: [{**r, "gpu": "z9000"} for r in rows], "not a GPU dse knows"),
    "unknown payload": (lambda rows: _edit(rows, 1, payload="mcore;rm -rf /"), "is not a payload"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_calibration_rows_are_one_line_and_write_nothing(tmp_path, case):
    edit, needle = CASES[case]
    src = _write(tmp_path / "runs.tsv", edit(_rows()))
    out = tmp_path / "cal.toml"
    args = (
        ("calibrate", src, "--out", out) if case == "unknown gpu" else ("calibrate", src, "--gpu", "h200", "--out", out)
    )
    one_line_error(dse(*args), needle)
    assert not out.exists()


@pytest.mark.parametrize("column", ["ep", "etp", "num_experts"])
def test_a_moe_row_with_a_zero_or_negative_parallelism_is_refused(tmp_path, column):
    rows = [r for r in _rows(MOE) if r["gpu"] == "NVIDIA H200"]  # calibrate takes one GPU's runs at a time
    i = next(i for i, r in enumerate(rows) if int(r["num_experts"] or 0) > 0)
    src = _write(tmp_path / "moe.tsv", _edit(rows, i, **{column: "-1"}))
    out = tmp_path / "cal.toml"
    one_line_error(dse("calibrate", src, "--out", out), column)
    assert not out.exists()


def test_repeats_that_agree_are_one_run(tmp_path):
    from dse.perfmodel.calibrate import load_runs

    src = _write(tmp_path / "runs.tsv", _rows() * 40)
    runs, _ = load_runs([src], "h200")
    assert len(runs) == len(_rows())


def test_an_oversized_tsv_is_refused_before_it_is_parsed(tmp_path):
    from dse.perfmodel.calibrate import MAX_TSV_BYTES

    rows = _rows()
    src = _write(tmp_path / "big.tsv", rows * (2 * MAX_TSV_BYTES // len(REAL.read_bytes())))
    one_line_error(dse("calibrate", src, "--gpu", "h200", "--out", tmp_path / "c.toml"), "at most")


def test_a_fit_outside_the_parameters_ranges_writes_nothing(tmp_path):
    """One run and one parameter: the step time is blamed on it alone, past what its range allows."""
    rows = _rows()[:1]
    src = _write(tmp_path / "one.tsv", _scaled(rows, "step_time_ms", 4.0))
    out = tmp_path / "cal.toml"
    one_line_error(dse("calibrate", src, "--gpu", "h200", "--out", out), "outside its range", "nothing written")
    assert not out.exists()


def test_1e308_in_a_leaderboard_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the study names its space file relative to where it ran
    study = tmp_path / "study"
    shutil.copytree(ROOT / "bench" / "data" / "h200_local_study", study)
    board = study / "leaderboard.csv"
    lines = board.read_text().splitlines()
    head = lines[0].split(",")
    first = lines[1].split(",")
    first[head.index("step_time_s")] = "1e308"
    board.write_text("\n".join([lines[0], ",".join(first), *lines[2:]]) + "\n")
    out = tmp_path / "cal.toml"
    one_line_error(dse("calibrate", study, "--out", out), "leaderboard.csv", "a unit error")
    assert not out.exists()


def test_more_distinct_runs_than_a_calibration_fits_are_refused_before_the_fit(tmp_path):
    from dse.perfmodel.calibrate import MAX_RUNS

    rows = _rows()
    many = [{**rows[i % len(rows)], "gbs": str(8 * (1 + i))} for i in range(MAX_RUNS + 1)]
    src = _write(tmp_path / "many.tsv", many)
    one_line_error(dse("calibrate", src, "--gpu", "h200", "--out", tmp_path / "c.toml"), f"at most {MAX_RUNS}")
    assert not (tmp_path / "c.toml").exists()
