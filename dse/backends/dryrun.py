"""``dse dry-run``: write each valid trial's launch script, submit nothing.

Trials are taken in grid order; a point that a constraint rejects (or that cannot be launched, e.g.
tp_comm_overlap without a userbuffer config) is counted and skipped, with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dse.errors import UserError
from dse.launch import build_plan, tp_comm_overlap_supported
from dse.space import Space
from dse.trial import TrialConfig, resolve

BACKENDS = ("slurm", "local")


@dataclass(frozen=True)
class DryRunRow:
    index: int
    knobs: dict[str, Any]
    script: Path | None  # None when rejected
    reason: str | None = None


def _rejection(trial: TrialConfig) -> str | None:
    try:
        from dse.constraints import check  # the lead's rule set
    except ImportError:  # pragma: no cover - only before dse.constraints exists
        check = None
    if check is not None:
        rej = check(trial)
        if rej is not None:
            return f"{rej.rule}: {rej.reason}"
    reason = tp_comm_overlap_supported(trial)
    return f"tp_comm_overlap_supported: {reason}" if reason else None


def dry_run(space: Space, backend: str, out: Path, limit: int | None = None) -> list[DryRunRow]:
    """Write ``out/NNNNN/launch.sbatch`` (slurm) or ``launch.sh`` (local) for each valid point; the rows."""
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r} for a dry run; one of {', '.join(BACKENDS)}", field="--backend")
    if limit is not None and limit < 1:
        raise UserError(f"{limit} is not a positive number of trials", field="--limit")
    if backend == "slurm":
        from dse.backends.slurm import write_sbatch as write
    else:
        from dse.backends.local import write_local_script as write
    rows: list[DryRunRow] = []
    written = 0
    for index, point in enumerate(space.points()):
        if limit is not None and written >= limit:
            break
        trial = resolve(space, point)
        reason = _rejection(trial)
        if reason is None:
            try:
                plan = build_plan(trial, payload=space.backend.payload, seed=space.search.seed)
            except UserError as e:
                reason = e.message
        if reason is not None:
            rows.append(DryRunRow(index, dict(point), None, reason))
            continue
        script = write(plan, (out / f"{index:05d}").absolute())
        rows.append(DryRunRow(index, dict(point), script))
        written += 1
    return rows
