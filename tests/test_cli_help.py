"""``--help`` reads as written (no ``<bool>`` for a flag, no type placeholder where a metavar names the value, no
help text eaten as markup) and ``--version``."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import typer
from typer.testing import CliRunner

from dse.cli import app


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"dse {version('dse')}"


@pytest.mark.parametrize(
    "cmd",
    [
        [],
        ["run"],
        ["leaderboard"],
        ["predict"],
        ["calibrate"],
        ["dry-run"],
        ["parse"],
        ["report"],
        ["import", "cloudai"],
    ],
    ids=lambda c: " ".join(c) or "dse",
)
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


def _commands(group, path=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_option_that_takes_a_value_names_it():
    """A new option without a metavar would show Typer's ``<int>``/``<path>`` placeholder: each option of every
    command is a flag or has a metavar (N, TEXT, PATH...)."""
    commands = dict(_commands(typer.main.get_command(app)))
    assert {("run",), ("predict",), ("import", "cloudai")} <= set(commands)
    for path, cmd in commands.items():
        for p in cmd.params:
            if p.param_type_name == "option":
                assert p.is_flag or p.metavar, (" ".join(path), p.name)


def test_docstrings_keep_their_brackets():
    out = " ".join(CliRunner().invoke(app, ["predict", "--help"], terminal_width=200).output.split())
    assert "--payload is the space's [backend] payload: what that payload's code does" in out
