"""A space before any run: ``dse validate`` (does it load), ``dse space`` (how many valid points, which rules
reject the others, what a study of it is forecast to cost) and ``dse dry-run`` (the launch scripts with the
model's forecast of each point, nothing submitted)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dse.cli import render
from dse.errors import UserError


def validate_cmd(files: list[Path] = typer.Argument(..., metavar="FILES", help="space files")) -> None:
    """Check space files: schema, knob names and values, recipe, system, and what `dse run` checks before its first
    trial (agent, sampler, backend, launch scripts). Exit 2 on the first bad file."""
    from dse.rules.space import load_space
    from dse.study.loop import check_study

    for f in files:
        space = load_space(f)
        check_study(space)
        render.validated(f, space)


def space_cmd(
    space_file: Path = typer.Argument(..., metavar="SPACE_FILE", help="a space file"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    twin_seed: int | None = typer.Option(
        None,
        "--twin-seed",
        min=0,
        metavar="N",
        help="also print the twin truth of this seed: its step-time MAPE against the model over the valid points",
    ),
) -> None:
    """Count a space's raw and valid points, and the rejections by rule: exactly up to 100,000 raw points,
    estimated from 20,000 seeded uniform draws above (the output says which). Print the study's forecast cost:
    predicted GPU-hours and the points the memory screen removes."""
    from dse.evaluator import Evaluator
    from dse.forecast import study_cost
    from dse.rules.space import WALK_LIMIT, load_space

    if twin_seed is not None and not 0 <= twin_seed < 2**32:  # as [backend] twin_seed: unsigned 32-bit
        raise UserError(f"{twin_seed} is out of range; a seed is an integer from 0 to {2**32 - 1}", field="--twin-seed")
    s = load_space(space_file)
    if twin_seed is not None and s.size > WALK_LIMIT:
        raise UserError(
            f"the twin is measured over every valid point; this space has {s.size:,} raw points "
            f"(at most {WALK_LIMIT:,})",
            field="--twin-seed",
        )
    ev = Evaluator(s)  # the command's: each point resolved, checked and predicted once for the count and the cost
    count = _count(s, as_json, ev)
    data = {
        "space": s.name,
        "recipe": s.recipe,
        "gpu": s.system.gpu,
        "num_gpus": s.num_nodes * s.system.gpus_per_node,
        "knobs": {k: list(v) for k, v in s.knobs.items()},
        "raw": s.size,
        "valid": count.valid,
        "exact": count.exact,
        "rejected_by_rule": count.by_rule,
    }
    if not count.exact:
        # JSON numbers are exact integers in Python's json; other readers may round them above 2^53
        data.update({"samples": count.samples, "valid_ci95": [count.valid_low, count.valid_high]})
    cost = study_cost(ev, s.search.trials)
    data["cost"] = cost_data(cost)
    if twin_seed is not None:
        data["twin"] = _twin(ev, twin_seed)
    if as_json:
        print(json.dumps(data))
        return
    render.space_count(s, data, count, cost)


def cost_data(cost) -> dict:
    """A :class:`dse.forecast.StudyCost` as JSON-ready figures (``dse space --json``'s ``cost``)."""
    return {
        "gpu_hours": round(cost.gpu_hours, 1),
        "runs": cost.runs,
        "budget": cost.budget,
        "median_run_gpu_hours": round(cost.median_run, 2),
        "valid_points": cost.points,
        "screened": cost.screened,
        "exact": cost.exact,
    }


def _count(s, quiet: bool, points):
    """The space's valid points: walked with a bar above 10,000 raw points, estimated above the walk limit."""
    from dse.rules.counting import SAMPLES, count_valid
    from dse.rules.space import WALK_LIMIT

    if s.size > 10_000 and s.size <= WALK_LIMIT and not quiet:
        bar, on_progress = render.counting_progress(s.size)
        with bar:
            return count_valid(s, on_progress=on_progress, points=points)
    if s.size > WALK_LIMIT and not quiet:
        render.note(
            f"{s.size:,} raw points (more than {WALK_LIMIT:,}): estimating the valid ones from {SAMPLES:,} seeded draws"
        )
    return count_valid(s, points=points)


def _twin(ev, seed: int) -> dict:
    """``--twin-seed``: how far the twin truth of ``seed`` is from the model over the space's valid points."""
    from dse.perfmodel import predict
    from dse.perfmodel.twin import make_twin, mape

    s = ev.space
    trials = [ev.trial(p) for p in s.points() if ev.valid(p)]
    twin = make_twin(s, seed, trials=trials)
    fits = [t for t in trials if twin.predict(t).fits]
    return {
        "seed": seed,
        "step_time_mape": mape(twin, trials),
        "layout_scale": twin.scale,
        "memory_reserve_gib": twin.params.memory_reserve_gib,
        "fit_on_twin": len(fits),
        "fit_in_model": sum(predict(t).fits for t in trials),
    }


def dry_run_cmd(
    space: str = typer.Option(..., "--space", metavar="TEXT", help="space file (TOML)"),
    backend: str = typer.Option(
        "slurm", "--backend", metavar="TEXT", help="slurm (sbatch scripts) or local (bash scripts)"
    ),
    out: str = typer.Option(..., "--out", metavar="TEXT", help="directory for the scripts (one folder per trial)"),
    limit: int | None = typer.Option(None, "--limit", metavar="N", help="write at most this many valid trials"),
    only_fitting: bool = typer.Option(
        False, "--only-fitting", help="leave out the points the model predicts beyond the GPU's memory"
    ),
) -> None:
    """Write each valid trial's launch script under --out (one folder each, its payload beside it) and
    --out/index.csv (each folder's knob values and the model's forecast); print a summary; nothing is submitted."""
    from dse.dryrun import dry_run
    from dse.rules.space import load_space

    sp = load_space(space)
    render.dry_run(sp, backend, out, dry_run(sp, backend, Path(out), limit, only_fitting))
