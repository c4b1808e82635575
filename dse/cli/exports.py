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
    budget: int | None = typer.Option(
        None, "--budget", metavar="N", help="the episode's launched runs (default: the study's launched runs)"
    ),
) -> None:
    """Write the study as a Minari dataset: one episode of dse/Recipe-v0 by its rules (the rl extra)."""
    from dse.results.offline import to_minari

    ds = to_minari(study_dir, dataset_id, space=space, datasets_path=datasets_path, budget=budget)
    render.console.print(
        f"wrote Minari dataset {ds.spec.dataset_id!r} ({ds.total_steps} steps, 1 episode)", highlight=False
    )


def minari_suite_cmd(
    split: str = typer.Option("test", "--split", metavar="SPLIT", help="the suite's split: train, validation, test"),
    episodes: int = typer.Option(
        28, "--episodes", metavar="N", help="twins per benchmark (a replay: agent seeds), each played by every agent"
    ),
    agent: list[str] = typer.Option(
        ["random", "guided"], "--agent", metavar="NAME", help="an agent that plays (repeat; random and guided needed)"
    ),
    benchmark: list[str] = typer.Option(
        [], "--benchmark", metavar="ID", help="a suite id (repeat; default: every benchmark of the split)"
    ),
    prefix: str = typer.Option("dse/suite", "--prefix", metavar="NS", help="the datasets' namespace"),
    datasets_path: Path | None = typer.Option(
        None, "--datasets-path", metavar="DIR", help="where Minari keeps datasets (default: $MINARI_DATASETS_PATH)"
    ),
) -> None:
    """Write the suite as Minari datasets: per benchmark, one episode per twin and agent (the rl extra)."""
    from dse.results.offline import to_minari_suite

    def progress(dataset_id: str, n: int, ref: tuple[float, float]) -> None:
        render.console.print(
            f"wrote {dataset_id!r}: {n} episodes, reference returns random {ref[0]:.3f}, guided {ref[1]:.3f} (measured)",
            highlight=False,
        )

    out = to_minari_suite(
        split,
        episodes=episodes,
        agents=agent,
        only=benchmark or None,
        prefix=prefix,
        datasets_path=datasets_path,
        progress=progress,
    )
    render.console.print(
        f"{len(out.datasets)} datasets, {out.episodes} episodes in {out.seconds:.0f} s (measured)", highlight=False
    )
