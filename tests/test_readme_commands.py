"""The README's commands run as written: every ``dse`` command in a fenced block is either run here (in
README order, in one scratch directory that sees the repository's ``conf/``, ``tests/`` and ``bench/``, on
the simulated backend) or listed in :data:`NOT_RUN` with the reason (it needs a cluster, a GPU, or a file
the user brings). A new command in the README fails :func:`test_every_readme_command_is_run_or_excused`
until it is one or the other. Where the README shows a command's output, the output is compared too."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# one worker under xdist: the commands run in README order in one scratch directory (a later one reads what an
# earlier one wrote)
pytestmark = pytest.mark.xdist_group("readme_commands")

# command (as extracted) prefix -> why it is not run here
NOT_RUN = {
    "dse calibrate runs/my_study": "a placeholder: the user's own study directory",
    "dse dry-run --space my_space.toml": "a placeholder: the user's own space file",
    "dse run --space my_space.toml": "a placeholder: the user's own space file, on their cluster",
    "dse run --space conf/spaces/llama3_70b_2node_space.toml --out runs/w1 --storage postgresql": "needs a PostgreSQL server (.ci/postgres/up.sh); tests/test_workers.py runs workers on one",
    "dse run --space tests/data/spaces/llama3_70b_16l_local_slurm.toml --backend slurm": "needs the local Slurm cluster (.ci/slurm/up.sh); tests/test_slurm_backend.py runs this space",
}


def blocks(text: str) -> list[list[str]]:
    """The ``dse`` commands of each fenced block, continuation lines joined, comments dropped; the quick
    start's ``... && .venv/bin/dse run ...`` counts as its ``dse run``."""
    out = []
    for body in re.findall(r"^```[\w-]*\n(.*?)^```", text, re.M | re.S):
        cmds = []
        for line in body.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                part = part.split("  #")[0].strip()
                if part.startswith(".venv/bin/dse "):
                    part = part[len(".venv/bin/") :]
                if part.startswith("dse "):
                    cmds.append(" ".join(part.split()))
        out.append(cmds)
    return out


def commands() -> list[str]:
    return [c for b in blocks(README.read_text()) for c in b]


def excused(cmd: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if cmd.startswith(prefix)), None)


def shown_output(cmd: str) -> str | None:
    """The fenced block right after the block whose last command is ``cmd``, when the prose between them
    says it is what the command prints ("... prints:")."""
    text = README.read_text()
    bodies = list(re.finditer(r"^```[\w-]*\n(.*?)^```", text, re.M | re.S))
    for a, b in zip(bodies, bodies[1:]):
        cmds = blocks(a.group(0))[0]
        if cmds and cmds[-1] == cmd and text[a.end() : b.start()].rstrip().endswith("prints:"):
            return b.group(1)
    return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for name in ("conf", "tests", "bench", "recipes"):
        (d / name).symlink_to(ROOT / name)
    return d


def test_every_readme_command_is_run_or_excused():
    cmds = commands()
    assert len(cmds) >= 8  # the extraction finds the README's commands
    assert shown_output("dse leaderboard runs/llama3_70b_2node --top 5")  # and the output it shows
    for prefix in NOT_RUN:
        assert any(c.startswith(prefix) for c in cmds), f"NOT_RUN names a command the README lost: {prefix}"


@pytest.mark.parametrize("cmd", [c for c in commands() if excused(c) is None])
def test_readme_command_runs_as_written(cmd, scratch, monkeypatch):
    monkeypatch.chdir(scratch)
    # absolute /tmp paths (the dry-run example's --out) go to the scratch directory instead
    args = [str(scratch / a[len("/tmp/") :]) if a.startswith("/tmp/") else a for a in shlex.split(cmd)[1:]]
    if args[0] == "run":
        assert "--backend" not in args or args[args.index("--backend") + 1] == "sim"
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, f"{cmd}\n{r.output}"
    expected = shown_output(cmd)
    if expected is not None:
        got = "\n".join(line.rstrip() for line in r.stdout.splitlines())
        assert got.strip("\n") == expected.strip("\n")
