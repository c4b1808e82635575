"""``--help`` reads as written (no ``<bool>`` for a flag, no help text eaten as markup) and ``--version``."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from dse.cli import app


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"dse {version('dse')}"


@pytest.mark.parametrize("cmd", [[], ["run"], ["leaderboard"], ["predict"], ["calibrate"], ["dry-run"], ["parse"],
                                 ["report"], ["import", "cloudai"]], ids=lambda c: " ".join(c) or "dse")
def test_help_has_no_type_placeholders(cmd):
    r = CliRunner().invoke(app, [*cmd, "--help"], terminal_width=200)
    assert r.exit_code == 0
    assert "--help" in r.output  # Typer's own --help (and the app's --version) included
    assert "<bool>" not in r.output and "list[Path]" not in r.output


def test_help_texts_keep_their_brackets():
    out = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    assert "[search].agent" in out and "[backend].kind" in out


def test_predict_layout_flags_have_descriptions():
    out = CliRunner().invoke(app, ["predict", "--help"], terminal_width=200).output
    line = next(ln for ln in out.splitlines() if "--tp " in ln)
    assert "tensor-parallel size" in line and " N " in line
