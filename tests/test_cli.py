"""The dse command as a user meets it: exit codes, one-line errors, nothing written on bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from dse.cli import app
from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space

runner = CliRunner()


@pytest.mark.parametrize(
    "edit",
    [
        ("tp = [1, 2, 4, 8]", "tq = [1, 2]"),
        ("tp = [1, 2, 4, 8]", 'tp = ["x"]'),
        ('recipe = "llama3_70b_16l"', 'recipe = "gpt5"'),
        ('system = "h100"', 'system = "tpu"'),
        ("num_nodes = 2", "num_nodes = -1"),
        ("[knobs]", "[knobs"),
    ],
)
def test_bad_space_exits_2_with_one_line_and_writes_nothing(tmp_path, edit):
    path = write_space(tmp_path, SMALL_SPACE.replace(*edit))
    out = tmp_path / "out"
    one_line_error(dse("run", "--space", path, "--out", out), str(path))
    assert not out.exists()


def test_bad_agent_or_sampler_writes_nothing(tmp_path):
    path = write_space(tmp_path)
    for args in (["--agent", "gird"], ["--agent", "optuna", "--sampler", "tpx"]):
        r = runner.invoke(app, ["run", "--space", str(path), "--out", str(tmp_path / "o"), *args])
        assert r.exit_code == 2 and "did you mean" in r.output
        assert not (tmp_path / "o").exists()


def test_run_then_leaderboard_csv(tmp_path):
    path = write_space(tmp_path)
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", "--space", str(path), "--out", str(out), "--agent", "random", "--trials", "12"])
    assert r.exit_code == 0, r.output
    assert (out / "leaderboard.csv").exists() and (out / "study.db").exists()
    csv = tmp_path / "lb.csv"
    r = runner.invoke(app, ["leaderboard", str(out), "--csv", str(csv), "--top", "3"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(csv)
    assert list(df.columns[:8]) == [
        "trial",
        "status",
        "reward",
        "step_time_s",
        "tflops_per_gpu",
        "tokens_per_s_per_gpu",
        "peak_memory_gib",
        "mfu",  # after the older metrics: the columns before it keep their places
    ]
    assert list(df.columns[8:10]) == ["predicted_step_time_s", "predicted_peak_memory_gib"]  # the model's
    assert list(df.columns[10:13]) == ["backend", "truth", "calibration"]  # where the figures come from
    assert list(df.columns[13:17]) == ["tp", "pp", "vp", "mbs"]
    assert {"gpu", "num_gpus", "run_dir"} <= set(df.columns)
    assert len(df) == 12
    ok = df[df.status == "ok"]
    assert list(ok.reward) == sorted(ok.reward, reverse=True)  # ranked by reward
    assert (df.status != "ok").tolist() == sorted((df.status != "ok").tolist())  # failures last
    assert (ok.reward == ok.tflops_per_gpu).all()


def test_leaderboard_of_a_non_study_dir_exits_2(tmp_path):
    r = runner.invoke(app, ["leaderboard", str(tmp_path)])
    assert r.exit_code == 2 and "not a dse output directory" in r.output


def test_validate_and_space(tmp_path):
    good = write_space(tmp_path)
    r = runner.invoke(app, ["validate", str(good), "conf/spaces/llama3_405b_space.toml"])
    assert r.exit_code == 0 and r.output.count("ok") >= 2
    bad = write_space(tmp_path, SMALL_SPACE.replace("tp =", "tpp ="), name="bad.toml")
    r = runner.invoke(app, ["validate", str(good), str(bad)])
    assert r.exit_code == 2 and "bad.toml" in r.output
    r = runner.invoke(app, ["space", str(good), "--json"])
    data = json.loads(r.output)
    assert data["raw"] == 48 and data["valid"] + sum(data["rejected_by_rule"].values()) == 48
    assert data["rejected_by_rule"]["vp_needs_pp"] > 0


def test_recipes_lists_all_six():
    r = runner.invoke(app, ["recipes"])
    for name in ("llama3_8b", "llama3_70b", "llama3_405b", "nemotron3_8b", "nemotron4_15b", "nemotron4_340b"):
        assert name in r.output


def test_report_is_self_contained_html_with_the_best_configuration(tmp_path):
    path = write_space(tmp_path)
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", "--space", str(path), "--out", str(out), "--agent", "grid"]).exit_code == 0
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    text = (out / "report.html").read_text()
    lb = pd.read_csv(out / "leaderboard.csv")
    best_section = text.split("<h2>Best configuration</h2>")[1].split("<h2>")[0]
    cells = "".join(f"<td>{lb.iloc[0][k]}</td>" for k in ("tp", "pp", "vp", "mbs"))
    assert cells in best_section and json.loads((out / "best" / "best.json").read_text())["argv"][0] in best_section
    assert text.count("<script>/**") == 1  # plotly.js embedded once, so it opens offline
    board = text.split("<h2>Leaderboard</h2>")[1]
    assert board.count("<tr") == len(lb) + 1  # header + one row per trial


def test_unknown_backend_is_one_line_and_writes_nothing(tmp_path):
    path = write_space(tmp_path)
    r = runner.invoke(app, ["run", "--space", str(path), "--out", str(tmp_path / "o"), "--backend", "slurn"])
    assert r.exit_code == 2 and "did you mean 'slurm'" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["run", "--trials", "abc"], ["'--trials'", "run --help"]),
        (["run", "--bogus"], ["--bogus", "run --help"]),
        (["run", "--space"], ["'--space' requires an argument", "run --help"]),
        (["import", "cloudai"], ["Missing argument", "import cloudai --help"]),
        (["export", "optuna", "--x"], ["--x", "export optuna --help"]),
        (["frob"], ["No such command 'frob'", " --help"]),
    ],
)
def test_usage_errors_are_one_line(args, needles):
    """Click's usage errors (an unknown option or command, a value of the wrong type, a missing argument) end as
    every bad input does: one line naming what was wrong and where the help is, exit code 2."""
    line = one_line_error(dse(*args), *needles)
    assert line.startswith("error: ") and "Usage:" not in line


def test_no_arguments_still_prints_the_help():
    r = dse()
    assert "Commands:" in r.output and "error" not in r.output


def test_the_study_csv_and_the_export_are_the_same_table(tmp_path):
    """``leaderboard.csv`` and ``dse leaderboard DIR --csv FILE`` write the same table: ``run_dir`` relative to the
    study directory in both (a moved study's tables stay right), ``steps`` and ``num_gpus`` integers even beside a
    rejected or screened trial that has none."""
    import csv as csvlib
    from pathlib import Path

    path = write_space(tmp_path)
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", "--space", str(path), "--out", str(out), "--agent", "optuna", "--trials", "12"])
    assert r.exit_code == 0, r.output
    export = tmp_path / "export.csv"
    assert runner.invoke(app, ["leaderboard", str(out), "--csv", str(export)]).exit_code == 0
    study_text, export_text = (out / "leaderboard.csv").read_text(), export.read_text()
    assert study_text == export_text
    rows = list(csvlib.DictReader(study_text.splitlines()))
    assert any(row["steps"] == "" for row in rows), "optuna proposes rejected points: they ran no step"
    launched = [row for row in rows if row["steps"]]
    assert launched and all(row["steps"].isdigit() and row["num_gpus"].isdigit() for row in launched)
    for row in launched:
        assert not Path(row["run_dir"]).is_absolute() and (out / row["run_dir"]).is_dir()
