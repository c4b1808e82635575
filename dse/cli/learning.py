"""``dse train-policy``: a learned search policy (experimental) trained on twins of a space, for ``agent = "policy"``;
``dse bench-agents``: the agent leaderboard on twins, through the environment."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from dse.cli import render
from dse.errors import UserError


def train_policy_cmd(
    space: list[str] = typer.Argument(
        None,
        metavar="SPACE...",
        help="a space file (small enough to walk: every point is ranked); with --shortlist, the spaces trained on "
        "(default: the suite's training spaces)",
    ),
    out: Path = typer.Option(
        ...,
        "--out",
        metavar="FILE",
        help="the policy file to write ([search.options] policy = FILE); an existing file only with --force",
    ),
    twins: int = typer.Option(
        8,
        "--twins",
        metavar="N",
        help="twins trained on, one per environment (seeds 1000..; --shortlist: per space, drawn from the suite's train "
        "split by --seed), 1 to 64",
    ),
    steps: int = typer.Option(60_000, "--steps", metavar="N", help="PPO environment steps in all, 64 to 10,000,000"),
    budget: int = typer.Option(50, "--budget", metavar="N", help="launched runs per training episode"),
    seed: int = typer.Option(0, "--seed", metavar="N", help="PPO's seed, 0 to 2**32-1"),
    force: bool = typer.Option(False, "--force", help="replace an existing --out file"),
    shortlist: bool = typer.Option(
        False,
        "--shortlist",
        help="train one masked policy of the shortlist encoding over twins of every SPACE (MaskablePPO): it acts on any space",
    ),
) -> None:
    """Train a search policy (PPO, Stable-Baselines3; the rl extra) on twins of SPACE; experimental. The output
    is checked before training."""
    # PPO's small MLP trains about twice as fast on one CPU thread as on torch's default pool (measured: 4,096
    # steps on nemotron3_8b in 6 s against 13 s); set before torch loads, and a user's own setting wins
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dse.rl.training import train_policy, train_shortlist

    t0 = time.perf_counter()
    space = list(space or [])
    if shortlist:
        done = train_shortlist(space, out, twins=twins, steps=steps, seed=seed, budget=budget, force=force)
    elif len(space) != 1:
        raise UserError(
            f"{len(space)} spaces; a policy of one space trains on one (--shortlist: on several)", field="SPACE"
        )
    else:
        done = train_policy(space[0], out, twins=twins, steps=steps, seed=seed, budget=budget, force=force)
    render.console.print(
        f"trained on {len(done.twins)} twins (seeds {min(done.twins)}..{max(done.twins)}; {done.steps:,} steps, "
        f"{time.perf_counter() - t0:.0f} s); policy: {done.path}",
        highlight=False,
    )


def _check_bench_outputs(csv_out: Path, page: Path | None, twins: int, split: str, max_twins: int) -> None:
    """dse bench-agents' output paths, twin count and split, checked before any episode runs."""
    for name, out in (("--csv", csv_out), ("--page", page)):
        if out is not None and (out.is_dir() or not out.parent.is_dir()):
            raise UserError("give the path of a file in a directory that exists", file=str(out), field=name)
    if isinstance(twins, bool) or not 1 <= twins <= max_twins:
        raise UserError(f"{twins!r} is out of range; give an integer from 1 to {max_twins:,}", field="--twins")
    if split not in ("train", "validation", "test"):
        raise UserError(f"{split!r} is no split; give test, validation or train", field="--split")


def _bench_command(
    spaces: list[str],
    split: str,
    benchmark_ids: list[str],
    held_out: bool,
    twins: int,
    seeds: int,
    budget: int | None,
    agents: list[str],
    policies: list[Path],
    csv_out: Path,
) -> str:
    """The dse bench-agents command line that makes this leaderboard again (written on its page)."""
    import shlex

    args = [*(f"--space {shlex.quote(s)}" for s in spaces)]
    if not spaces:
        args += [
            f"--split {split}",
            *(f"--benchmark {i}" for i in benchmark_ids),
            *(["--held-out"] if held_out else []),
        ]
    args += [f"--twins {twins}", f"--seeds {seeds}", *([f"--budget {budget}"] if budget else [])]
    args += [*(f"--agent {a}" for a in agents), *(f"--policy {shlex.quote(str(p))}" for p in policies)]
    return " ".join(["dse bench-agents", *args, f"--csv {shlex.quote(str(csv_out))}"])


