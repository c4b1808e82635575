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
    assert d["tokens_per_s_per_gpu"] == pytest.approx(512 * 4096 / (d["step_time_s"] * 16))
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
