"""The replay backend: a finished study's recorded outcomes, run again for the knob values that produced them.

``[backend] kind = "replay"``, ``replay = "PATH"``: PATH is a study's output directory or its
``leaderboard.csv`` (dse's own format: one column per knob, ``status``, the metrics, ``peak_memory_gib``,
``reason``; ``gpu_hours`` and ``steps`` when the study recorded them). A trial whose knob values the table
holds gets the recorded outcome, written as the log a real run prints (NeMo 2 progress lines with the recorded
step time, TFLOP/s and peak memory, or the recorded failure's own line), so the parser, the reward and the store
see it as they see any run; its wall time is the recorded GPU-hours over its GPUs. A point the table lacks is
refused before launch (:meth:`ReplayBackend.refusal`): the environment rejects it as it rejects a point that
breaks a rule, so it costs nothing. The table is read and checked once, when the backend is built (``dse
validate``, ``dse run`` before anything is written), with one-line errors naming the file and the column.

Why a backend and not a reader of the recorded logs: the leaderboard is what every study leaves, including one
whose run directories were packed or deleted, and the recorded metrics are the ones the study ranked.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse.backends.base import Backend, InfrastructureFailure, RunResult, StopCheck
from dse.backends.scripts import LOG_NAME
from dse.errors import UserError
from dse.facts import knobs
from dse.inputs import csv_row, read_text
from dse.launch import LaunchPlan
from dse.logs.parse import STATUSES, Status

if TYPE_CHECKING:
    from dse.rules.space import Space
    from dse.rules.trial import TrialConfig

TABLE_NAME = "leaderboard.csv"
#: Recorded statuses a replay gives back. ``rejected`` and ``screened`` points never ran and a ``pruned`` run's
#: metrics are not in the table: the table holds no measurement of them, so their points are refused.
REPLAYED = ("ok", "oom", "nccl_error", "timeout", "failed", "no_metrics")
_METRICS = ("step_time_s", "tflops_per_gpu", "peak_memory_gib", "gpu_hours", "steps")
_NOT_KNOBS = frozenset({"trial", "status", "reward", "reason", "run_dir", "gpu", "num_gpus", "mfu"})
OOM_EXIT_CODE = 1  # what a PyTorch process that ran out of memory exits with


@dataclass(frozen=True)
class Outcome:
    """One recorded run: its status and reason, its metrics (None where the table has none), its row."""

    status: str
    reason: str
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    peak_memory_gib: float | None = None
    gpu_hours: float | None = None
    steps: int | None = None
    row: int = 0


def norm(value: Any) -> str:
    """One spelling of a knob value, for the table's text and a trial's typed value alike (``2``, ``2.0`` and
    ``"2"`` are one value; ``True`` and ``true`` too)."""
    s = str(value).strip()
    if s.lower() in ("true", "false"):
        return s.lower()
    try:
        f = float(s)
    except ValueError:
        return s
    return str(int(f)) if math.isfinite(f) and f.is_integer() else repr(f)


def trial_value(trial: TrialConfig, name: str) -> Any:
    """The value of knob ``name`` in a resolved trial (an ``env.NAME`` knob: its environment value)."""
    if knobs.is_env(name):
        return trial.env.get(name[len(knobs.ENV_PREFIX) :])
    return trial.values.get(name)


@dataclass(frozen=True)
class ReplayTable:
    """A study's outcomes by knob values: ``knobs`` are the table's knob columns, ``rows`` the replayable outcome
    of each point (the last recorded trial of a point wins), ``unmeasured`` the status of points it holds with
    no measurement (rejected, screened, pruned)."""

    path: Path
    knobs: tuple[str, ...]
    rows: Mapping[tuple[str, ...], Outcome]
    unmeasured: Mapping[tuple[str, ...], str]

    def key(self, trial: TrialConfig) -> tuple[str, ...]:
        return tuple(norm(trial_value(trial, k)) for k in self.knobs)

    def outcome(self, trial: TrialConfig) -> Outcome | None:
        return self.rows.get(self.key(trial))

    def refusal(self, trial: TrialConfig) -> str | None:
        """Why ``trial`` cannot be replayed (one line naming its values and the table), or None."""
        key = self.key(trial)
        if key in self.rows:
            return None
        point = ", ".join(f"{k}={v}" for k, v in zip(self.knobs, key))
        seen = self.unmeasured.get(key)
        held = f" (its recorded point was {seen}: no measurement)" if seen else ""
        return f"no recorded run of {point} in {self.path}{held}"


def table_path(path: str | Path) -> Path:
    """The leaderboard ``path`` names: the file itself, or a study directory's ``leaderboard.csv``."""
    p = Path(path)
    return p / TABLE_NAME if p.is_dir() else p


