"""``dse import``: another tool's files converted into a dse space (CloudAI's NeMoRun tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dse.cli import render
from dse.errors import UserError


def cloudai_cmd(
    test_file: Path = typer.Argument(..., metavar="TEST_FILE", help="CloudAI NeMoRun test or test-scenario TOML"),
    system: Optional[Path] = typer.Option(None, "--system", metavar="PATH", help="CloudAI Slurm system TOML"),
    out: Path = typer.Option(..., "--out", metavar="PATH",
                             help="the dse space to write (a system file goes beside it)"),
    gpu: Optional[str] = typer.Option(None, "--gpu", metavar="TEXT",
                                      help="GPU generation (CloudAI's files do not name it)"),
    test: Optional[str] = typer.Option(None, "--test", metavar="TEXT",
                                       help="the [[Tests]] id to import from a scenario of several"),
) -> None:
    """Write a dse space (and with --system a dse system file) from CloudAI's NeMoRun test and Slurm system."""
    from dse.importers.cloudai import import_cloudai
    from dse.space import load_space

    imported = import_cloudai(test_file, system_path=system, gpu=gpu, out=out, test_id=test)
    # everything is built and validated before the first byte is written
    files = {out: imported.space_text}
    if imported.system_text is not None and imported.system_file:
        files[out.parent / imported.system_file] = imported.system_text
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.write_text(text)
    except OSError as e:
        raise UserError(f"cannot write: {e}", file=str(out)) from None
    try:
        space = load_space(out)  # the written file itself must load; if not, leave nothing behind
    except UserError:
        for path in files:
            path.unlink(missing_ok=True)
        raise
    render.imported(files, space, imported)
