"""``dse dry-run``: write each valid trial's launch script, submit nothing.

Trials are taken in grid order; a point that a constraint rejects (or that cannot be launched, e.g.
tp_comm_overlap without a userbuffer config) is counted and skipped, with its reason. Each written point
carries the model's forecast (:class:`dse.forecast.PointForecast`: predicted peak memory, fit, step time, and
whether the memory screen would keep a study from launching it); its script is written all the same.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse import registry as reg
from dse.backends import load_backends
from dse.backends.base import Backend
from dse.constraints import check
from dse.errors import UserError
from dse.forecast import PointForecast, Screen
from dse.launch import build_plan
from dse.space import WALK_LIMIT, Space
from dse.trial import resolve


@dataclass(frozen=True)
class DryRunRow:
    index: int
    knobs: dict[str, Any]
    script: Path
    forecast: PointForecast | None = None


@dataclass
class DryRun:
    """What a dry run wrote (``rows``), what it rejected (reason -> count) and how many raw points it examined;
    ``stopped`` says why it ended before the space's end (the walk limit), or is None."""

    rows: list[DryRunRow] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    examined: int = 0
    stopped: str | None = None

    @property
    def screened(self) -> int:
        """Written points that the memory screen would keep a study from launching."""
        return sum(r.forecast is not None and r.forecast.screened for r in self.rows)


def dry_run(space: Space, backend: str, out: Path, limit: int | None = None) -> DryRun:
    """Write each valid point's launch script (``Backend.write_script``: ``launch.sbatch`` for slurm,
    ``launch.sh`` for local) under ``out/NNNNN/``.

    The points are walked lazily in grid order and only the written ones are kept, so memory follows the
    scripts, not the space. Without ``limit`` a space of more than ``WALK_LIMIT`` raw points is refused (it
    would be that many scripts); with one, the walk ends after ``limit`` scripts or ``WALK_LIMIT`` raw points,
    whichever comes first, and says so."""
    registry = load_backends()
    cls = reg.get(registry, backend, Backend, group=reg.BACKENDS, field="--backend")
    if cls.script_name is None:
        scripted = [n for n in registry if getattr(registry[n](), "script_name", None)]
        raise UserError(
            f"backend {backend!r} writes no launch script; a dry run takes one of {', '.join(scripted)}",
            field="--backend",
        )
    if limit is not None and limit < 1:
        raise UserError(f"{limit} is not a positive number of trials", field="--limit")
    if limit is None and space.size > WALK_LIMIT:
        raise UserError(
            f"a dry run writes every valid point's script; this space has {space.size:,} raw points "
            f"(at most {WALK_LIMIT:,} without a limit): pass --limit N",
            field="--limit",
        )
    result = DryRun()
    screen = Screen(space)
    for index, point in enumerate(space.points()):
        if limit is not None and len(result.rows) >= limit:
            break
        if index >= WALK_LIMIT:
            result.stopped = (
                f"stopped after the first {WALK_LIMIT:,} of {space.size:,} raw points "
                f"(grid order) with {len(result.rows)} of --limit {limit} written"
            )
            break
        result.examined = index + 1
        trial = resolve(space, point)
        rej = check(trial)  # tp_comm_overlap without a userbuffer config is one of the rules
        reason = f"{rej.rule}: {rej.reason}" if rej else None
        if reason is None:
            try:
                plan = build_plan(trial, payload=space.backend.payload, seed=space.search.seed)
            except UserError as e:
                reason = e.message
        if reason is not None:
            result.rejected[reason] += 1
            continue
        script = cls.write_script(plan, (out / f"{index:05d}").absolute())
        result.rows.append(DryRunRow(index, dict(point), script, screen.point(trial)))
    return result
