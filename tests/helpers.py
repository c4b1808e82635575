"""Small builders shared by tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

SMALL_SPACE = """
name = "small"
recipe = "llama3_70b_16l"
system = "h100"
num_nodes = 2

[settings]
seq_length = 4096
gbs = 32
max_steps = 20

[knobs]
tp = [1, 2, 4, 8]
pp = [1, 2, 4]
vp = [1, 2]
mbs = [1, 2]

[objective]
metric = "tflops_per_gpu"

[search]
agent = "grid"
seed = 0
screen = "none"  # the tests of the loop want its OOM points launched; the memory screen has its own tests
"""


def write_space(tmp_path: Path, text: str = SMALL_SPACE, name: str = "space.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def dse(*args, cwd: Path | None = None):
    """``dse ARGS`` as a user types it, run in this process through Typer's CliRunner (from ``cwd`` when given):
    the result's ``exit_code``, ``stdout`` and ``stderr`` are what the terminal would show, without starting an
    interpreter (tests/test_cli_smoke.py runs the real ``python -m dse`` and ``dse`` entry points)."""
    import contextlib
    import os

    from typer.testing import CliRunner

    from dse.cli import app

    with contextlib.chdir(cwd or os.getcwd()):
        return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(r, *needles: str) -> str:
    """``r`` is how bad input ends: exit code 2, one line on stderr that contains each of ``needles``, no
    traceback. Returns the line."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
