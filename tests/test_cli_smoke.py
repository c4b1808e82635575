"""The ``dse`` command as the operating system starts it: ``python -m dse`` and the installed ``dse`` entry
point, in real subprocesses. Everything else about the command runs in-process (tests.helpers.dse)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from tests.helpers import SMALL_SPACE, write_space


def python_m_dse(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dse", *map(str, args)], capture_output=True, text=True, timeout=120)


def test_python_m_dse_help_lists_every_command():
    r = python_m_dse("--help")
    assert r.returncode == 0, r.stderr
    for cmd in (
        "recipes",
        "run",
        "compare",
        "leaderboard",
        "validate",
        "space",
        "report",
        "parse",
        "predict",
        "calibrate",
        "dry-run",
        "import",
    ):
        assert f"\n  {cmd} " in r.stdout, cmd


def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path):
    path = write_space(tmp_path, SMALL_SPACE.replace("tp = [1, 2, 4, 8]", "tq = [1, 2]"))
    r = python_m_dse("run", "--space", path, "--out", tmp_path / "out")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(path) in lines[0] and "tq" in lines[0] and r.stdout == ""
    assert not (tmp_path / "out").exists()


def test_the_installed_entry_point_runs():
    exe = Path(sys.executable).parent / "dse"  # pip installs the console script beside the interpreter
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"dse {version('dse')}", r.stderr
