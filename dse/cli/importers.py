"""``dse import``: another tool's files converted into a dse space (CloudAI's NeMoRun tests)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from dse.cli import render
from dse.errors import UserError


def cloudai_cmd(
    test_file: Path = typer.Argument(..., metavar="TEST_FILE", help="CloudAI NeMoRun test or test-scenario TOML"),
    system: Path | None = typer.Option(None, "--system", metavar="PATH", help="CloudAI Slurm system TOML"),
    out: Path = typer.Option(
        ..., "--out", metavar="PATH", help="the dse space to write (a system file goes beside it)"
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", metavar="TEXT", help="GPU generation (CloudAI's files do not name it)"
    ),
    test: str | None = typer.Option(
        None, "--test", metavar="TEXT", help="the [[Tests]] id to import from a scenario of several"
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing --out (and the system file beside it)"),
) -> None:
    """Write a dse space (and with --system a dse system file) from CloudAI's NeMoRun test and Slurm system."""
    from dse.importers.cloudai import import_cloudai
    from dse.rules.space import load_space

    imported = import_cloudai(test_file, system_path=system, gpu=gpu, out=out, test_id=test)
    # Everything is built, written and loaded in a scratch directory before anything of the user's is replaced:
    # a space that does not load leaves the user's files as they were.
    files = imported.files(out)
    _check_targets(list(files), force)
    with tempfile.TemporaryDirectory(prefix=".dse-import-", dir=out.parent if out.parent.is_dir() else None) as tmp:
        scratch = Path(tmp) / out.name
        imported.write(scratch)
        load_space(scratch)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        imported.write(out)
    except OSError as e:
        raise UserError(f"cannot write: {e}", file=str(out)) from None
    space = load_space(out)
    render.imported(files, space, imported)


def _check_targets(paths: list[Path], force: bool) -> None:
    """Refuse to replace a file that is there (the space, or the system file beside it) unless ``--force``; a
    directory or a non-file is never replaced."""
    for p in paths:
        if p.is_dir() or (p.exists() and not p.is_file()):
            raise UserError("is not a file; give the path of the space to write", file=str(p), field="--out")
        if (p.exists() or p.is_symlink()) and not force:
            raise UserError("already exists; pass --force to replace it (or another --out)", file=str(p), field="--out")