# house: most of its lines are its Typer options, one per line as the formatter writes them; the body is short
def bench_agents_cmd(
    split: str = typer.Option(
        "test", "--split", metavar="SPLIT", help="the suite's split to judge on: test, validation, train"
    ),
    benchmark_ids: list[str] = typer.Option(
        [],
        "--benchmark",
        metavar="ID",
        help="only this benchmark of the suite (repeatable; default: every one of the split)",
    ),
    held_out: bool = typer.Option(
        False, "--held-out", help="only the benchmarks training never sees (held-out spaces, replays)"
    ),
    spaces: list[str] = typer.Option(
        [],
        "--space",
        metavar="FILE",
        help="judge on this space instead of the suite (repeatable; each a benchmark of its own)",
    ),
    twins: int = typer.Option(20, "--twins", metavar="N", help="twins per benchmark (the split's first N), 1 to 200"),
    seeds: int = typer.Option(3, "--seeds", metavar="N", help="agent seeds per twin, 1 to 20"),
    budget: int | None = typer.Option(
        None, "--budget", metavar="N", help="launched runs per episode, 1 to 1,000 (default: each benchmark's own)"
    ),
    agents: list[str] = typer.Option(
        [],
        "--agent",
        metavar="NAME",
        help="an agent to run (repeatable; default: grid, random, tpe, guided, and policy with --policy)",
    ),
    policies: list[Path] = typer.Option(
        [], "--policy", metavar="FILE", help="a policy file for the policy agent, one per training seed (repeatable)"
    ),
    csv_out: Path = typer.Option(Path("leaderboard.csv"), "--csv", metavar="FILE", help="the leaderboard's CSV"),
    page: Path | None = typer.Option(
        None, "--page", metavar="FILE", help="also write the leaderboard as a Markdown page"
    ),
) -> None:
    """Run every agent on the suite's benchmarks (or on --space files) through the environment and rank them by runs
    and GPU-hours to 99% of each twin's true best, with 95% bootstrap intervals over twins and seeds; measured on
    simulated twins (a replay: real runs). Writes the CSV (and, with --page, a Markdown page)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dse.envs.search import as_space
    from dse.fsutil import write_text
    from dse.rl.leaderboard import (
        DEFAULT_AGENTS,
        MAX_TWINS,
        Settings,
        check,
        episodes,
        rows,
        space_benchmark,
        suite_benchmarks,
        to_csv,
        to_markdown,
    )

    _check_bench_outputs(csv_out, page, twins, split, MAX_TWINS)
    chosen = list(agents) or [*DEFAULT_AGENTS, *(["policy"] if policies else [])]
    settings = Settings(agents=chosen, seeds=seeds, budget=budget, policies=list(policies))
    if spaces:
        benches = [space_benchmark(as_space(s), twins) for s in spaces]
    else:
        benches = suite_benchmarks(split, twins, benchmark_ids, held_out)
    check(settings, benches)
    for p in policies:
        from dse.rl.policy import check_path

        check_path(p, field="--policy")
    per_agent = {a: (len(policies) if a == "policy" else seeds) for a in chosen}
    total = sum(max(len(b.twins), 1) * per_agent[a] for b in benches for a in chosen)
    t0 = time.perf_counter()
    progress, advance = render.episode_progress(total)
    try:
        eps = episodes(benches, settings, on_episode=advance)
    finally:
        progress.stop()
    table = rows(eps)
    write_text(csv_out, to_csv(table))
    command = _bench_command(spaces, split, benchmark_ids, held_out, twins, seeds, budget, agents, policies, csv_out)
    if page is not None:
        write_text(page, render.leaderboard_page(to_markdown(table), command, time.perf_counter() - t0))
    render.console.print(to_markdown(table), highlight=False, markup=False)
    render.console.print(
        f"measured on simulated twins (replays: real runs): {len(eps):,} episodes in {time.perf_counter() - t0:.0f} s; "
        f"csv: {csv_out}" + (f"; page: {page}" if page is not None else ""),
        highlight=False,
    )
