"""``dse export``: a study written into another tool's storage (Optuna's, for optuna-dashboard)."""

from __future__ import annotations

from pathlib import Path

import typer

from dse.cli import render


def optuna_cmd(
    study_dir: Path = typer.Argument(..., metavar="STUDY_DIR", help="a dse run's output directory"),
    storage: str = typer.Option(
        ..., "--storage", metavar="URL", help="an Optuna storage: SQLAlchemy URL or journal file NAME.log"
    ),
) -> None:
    """Write the study into an Optuna storage (params, reward as value, FAIL for failures) for optuna-dashboard."""
    from dse.export import to_optuna

    name, n = to_optuna(study_dir, storage)
    render.console.print(f"wrote study {name!r} ({n} trials) to {storage}", highlight=False)