def _number(text: str, column: str, row: int, file: str) -> float | None:
    if text.strip() == "":
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise UserError(f"{text!r} is not a finite number >= 0", file=file, field=f"{column} (row {row})")
    return v


def _outcome(cells: Mapping[str, str], row: int, file: str) -> Outcome:
    """The recorded outcome of one row (its status among ``STATUSES``; an ok row needs its step time)."""
    status = (cells.get("status") or "").strip()
    if status not in STATUSES and status != Status.INTERRUPTED:  # an interrupted row: no outcome, not replayed
        raise UserError(
            f"unknown status {status!r}; allowed: {', '.join(STATUSES)}, {Status.INTERRUPTED.value}",
            file=file,
            field=f"status (row {row})",
        )
    m = {c: _number(cells.get(c) or "", c, row, file) for c in _METRICS}
    if status == "ok" and not m["step_time_s"]:
        raise UserError("an ok run needs its step time (> 0)", file=file, field=f"step_time_s (row {row})")
    steps = m["steps"]
    return Outcome(
        status,
        (cells.get("reason") or "").strip(),
        m["step_time_s"],
        m["tflops_per_gpu"],
        m["peak_memory_gib"],
        m["gpu_hours"],
        int(steps) if steps is not None else None,
        row,
    )


def _knob_columns(header: Sequence[str], file: str) -> tuple[str, ...]:
    cols = tuple(c for c in header if c not in _NOT_KNOBS and (knobs.is_env(c) or c in knobs.CATALOGUE))
    if "status" not in header:
        raise UserError("no status column: not a dse leaderboard", file=file, field="status")
    if not cols:
        raise UserError(f"no knob column (a knob of the catalogue, or env.NAME) among {', '.join(header)}", file=file)
    return cols


def read_table(path: str | Path, *, varied: Sequence[str] = (), gpu: str | None = None) -> ReplayTable:
    """Read and check the replay table at ``path`` (a study directory or its leaderboard). ``varied``: the knobs
    the replaying space varies (each must be a column, or the table cannot tell its values apart); ``gpu``: the
    space's GPU (a table recorded on another GPU is refused)."""
    p = table_path(path)
    file = str(p)
    text = read_text(p)
    reader = csv.DictReader(io.StringIO(text))
    header = list(reader.fieldnames or [])
    cols = _knob_columns(header, file)
    for k in varied:
        if k not in cols:
            raise UserError(
                f"the space varies {k} but the table has no {k} column (its knobs: {', '.join(cols)})",
                file=file,
                field=k,
            )
    rows: dict[tuple[str, ...], tuple[float, Outcome]] = {}
    unmeasured: dict[tuple[str, ...], str] = {}
    for i, cells in enumerate(map(csv_row, reader), start=1):
        if gpu is not None and (g := (cells.get("gpu") or "").strip()) and g != gpu:
            raise UserError(f"recorded on {g}; the space's GPU is {gpu}", file=file, field=f"gpu (row {i})")
        o = _outcome(cells, i, file)
        key = tuple(norm(cells.get(k) or "") for k in cols)
        if o.status not in REPLAYED:
            unmeasured.setdefault(key, o.status)
            continue
        number = _number(cells.get("trial") or "", "trial", i, file) or 0.0
        if key not in rows or number >= rows[key][0]:  # a point recorded twice (a rerun): the later trial wins
            rows[key] = (number, o)
    if not rows:
        raise UserError("no measured run (ok, oom, timeout, nccl_error, failed, no_metrics) to replay", file=file)
    _check_meta(p.parent, gpu)
    return ReplayTable(p, cols, {k: o for k, (_, o) in rows.items()}, unmeasured)


def _check_meta(study: Path, gpu: str | None) -> None:
    """A study directory's ``dse.json`` beside the table, when there is one: its GPU must be the space's."""
    meta = study / "dse.json"
    if gpu is None or not meta.is_file():
        return
    try:
        recorded = json.loads(read_text(meta)).get("gpu")
    except (ValueError, AttributeError):
        raise UserError("not a JSON object", file=str(meta)) from None
    if isinstance(recorded, str) and recorded != gpu:
        raise UserError(f"the study ran on {recorded}; the space's GPU is {gpu}", file=str(meta), field="gpu")


