"""``dse train-policy``: a learned search policy (experimental) trained on twins of a space, for ``agent = "policy"``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from dse.cli import render


def train_policy_cmd(
    space: str = typer.Argument(
        ..., metavar="SPACE", help="a space file (small enough to walk: every point is ranked)"
    ),
    out: Path = typer.Option(
        ...,
        "--out",
        metavar="FILE",
        help="the policy file to write ([search.options] policy = FILE); an existing file only with --force",
    ),
    twins: int = typer.Option(
        8, "--twins", metavar="N", help="twins trained on, one per environment (seeds 1000..), 1 to 64"
    ),
    steps: int = typer.Option(60_000, "--steps", metavar="N", help="PPO environment steps in all, 64 to 10,000,000"),
    budget: int = typer.Option(50, "--budget", metavar="N", help="launched runs per training episode"),
    seed: int = typer.Option(0, "--seed", metavar="N", help="PPO's seed, 0 to 2**32-1"),
    force: bool = typer.Option(False, "--force", help="replace an existing --out file"),
) -> None:
    """Train a search policy (PPO, Stable-Baselines3; the rl extra) on twins of SPACE; experimental. The output
    is checked before training."""
    # PPO's small MLP trains about twice as fast on one CPU thread as on torch's default pool (measured: 4,096
    # steps on nemotron3_8b in 6 s against 13 s); set before torch loads, and a user's own setting wins
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dse.rl.training import train_policy

    t0 = time.perf_counter()
    done = train_policy(space, out, twins=twins, steps=steps, seed=seed, budget=budget, force=force)
    render.console.print(
        f"trained on twins {done.twins[0]}..{done.twins[-1]} ({done.steps:,} steps, "
        f"{time.perf_counter() - t0:.0f} s); policy: {done.path}",
        highlight=False,
    )
