"""``dse dry-run``: write each valid trial's launch script, submit nothing.

Trials are taken in grid order; a point that a constraint rejects (or that cannot be launched, e.g.
tp_comm_overlap without a userbuffer config) is counted and skipped, with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dse import registry as reg
from dse.backends import load_backends
from dse.backends.base import Backend
from dse.constraints import check
from dse.errors import UserError
from dse.launch import build_plan
from dse.space import Space
from dse.trial import resolve


@dataclass(frozen=True)
class DryRunRow:
    index: int
    knobs: dict[str, Any]
    script: Path | None  # None when rejected
    reason: str | None = None


def dry_run(space: Space, backend: str, out: Path, limit: int | None = None) -> list[DryRunRow]:
    """Write each valid point's launch script (``Backend.write_script``: ``launch.sbatch`` for slurm,
    ``launch.sh`` for local) under ``out/NNNNN/``; the rows."""
    registry = load_backends()
    cls = reg.get(registry, backend, Backend, group=reg.BACKENDS, field="--backend")
    if cls.script_name is None:
        scripted = [n for n in registry if getattr(registry[n](), "script_name", None)]
        raise UserError(f"backend {backend!r} writes no launch script; a dry run takes one of {', '.join(scripted)}",
                        field="--backend")
    if limit is not None and limit < 1:
        raise UserError(f"{limit} is not a positive number of trials", field="--limit")
    rows: list[DryRunRow] = []
    written = 0
    for index, point in enumerate(space.points()):
        if limit is not None and written >= limit:
            break
        trial = resolve(space, point)
        rej = check(trial)  # tp_comm_overlap without a userbuffer config is one of the rules
        reason = f"{rej.rule}: {rej.reason}" if rej else None
        if reason is None:
            try:
                plan = build_plan(trial, payload=space.backend.payload, seed=space.search.seed)
            except UserError as e:
                reason = e.message
        if reason is not None:
            rows.append(DryRunRow(index, dict(point), None, reason))
            continue
        script = cls.write_script(plan, (out / f"{index:05d}").absolute())
        rows.append(DryRunRow(index, dict(point), script))
        written += 1
    return rows