def _line(i: int, n: int, gbs: int, o: Outcome) -> str:
    """Step ``i`` of ``n`` as NeMo 2's progress printer prints it, the recorded figures at full precision."""
    fields = [f"global_batch_size: {gbs}", f"global_step: {i}"]
    if o.step_time_s is not None:
        fields.append(f"train_step_timing in s: {o.step_time_s!r}")
    if o.tflops_per_gpu is not None:
        fields.append(f"TFLOPS_per_GPU: {o.tflops_per_gpu!r}")
    if o.peak_memory_gib is not None:
        fields.append(f"max_memory_allocated: {o.peak_memory_gib * 2**30!r}")
    fields.append(f"consumed_samples: {(i + 1) * gbs}")
    return f"Training epoch 0, iteration {i}/{n - 1} | " + " | ".join(fields) + "\n"


def _ending(o: Outcome) -> tuple[str, int | None, str | None]:
    """The last lines of a recorded failure, as the run printed them (the recorded reason where it is the
    run's own line), its exit code and the scheduler's state."""
    reason = o.reason.splitlines()[0] if o.reason else ""
    low = reason.lower()
    if o.status == "oom":
        line = reason if "out of memory" in low else f"torch.OutOfMemoryError: CUDA out of memory. {reason}".rstrip()
        return f"Traceback (most recent call last):\n{line}\n", OOM_EXIT_CODE, None
    if o.status == "nccl_error":
        line = reason if "nccl" in low else f"torch.distributed.DistBackendError: NCCL error: {reason}".rstrip()
        return f"Traceback (most recent call last):\n{line}\n", 1, None
    if o.status == "timeout":
        return "slurmstepd: error: *** STEP CANCELLED DUE TO TIME LIMIT ***\n", None, "TIMEOUT"
    if o.status == "failed":
        line = reason if reason.split(":")[0].isidentifier() and ":" in reason else f"RuntimeError: {reason}"
        return f"Traceback (most recent call last):\n{line}\n", 1, None
    return "", 0, None  # no_metrics: a clean end without a progress line


class ReplayBackend(Backend):
    """Writes each trial's recorded outcome from a :class:`ReplayTable` into its run directory; refuses the
    points the table lacks before launch."""

    name = "replay"
    interruptible = False  # in-process milliseconds, as the simulated backend
    run_errors = (OSError,)

    def __init__(self, table: ReplayTable, *, startup_s: float = 300.0):
        self.table, self.startup_s = table, startup_s

    @classmethod
    def from_space(cls, space: Space, *, seed: int = 0) -> ReplayBackend:
        path = space.backend.replay
        if path is None:
            raise UserError(
                "the replay backend needs the study to replay: [backend] replay = PATH (a study directory or its "
                "leaderboard.csv)",
                file=space.source or None,
                field="backend.replay",
            )
        return cls(read_table(path, varied=space.knob_names, gpu=space.system.gpu), startup_s=space.system.startup_s)

    def refusal(self, trial: TrialConfig) -> str | None:
        return self.table.refusal(trial)

    def run(self, plan: LaunchPlan, run_dir: Path, stop: StopCheck | None = None) -> RunResult:
        o = self.table.outcome(plan.trial)
        if o is None:  # asked directly (not through the environment, which refuses it before launch)
            return RunResult(run_dir, run_dir / LOG_NAME, None, reason=f"replay: {self.table.refusal(plan.trial)}")
        if (failure := InfrastructureFailure.of(o.status, o.reason)) is not None:  # nothing ran: its words as they were
            return RunResult(run_dir, run_dir / LOG_NAME, None, reason=failure, wall_s=self._wall(o, plan, 0))
        lay = plan.trial.layout
        n = o.steps if o.steps is not None else (int(lay.max_steps) if o.status == "ok" else 0)
        log = run_dir / LOG_NAME
        written = 0
        with open(log, "w") as fh:
            fh.write(f"[NeMo I] Replayed by dse from {self.table.path}, row {o.row} ({o.status})\n")
            for i in range(n):
                fh.write(_line(i, max(n, int(lay.max_steps)), int(lay.gbs), o))
                written = i + 1
                if stop is not None:
                    fh.flush()
                    if stop(log):
                        return RunResult(run_dir, log, None, stopped=True, wall_s=self._wall(o, plan, written))
            tail, code, state = _ending(o)
            fh.write(tail or (f"`Trainer.fit` stopped: `max_steps={n:d}` reached.\n" if o.status == "ok" else ""))
        return RunResult(run_dir, log, code, scheduler_state=state, wall_s=self._wall(o, plan, written))

    def _wall(self, o: Outcome, plan: LaunchPlan, steps: int) -> float:
        """The recorded wall time (GPU-hours over the trial's GPUs); a table without GPU-hours: start-up plus the
        steps written at the recorded step time, as the simulated backend counts."""
        if o.gpu_hours is not None and (o.steps is None or steps >= o.steps):
            return o.gpu_hours * 3600.0 / max(1, plan.trial.num_gpus)
        return self.startup_s + steps * (o.step_time_s or 0.0)
