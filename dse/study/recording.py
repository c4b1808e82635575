"""What a study writes of its trials: each trial's row in the store, the simulated logs packed, and at the end
the leaderboard and ``best/``.

A launched trial has a row before it ends (:func:`placeholder`: status ``interrupted``, what a Ctrl-C or a
killed dse leaves and ``--resume`` runs again); its result replaces it. The study (:mod:`dse.study.trials`) decides
what to record and when; this module only writes. Where the files live is :mod:`dse.study.outdir`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from dse.errors import InfrastructureError
from dse.execute import duration_s
from dse.facts import knobs
from dse.logs import logpack
from dse.rules.space import Space
from dse.rules.trial import TrialConfig
from dse.study.best import write_best
from dse.study.claims import add_trial
from dse.study.leaderboard import Baseline, ProbeCost, Provenance, Summary, frame, mfu, relative_run_dirs, write_csv
from dse.study.outdir import LEADERBOARD, io_error, read_meta, serialized, stored_run_dir
from dse.study.store import INTERRUPTED, READ_BATCH, Store, TrialRecord

SUMMARY_ROWS = 20  # top rows the study's summary keeps (the terminal shows 10)


def record_of(number: int, info: dict[str, Any], reward: float, *, precision: str = knobs.BF16) -> TrialRecord:
    """The store's record of one environment step (``info`` as :class:`envs.recipe_env.RecipeEnv` gives it), its
    metrics with the run's ``mfu`` (:func:`dse.study.leaderboard.mfu`; ``precision``: the trial's) when it has TFLOP/s."""
    metrics = info["metrics"]
    if (u := mfu(metrics.get("tflops_per_gpu"), info["gpu"], precision)) is not None:
        metrics = {**metrics, "mfu": u}
    return TrialRecord(
        number=number,
        knobs=info["knobs"],
        status=info["status"],
        reward=reward,
        reason=info["reason"],
        metrics=metrics,
        run_dir=stored_run_dir(number) if info["launched"] else None,
        gpu=info["gpu"],
        num_gpus=info["num_gpus"],
        gpu_hours=gpu_hours(info),
    )


def gpu_hours(info: dict[str, Any]) -> float | None:
    """GPUs x the run's wall time in hours (0 for a point never launched; None when the time is unknown)."""
    if not info["launched"]:
        return 0.0
    wall = duration_s(info["metrics"].get("wall_s"))  # a negative or non-finite time is unknown, not a cost
    return info["num_gpus"] * wall / 3600.0 if wall is not None else None


def placeholder(number: int, trial: TrialConfig, failed_reward: float) -> TrialRecord:
    """The row of a launched trial until its result replaces it: interrupted (what a Ctrl-C or a killed dse
    leaves, and what --resume runs again)."""
    return TrialRecord(
        number=number,
        knobs=trial.varied_values(),
        status=INTERRUPTED,
        reward=failed_reward,
        reason=None,
        run_dir=stored_run_dir(number),
        gpu=trial.system.gpu,
        num_gpus=trial.num_gpus,
    )


class Recorder:
    """Writes one study's trials into ``store`` (single writer: the study's main thread) and, for a backend
    whose logs are packed (:attr:`dse.backends.base.Backend.packs_logs`), packs them once they are stored."""

    def __init__(self, store: Store, out: Path, *, packs_logs: bool):
        self.store, self.out = store, out
        self.packer = logpack.Packer(out / "trials") if packs_logs else None  # PACK_SIZE at a time

    @property
    def closed(self) -> bool:
        return self.store.closed

    def next_number(self) -> int:
        return self.store.next_number()

    def launched(self, rec: TrialRecord) -> None:
        """The placeholder of a trial about to run, in the storage before the run starts (a killed dse
        leaves it interrupted)."""
        self.store.record(rec)
        self.store.flush()

    def numbered(self, rec: TrialRecord) -> int:
        """``--worker``: ``rec`` (a placeholder) added under the next number the storage gives; that number."""
        return add_trial(self.store, rec, stored_run_dir)

    def record(self, rec: TrialRecord, *, over: bool) -> None:
        """Record a result (``over``: in place of the trial's stored row)."""
        if over:
            self.store.replace(rec)
        else:
            self.store.record(rec)
        if self.packer is not None and rec.run_dir is not None:
            self.packer.add(rec.number)
            if self.packer.ready:
                self.store.flush()  # a pack holds only trials the store has (dse.logs.logpack)
                self.packer.pack()

    def abandon(self) -> None:
        """dse could not write (disk full...): what finished is kept if the store still can be written, and
        nothing else is attempted (no leaderboard)."""
        try:
            self.store.close()
        except (InfrastructureError, OSError, SQLAlchemyError):  # the error being raised is the one to report
            pass

    def finish(self, space: Space, *, worker: bool) -> tuple[Summary, Path]:
        """Flush and close the store; write the leaderboard from one streamed pass that also computes the
        summary (top rows, counts, the best), both with the provenance the study's ``dse.json`` records.
        Workers take turns: the last to read the store is the last to write the leaderboard."""
        with serialized(self.out, worker):
            self.store.flush()
            meta = read_meta(self.out)
            summary = Summary(SUMMARY_ROWS, Provenance.of_meta(meta), Baseline.of_meta(meta), ProbeCost.of_meta(meta))
            try:
                rows = summary.feed(self.store.iter_records())
                df = frame(rows, list(space.knobs), batch=READ_BATCH, provenance=summary.provenance)
            finally:
                self.store.close()
            return summary, write_leaderboard(df, self.out)


def write_leaderboard(df, out: Path) -> Path:
    """``out/leaderboard.csv``, run directories relative to the study directory (:func:`dse.study.leaderboard.
    relative_run_dirs`, as ``dse leaderboard DIR --csv FILE`` writes them)."""
    relative_run_dirs(df, out)
    try:
        return write_csv(df, out / LEADERBOARD)
    except OSError as e:
        raise io_error(e, f"cannot write {out / LEADERBOARD}") from None


def write_best_of(space: Space, summary: Summary, out: Path) -> None:
    """``out/best/`` for the study's best trial (only when the study ended normally), saying where its figures
    come from (the summary's provenance)."""
    try:
        write_best(
            space, [summary.best] if summary.best else [], out, provenance=summary.provenance, model=summary.model
        )
    except OSError as e:
        raise io_error(e, f"cannot write {out / 'best'}") from None
