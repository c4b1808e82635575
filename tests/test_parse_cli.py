"""`dse parse LOG [--json]` on every fixture log (typer's CliRunner)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dse.cli import app
from tests.test_parse import FIXTURES, LOGS

runner = CliRunner()
KEYS = ["status", "reason", "step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib", "steps", "loss"]


@pytest.mark.parametrize(("name", "status", "steps", "partial", "reason"), FIXTURES)
def test_parse_json_on_fixture(name, status, steps, partial, reason):
    res = runner.invoke(app, ["parse", str(LOGS / name), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert list(d)[: len(KEYS)] == KEYS
    assert (d["status"], d["steps"], d["partial"]) == (status, steps, partial)
    if reason is None:
        assert d["reason"] is None
    else:
        assert reason in d["reason"]


@pytest.mark.parametrize(("name", "status", "steps", "partial", "reason"), FIXTURES)
def test_parse_text_on_fixture(name, status, steps, partial, reason):
    res = runner.invoke(app, ["parse", str(LOGS / name)])
    assert res.exit_code == 0, res.output
    lines = dict(line.split(": ", 1) for line in res.output.splitlines())
    assert lines["status"] == status
    assert lines["steps"] == str(steps)
    for k in KEYS:
        assert k in lines


def test_parse_context_flags():
    res = runner.invoke(
        app,
        [
            "parse",
            str(LOGS / "megatron_lm_ok.log"),
            "--json",
            "--gbs",
            "512",
            "--seq-length",
            "4096",
            "--num-gpus",
            "16",
        ],
    )
    d = json.loads(res.output)
    # both figures rounded to 6 significant digits
    assert d["tokens_per_s_per_gpu"] == pytest.approx(512 * 4096 / (d["step_time_s"] * 16), rel=2e-5)
    res = runner.invoke(app, ["parse", str(LOGS / "megatron_lm_ok.log"), "--json"])
    assert json.loads(res.output)["tokens_per_s_per_gpu"] is None


def test_parse_exit_code_and_scheduler_state_flags():
    res = runner.invoke(app, ["parse", str(LOGS / "nemo2_ok.log"), "--json", "--exit-code", "137"])
    d = json.loads(res.output)
    assert (d["status"], d["partial"]) == ("failed", True)
    res = runner.invoke(app, ["parse", str(LOGS / "nemo2_ok.log"), "--json", "--scheduler-state", "TIMEOUT"])
    assert json.loads(res.output)["status"] == "timeout"


def test_parse_text_prints_null_for_unknown():
    res = runner.invoke(app, ["parse", str(LOGS / "no_metrics.log")])
    assert "step_time_s: null" in res.output
    assert "peak_memory_gib: null" in res.output


def test_parse_missing_file_is_a_user_error(tmp_path):
    missing = tmp_path / "no" / "log.txt"
    res = runner.invoke(app, ["parse", str(missing)])
    assert res.exit_code == 2
    assert "no such log file" in res.output
    assert str(missing) in res.output
    assert "Traceback" not in res.output


def test_parse_nvls_warning_in_a_completed_run_is_ok(tmp_path):
    """NCCL's NVLS set-up warning (``Cuda failure 'out of memory'``, then a fallback) in a completed run."""
    lines = (LOGS / "nemo2_ok.log").read_text().splitlines(keepends=True)
    lines.insert(2, "0: node1:1:1 [0] transport/nvls.cc:158 NCCL WARN Cuda failure 'out of memory'\n")
    p = tmp_path / "log.txt"
    p.write_text("".join(lines))
    res = runner.invoke(app, ["parse", str(p), "--json", "--exit-code", "0", "--scheduler-state", "COMPLETED"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert (d["status"], d["reason"], d["steps"]) == ("ok", None, 12)


def test_parse_json_figures_are_rounded_as_the_log_carries_them():
    res = runner.invoke(app, ["parse", str(LOGS / "nemo2_ok.log"), "--json", "--exit-code", "0"])
    assert '"step_time_s": 4.206,' in res.output  # the mean of logged step times, not 4.2059999999999995
    d = json.loads(res.output)
    assert all(len(f"{v:.15g}".replace(".", "").lstrip("0")) <= 6 for v in d.values() if isinstance(v, float))


def test_a_bare_log_says_its_exit_code_is_unknown():
    d = json.loads(runner.invoke(app, ["parse", str(LOGS / "nemo2_ok.log"), "--json"]).output)
    assert d["exit_code"] is None and any("exit code unknown" in n for n in d["notes"])
    assert d["status"] == "ok"  # judged by what ended the log
    text = runner.invoke(app, ["parse", str(LOGS / "nemo2_ok.log")]).output
    assert "exit_code: null" in text and "note: exit code unknown" in text
    known = json.loads(runner.invoke(app, ["parse", str(LOGS / "nemo2_ok.log"), "--json", "--exit-code", "0"]).output)
    assert known["exit_code"] == 0 and not any("exit code unknown" in n for n in known["notes"])


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A small simulated study whose gbs, sequence length and GPUs only its dse.json knows."""
    from tests.helpers import write_space

    tmp = tmp_path_factory.mktemp("study")
    out = tmp / "out"
    res = runner.invoke(app, ["run", "--space", str(write_space(tmp)), "--out", str(out), "--trials", "6"])
    assert res.exit_code == 0, res.output
    return out


def test_parse_of_a_trial_directory_takes_gbs_sequence_and_gpus_from_dse_json(study):
    import pandas as pd

    board = pd.read_csv(study / "leaderboard.csv")
    best = board[board.status == "ok"].iloc[0]
    d = json.loads(runner.invoke(app, ["parse", str(study / best.run_dir), "--json"]).output)
    # tests/helpers.SMALL_SPACE: gbs 32, seq_length 4096, 2 nodes of 8 GPUs
    assert d["tokens_per_s_per_gpu"] == pytest.approx(32 * 4096 / (d["step_time_s"] * 16), rel=2e-5)
    assert d["tokens_per_s_per_gpu"] == pytest.approx(best.tokens_per_s_per_gpu, rel=1e-5)
    assert any("dse.json" in n for n in d["notes"])
    flags = ["--gbs", "64", "--seq-length", "4096", "--num-gpus", "16", "--json"]
    given = json.loads(runner.invoke(app, ["parse", str(study / best.run_dir), *flags]).output)
    assert given["tokens_per_s_per_gpu"] == pytest.approx(2 * d["tokens_per_s_per_gpu"], rel=2e-5)  # flags win


def test_parse_of_a_study_directory_reads_its_best_trial(study):
    best = json.loads((study / "best" / "best.json").read_text())
    d = json.loads(runner.invoke(app, ["parse", str(study), "--json"]).output)
    assert d["status"] == "ok" and d["tokens_per_s_per_gpu"] is not None
    assert f"the study's best trial: {best['run_dir']}" in d["notes"]
    assert d["tflops_per_gpu"] == pytest.approx(best["metrics"]["tflops_per_gpu"], rel=1e-5)


def test_parse_of_a_study_without_a_best_is_one_line(tmp_path):
    from tests.helpers import one_line_error

    (tmp_path / "dse.json").write_text("{}")
    one_line_error(runner.invoke(app, ["parse", str(tmp_path)]), "study directory without a best trial")
