"""``dse dry-run``: write each valid trial's launch script, submit nothing.

Trials are taken in grid order; a point that a constraint rejects (or that cannot be launched, e.g.
tp_comm_overlap without a userbuffer config) is counted and skipped, with its reason. Each written point
carries the model's forecast (:class:`dse.forecast.PointForecast`: predicted peak memory, fit, step time, and
whether the memory screen would keep a study from launching it); its script is written all the same, unless
``only_fitting`` leaves out the points predicted not to fit.

``out/index.csv`` lists every folder written with its knob values and forecast. Each folder is self-contained: its
``code/`` is the payload its script runs, staged once in ``out/code`` and hard-linked into each folder (a copy
where the file system has no hard links), so that a folder runs as written (a Slurm job's container mounts its
folder alone) while thousands of folders cost one copy on disk.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse import registry as reg
from dse.backends import load_backends
from dse.backends.base import Backend
from dse.backends.scripts import CODE_DIR, stage_code
from dse.errors import UserError
from dse.evaluator import Evaluator, PointForecast
from dse.fsutil import write_text
from dse.launch import build_plan
from dse.rules.space import WALK_LIMIT, Space


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
    not_fitting: int = 0  # valid points left out by only_fitting: predicted beyond the GPU's memory
    index: Path | None = None  # out/index.csv

    @property
    def screened(self) -> int:
        """Written points that the memory screen would keep a study from launching."""
        return sum(r.forecast is not None and r.forecast.screened for r in self.rows)


INDEX = "index.csv"


def dry_run(space: Space, backend: str, out: Path, limit: int | None = None, only_fitting: bool = False) -> DryRun:
    """Write each valid point's launch script (``Backend.write_script``: ``launch.sbatch`` for slurm,
    ``launch.sh`` for local) under ``out/NNNNN/``, with the payload beside it, and ``out/index.csv``.

    The points are walked lazily in grid order and only the written ones are kept, so memory follows the
    scripts, not the space. Without ``limit`` a space of more than ``WALK_LIMIT`` raw points is refused (it
    would be that many scripts); with one, the walk ends after ``limit`` scripts or ``WALK_LIMIT`` raw points,
    whichever comes first, and says so. ``only_fitting``: a point the model predicts beyond the GPU's memory is
    counted (``not_fitting``), not written."""
    cls = _script_backend(backend)
    if limit is not None and limit < 1:
        raise UserError(f"{limit} is not a positive number of trials", param="limit")
    if limit is None and space.size > WALK_LIMIT:
        raise UserError(
            f"a dry run writes every valid point's script; this space has {space.size:,} raw points "
            f"(at most {WALK_LIMIT:,} without a limit): pass --limit N",
            param="limit",
        )
    result = DryRun()
    screen = Evaluator(space, cache=64)  # the command's: each point resolved, checked and forecast once (in turn)
    code: Path | None = None
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
        trial = screen.trial(point)
        rej = screen.check(point)  # tp_comm_overlap without a userbuffer config is one of the rules
        reason = f"{rej.rule}: {rej.reason}" if rej else None
        if reason is None:
            try:
                plan = build_plan(trial, payload=space.backend.payload, seed=space.search.seed)
            except UserError as e:
                reason = e.message
        if reason is not None:
            result.rejected[reason] += 1
            continue
        forecast = screen.point(point)
        if only_fitting and forecast is not None and not forecast.fits:
            result.not_fitting += 1
            continue
        folder = (out / f"{index:05d}").absolute()
        script = cls.write_script(plan, folder)
        code = code or stage_code(out.absolute())
        _link_tree(code, folder / CODE_DIR)
        result.rows.append(DryRunRow(index, dict(point), script, forecast))
    result.index = write_index(space, out, result.rows)
    return result


def _script_backend(backend: str) -> type[Backend]:
    registry = load_backends()
    cls = reg.get(registry, backend, Backend, group=reg.BACKENDS, param="backend")
    if cls.script_name is None:
        scripted = [n for n in registry if getattr(registry[n](), "script_name", None)]
        raise UserError(
            f"backend {backend!r} writes no launch script; a dry run takes one of {', '.join(scripted)}",
            param="backend",
        )
    return cls


def _link(src: str, dst: str) -> None:
    """A hard link of ``src`` at ``dst``; a copy where the file system refuses hard links."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dest: Path) -> None:
    """``dest`` as a tree of hard links to ``src``'s files (replacing what was there)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, copy_function=_link)


def write_index(space: Space, out: Path, rows: list[DryRunRow]) -> Path:
    """``out/index.csv``: one line per folder written, with its knob values and the model's forecast (every
    figure predicted, as its column says)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "folder",
            *space.knob_names,
            "num_nodes",
            "gpus_per_node",
            "predicted_peak_memory_gib",
            "gpu_memory_gib",
            "predicted_fits",
            "predicted_step_time_s",
            "screened",
            "script",
        ]
    )
    for r in rows:
        f = r.forecast
        figures = (
            [f"{f.peak_memory_gib:.2f}", f"{f.memory_gib:.0f}", f.fits, f"{f.step_time_s:.4f}", f.screened]
            if f
            else [""] * 5
        )
        w.writerow(
            [
                f"{r.index:05d}",
                *(r.knobs.get(k) for k in space.knob_names),
                space.num_nodes,
                space.system.gpus_per_node,
                *figures,
                os.path.relpath(r.script, out.absolute()),
            ]
        )
    out.mkdir(parents=True, exist_ok=True)
    return write_text(out / INDEX, buf.getvalue())
