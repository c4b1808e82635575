"""``dse export``: a study written into another tool's storage (Optuna's, for optuna-dashboard; Minari's, for
offline reinforcement learning)."""

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
    from dse.results.export import to_optuna

    name, n = to_optuna(study_dir, storage)
    render.console.print(f"wrote study {name!r} ({n} trials) to {storage}", highlight=False)


def minari_cmd(
    study_dir: Path = typer.Argument(..., metavar="STUDY_DIR", help="a dse run's output directory"),
    dataset_id: str | None = typer.Option(
        None, "--dataset-id", metavar="ID", help="the Minari dataset id (default: dse/<study name>/study-v0)"
    ),
    space: str | None = typer.Option(
        None, "--space", metavar="FILE", help="the study's space file (default: the one its dse.json names)"
    ),
    datasets_path: Path | None = typer.Option(
        None, "--datasets-path", metavar="DIR", help="where Minari keeps datasets (default: $MINARI_DATASETS_PATH)"
    ),
) -> None:
    """Write the study as a Minari dataset: one episode of dse/Recipe-v0, one step per trial (the rl extra)."""
    from dse.results.offline import to_minari

    ds = to_minari(study_dir, dataset_id, space=space, datasets_path=datasets_path)
    render.console.print(
        f"wrote Minari dataset {ds.spec.dataset_id!r} ({ds.total_steps} steps, 1 episode)", highlight=False
    )
