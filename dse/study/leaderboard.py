"""The leaderboard: one row per trial, ranked by reward with failures last; CSV export.

Columns: ``trial, status, reward, step_time_s, tflops_per_gpu, tokens_per_s_per_gpu, peak_memory_gib, mfu``
(``mfu``: see :func:`mfu`; after the older metrics, since readers of the CSV read its first columns by position), one column per varying knob named as in the space file, ``gpu, num_gpus, gpu_hours, steps, early_stopped,
gpu_hours_saved, run_dir, reason`` (``gpu_hours``: GPUs x the run's wall time, simulated runs: start-up plus
steps; 0 for rejected and screened points, never launched; ``steps``: logged steps the run ran; ``early_stopped``: stopped once its steady
state had converged, ``gpu_hours_saved`` then what running on to ``max_steps`` would have cost more, also for a
``pruned`` trial). Metrics of a failed or pruned trial are left empty (its partial metrics stay in the store,
flagged, never ranked); a pruned trial ranks after the ``ok`` ones, by the reward of its optimistic bound.

Where the figures come from (:class:`Provenance`, one value for the whole study, from its ``dse.json``): after
the metric columns, ``backend`` (``sim``, ``local``, ``slurm``: the backend that ran the trials), ``truth``
(simulated figures only: ``exact``, the performance model's own, or ``twin (seed N)``, a seeded machine that
differs from the model) and ``calibration`` (simulated figures only: ``none`` or the calibration file's name).
``truth`` and ``calibration`` are empty for measured figures.
"""

from __future__ import annotations

import math
import os
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dse.errors import UserError, infrastructure
from dse.facts.hardware import HARDWARE
from dse.fsutil import atomic_write
from dse.inputs import csv_cell
from dse.logs.parse import UNLAUNCHED_STATUSES
from dse.study.store import TrialRecord

if TYPE_CHECKING:
    from dse.rules.space import Space

METRIC_COLUMNS = ("step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib", "mfu")
#: What the study's model predicted for a trial when it launched it (kept in the trial's metrics): the step time and
#: peak memory (leaderboard columns, beside the measured ones) and the GPU memory the peak was held against.
PREDICTED = ("predicted_step_time_s", "predicted_peak_memory_gib", "predicted_memory_gib")
PREDICTED_COLUMNS = PREDICTED[:2]


def predicted_metrics(step_time_s: float, peak_memory_gib: float, memory_gib: float) -> dict[str, float]:
    """What a trial's record keeps of the model's forecast made at its launch (:data:`PREDICTED`): the predicted
    step time and peak memory beside the measured ones, and the GPU memory it was held against."""
    return dict(zip(PREDICTED, (step_time_s, peak_memory_gib, memory_gib)))


HEAD = ("trial", "status", "reward", *METRIC_COLUMNS, *PREDICTED_COLUMNS)
TAIL = ("gpu", "num_gpus", "gpu_hours", "steps", "early_stopped", "gpu_hours_saved", "run_dir", "reason")
PROVENANCE_COLUMNS = ("backend", "truth", "calibration")
SIMULATED_NOTE = "simulated: figures are the performance model's predictions, not measurements"
UNKNOWN = "unknown"


def mfu(tflops_per_gpu: float | None, gpu: str | None, precision: str) -> float | None:
    """Model FLOPs utilisation: the run's model FLOP/s per GPU (``tflops_per_gpu``, same FLOPs convention) over
    the GPU's dense peak for the format its GEMMs run in: the BF16 peak for a ``bf16`` run, the FP8 peak for an
    ``fp8`` one, the dense FP4 peak for an ``nvfp4`` one (:meth:`dse.facts.hardware.GpuSpec.peak_tflops`). Decision: the peak of the run's own precision, as
    PaLM's definition of MFU (observed over theoretical peak FLOP/s of the hardware for the computation run) and
    Megatron-Bridge's performance tables (FP8 MFU against the FP8 peak) do; an FP8 run measured against the BF16
    peak would read up to twice as high. None when a figure or the GPU is unknown."""
    spec = HARDWARE.get(gpu or "")
    if tflops_per_gpu is None or spec is None:
        return None
    return tflops_per_gpu / spec.peak_tflops(precision)


@dataclass(frozen=True)
class Provenance:
    """Where a study's figures come from: the backend that ran its trials and, when the figures are simulated
    (the ``sim`` backend, or the ``sim`` payload under another backend), the truth they were drawn from and the
    calibration of the model. ``truth`` None: the figures are measurements."""

    backend: str
    truth: str | None = None
    calibration: str | None = None

    @property
    def simulated(self) -> bool:
        return self.truth is not None

    @property
    def figures(self) -> str:
        """What the figures are, in the words ``best/`` uses."""
        return "predicted by the model" if self.simulated else "measured"

    def as_dict(self) -> dict[str, str | None]:
        """The leaderboard's provenance columns and their values (``dse.json``'s and ``best.json``'s table)."""
        return {c: getattr(self, c) for c in PROVENANCE_COLUMNS}

    def describe(self) -> str:
        """One clause naming the backend and, for simulated figures, the truth and the calibration."""
        if not self.simulated:
            return f"{self.backend} backend"
        return f"{self.backend} backend, truth {self.truth}, calibration {self.calibration}"

    def sentence(self) -> str:
        """One sentence for a page's header (the report): simulated figures are the model's, the others measured."""
        if self.simulated:
            return (
                "Simulated: every figure is predicted by the performance model, not measured "
                f"(truth {self.truth}, calibration {self.calibration})."
            )
        if self.backend != UNKNOWN:
            return f"Measured: every figure comes from runs launched by the {self.backend} backend."
        return "Where the figures come from is not recorded (dse.json names no backend)."

    @classmethod
    def of_space(cls, space: Space, backend: str) -> Provenance:
        """The provenance of a study of ``space`` run on ``backend`` (a name of the backend registry). The twin
        truth is the ``sim`` backend's alone and uses no calibration (:mod:`dse.perfmodel.twin`); the ``sim``
        payload under another backend prints the model's figures, calibrated when the space names a file."""
        b = space.backend
        if backend == "replay" or (backend != "sim" and b.payload != "sim"):  # a replay gives recorded measurements
            return cls(backend)
        if backend == "sim" and b.truth == "twin":
            return cls(backend, f"twin (seed {b.twin_seed})", "none")
        return cls(backend, "exact", Path(b.calibration).name if b.calibration else "none")

    @classmethod
    def of_meta(cls, meta: Mapping[str, Any]) -> Provenance:
        """The provenance a study's ``dse.json`` records; a study written before it did: its backend, and
        ``unknown`` truth and calibration for the ``sim`` backend (its figures were simulated)."""
        p = meta.get("provenance")
        if isinstance(p, Mapping) and isinstance(p.get("backend"), str):
            return cls(p["backend"], p.get("truth"), p.get("calibration"))
        backend = str(meta.get("backend") or UNKNOWN)
        return cls(backend, UNKNOWN, UNKNOWN) if backend == "sim" else cls(backend)


def frame(
    records: Iterable[TrialRecord],
    knob_names: Sequence[str],
    *,
    batch: int | None = None,
    provenance: Provenance | None = None,
) -> pd.DataFrame:
    """The leaderboard table of ``records``, ranked. ``batch``: build it ``batch`` records at a time from a
    stream (a frame per batch, concatenated), so no list of records is held: the table of a 200k-trial study
    is ~25 cells a row, far less than its records with their metric dicts (bench/big_grid.py).
    ``provenance``: the ``backend``, ``truth`` and ``calibration`` columns after the metrics."""
    df = _framed(records, knob_names, batch)
    if provenance is not None:
        for i, c in enumerate(PROVENANCE_COLUMNS):
            v = getattr(provenance, c)  # one value for every row: a category holds it once
            code = -1 if v is None else 0  # -1: empty
            cats = pd.Index([] if v is None else [v], dtype=str)
            values = pd.Categorical.from_codes(np.full(len(df), code, np.int8), categories=cats)
            df.insert(len(HEAD) + i, c, pd.Series(values, index=df.index))
    return df


def _framed(records: Iterable[TrialRecord], knob_names: Sequence[str], batch: int | None) -> pd.DataFrame:
    if batch is not None:
        parts, chunk = [], []
        for r in records:
            chunk.append(r)
            if len(chunk) >= batch:
                parts.append(_compact(_unranked(chunk, knob_names)))
                chunk = []
        if chunk or not parts:
            parts.append(_compact(_unranked(chunk, knob_names)))
        _same_categories(parts)
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        del parts, chunk
        return _ranked(df)
    return _ranked(_unranked(records, knob_names))


_FREE_TEXT = ("reason", "run_dir")  # one value per trial: categories would not save anything


def _compact(df: pd.DataFrame) -> pd.DataFrame:
    """Text columns with few distinct values (status, gpu, string knobs) as categories: a code per row instead
    of a Python string object per row (what the CSV says is the same)."""
    for c in df.columns:
        if (
            c not in _FREE_TEXT
            and (df[c].dtype == object or pd.api.types.is_string_dtype(df[c].dtype))
            and df[c].map(type).isin((str, type(None))).all()
        ):
            df[c] = df[c].astype("category")
    return df


def _same_categories(parts: list[pd.DataFrame]) -> None:
    """One set of categories per column over every batch, so that concatenating keeps them categorical (a
    column categorical in one batch only goes back to plain values)."""
    for c in parts[0].columns:
        if all(isinstance(p[c].dtype, pd.CategoricalDtype) for p in parts):
            cats = sorted(set().union(*(p[c].cat.categories for p in parts)), key=str)
            for p in parts:
                p[c] = p[c].cat.set_categories(cats)
        elif any(isinstance(p[c].dtype, pd.CategoricalDtype) for p in parts):
            for p in parts:
                if isinstance(p[c].dtype, pd.CategoricalDtype):
                    p[c] = p[c].astype(object)


def rank_key(r: TrialRecord) -> tuple:
    """A record's place in the leaderboard: ok first, then by reward (highest first, NaN last), then trial."""
    nan = isinstance(r.reward, float) and math.isnan(r.reward)
    return (not r.ok, nan, 0.0 if nan else -r.reward, r.number)


def _unranked(records: Iterable[TrialRecord], knob_names: Sequence[str]) -> pd.DataFrame:
    rows = []
    for r in records:
        row = {"trial": r.number, "status": r.status, "reward": r.reward}
        row.update({m: (r.metrics.get(m) if r.ok else None) for m in METRIC_COLUMNS})
        row.update({m: r.metrics.get(m) for m in PREDICTED_COLUMNS})  # also for a failure: what the model said
        row.update({k: r.knobs.get(k) for k in knob_names})
        row.update(
            gpu=r.gpu,
            num_gpus=r.num_gpus,
            gpu_hours=r.gpu_hours,
            steps=r.metrics.get("steps") if r.status not in UNLAUNCHED_STATUSES else None,
            early_stopped=bool(r.metrics.get("early_stopped", False)),
            gpu_hours_saved=r.metrics.get("gpu_hours_saved"),
            run_dir=r.run_dir,
            reason=r.reason,
        )
        rows.append(row)
    df = pd.DataFrame(rows, columns=[*HEAD, *knob_names, *TAIL])
    # counts stay integers beside a trial that has none (a rejected or screened point ran no step): pandas'
    # nullable integers, which the CSV writes as 50 and an empty field, where a float column writes 50.0
    for c in ("trial", "num_gpus", "steps"):
        df[c] = pd.to_numeric(df[c]).round().astype("Int64")
    return df


def _ranked(df: pd.DataFrame) -> pd.DataFrame:
    """Ok trials first, by reward (highest first, NaN last), then by trial: one stable index sort and one
    ``take``, so a large table is copied once, not once per step."""
    if len(df) <= 1:
        return df
    reward = pd.to_numeric(df["reward"], errors="coerce").to_numpy(dtype=float)
    nan = np.isnan(reward)
    order = np.lexsort((df["trial"].to_numpy(), np.where(nan, 0.0, -reward), nan, (df["status"] != "ok").to_numpy()))
    return df.take(order).reset_index(drop=True)  # pandas' copy-on-write: the new index copies no column


@dataclass(frozen=True)
class ProbeCost:
    """A study's probes (``[search] screen = "probe"``, :mod:`dse.study.probe_screen`) as ``dse.json`` counts them:
    points probed, ranks probed (one one-GPU run each), points the probes screened, and the probes' GPU-minutes
    (measured wall time of one GPU each), which are not in the runs' GPU-hours."""

    points: int = 0
    ranks: int = 0
    screened: int = 0
    gpu_minutes: float = 0.0

    @classmethod
    def of_meta(cls, meta: Mapping[str, Any]) -> ProbeCost | None:
        """``dse.json``'s ``probes``, or None when it has none (or one this dse cannot read: nothing is invented)."""
        got = meta.get("probes")
        if not isinstance(got, dict):
            return None
        try:
            cost = cls(int(got["points"]), int(got["ranks"]), int(got["screened"]), float(got["gpu_minutes"]))
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        return cost if math.isfinite(cost.gpu_minutes) else None

    def as_dict(self) -> dict[str, Any]:
        return {"points": self.points, "ranks": self.ranks, "screened": self.screened, "gpu_minutes": self.gpu_minutes}

    def line(self) -> str:
        """One clause of the runs' line: what the probes cost, apart from the runs."""
        return (
            f"; probes (one GPU each, before launch): {self.points} points on {self.ranks} ranks, "
            f"{self.screened} screened, {self.gpu_minutes:,.1f} GPU-minutes measured (not in the GPU-hours)"
        )


@dataclass(frozen=True)
class Baseline:
    """The layout a study measures itself against: the recipe's default layout for the GPU (NVIDIA's published
    one where dse ships it), as ``dse.json``'s ``baseline`` records it. ``in_space``: the study runs it as its
    first trial; otherwise ``predicted`` holds the model's figures for it (a reference, never launched) and
    ``note`` why it is not measured (not in the space, or a broken rule). ``metric``/``direction``: the
    objective the gain is counted in."""

    knobs: dict[str, Any]
    in_space: bool
    metric: str
    direction: str
    predicted: dict[str, float] | None = None
    note: str | None = None
    # which layout it is, in words (``recipes.models.Recipe.layout_source``): "NVIDIA's preset for gb300/nvfp4", or
    # the recipe's own and why; a study recorded before dse said so reads "the recipe's layout"
    source: str = "the recipe's layout"

    def as_dict(self) -> dict[str, Any]:
        """``dse.json``'s ``baseline`` table."""
        return {
            "knobs": self.knobs,
            "in_space": self.in_space,
            "metric": self.metric,
            "direction": self.direction,
            "predicted": self.predicted,
            "note": self.note,
            "source": self.source,
        }

    @classmethod
    def of_meta(cls, meta: Mapping[str, Any]) -> Baseline | None:
        """The baseline a study's ``dse.json`` records (None for a study written before dse recorded one)."""
        b = meta.get("baseline")
        if not isinstance(b, Mapping) or not isinstance(b.get("knobs"), Mapping):
            return None
        return cls(
            dict(b["knobs"]),
            bool(b.get("in_space")),
            str(b.get("metric", "tflops_per_gpu")),
            str(b.get("direction", "maximize")),
            b.get("predicted"),
            b.get("note"),
            str(b.get("source") or "the recipe's layout"),
        )

    def gain(self, best: float, base: float) -> float:
        """The best's gain over the baseline, as a fraction: more of a maximised metric, the speed-up of a
        minimised one (a step time 10% shorter is a gain of 11.1%)."""
        return best / base - 1.0 if self.direction == "maximize" else base / best - 1.0

    def line(self, best: TrialRecord, measured: TrialRecord | None) -> str:
        """One sentence: "+3.4% over the recipe's layout (trial 0)"; for a baseline outside the space, the gain
        over the model's prediction for it; for a baseline that ran but has no figure, what became of it."""
        layout = ", ".join(f"{k}={v}" for k, v in self.knobs.items())
        src = self.source
        if not self.in_space:
            value = (self.predicted or {}).get(self.metric)
            if not value:
                return f"{src} ({layout}) is not in the space and has no prediction: {self.note}"
            return (
                f"{self.gain(best.metrics[self.metric], value):+.1%} over {src} as the model "
                f"predicts it ({layout}: {value:.4g} {self.metric}; not measured: {self.note})"
            )
        if measured is None:
            return f"{src} ({layout}) has not run yet"
        if not measured.ok:
            why = f": {measured.reason}" if measured.reason else ""
            return f"{src} (trial {measured.number}, {layout}) was {measured.status}{why}"
        if measured.number == best.number:
            return f"the best is {src} itself (trial {measured.number})"
        base = measured.metrics[self.metric]
        return f"{self.gain(best.metrics[self.metric], base):+.1%} over {src} (trial {measured.number})"


#: The error a prediction is labelled with before a study has measured a run: the shipped model is within 10% of
#: the step time on 123 of 132 held-out published rows (docs/performance-model.md; a user's own stack may differ more,
#: which the study's own runs then say).
PRIOR_STEP_ERROR = 0.10


class ModelError:
    """The study's model against its measured runs so far: the mean absolute percentage error of the step time
    and of the peak memory over the ``ok`` trials that have both figures (predicted at launch, measured), and the
    runs out of memory the model said fit (predicted peak within the GPU's memory). Sums only: no list is held."""

    def __init__(self) -> None:
        self.step_sum = self.mem_sum = 0.0
        self.step_n = self.mem_n = self.ooms = self.oom_said_fit = 0

    def add(self, r: TrialRecord) -> None:
        m = r.metrics
        if r.ok:
            if (e := _relative(m.get("predicted_step_time_s"), m.get("step_time_s"))) is not None:
                self.step_sum, self.step_n = self.step_sum + e, self.step_n + 1
            if (e := _relative(m.get("predicted_peak_memory_gib"), m.get("peak_memory_gib"))) is not None:
                self.mem_sum, self.mem_n = self.mem_sum + e, self.mem_n + 1
        elif r.status == "oom":
            self.ooms += 1
            peak, capacity = m.get("predicted_peak_memory_gib"), m.get("predicted_memory_gib")
            self.oom_said_fit += peak is not None and capacity is not None and peak <= capacity

    @property
    def step(self) -> float | None:
        """The step time's MAPE so far (None before a measured ``ok`` run with a prediction)."""
        return self.step_sum / self.step_n if self.step_n else None

    @property
    def memory(self) -> float | None:
        """The peak memory's MAPE so far (None before a measured ``ok`` run with a prediction)."""
        return self.mem_sum / self.mem_n if self.mem_n else None

    def label(self) -> str:
        """How a figure the model predicted is labelled: ``predicted (model error +-X%)``, X the step time's MAPE
        on this study's runs, else the shipped model's on published rows (:data:`PRIOR_STEP_ERROR`)."""
        if self.step is not None:
            return f"predicted (model error +-{self.step:.0%} over {self.step_n} measured runs)"
        return f"predicted (model error +-{PRIOR_STEP_ERROR:.0%} on published layouts; none measured here)"

    def line(self) -> str:
        """The summary's sentence on the model's error so far ('' before any measured run with a prediction)."""
        parts = []
        if self.step is not None:
            parts.append(f"step time +-{self.step:.1%} MAPE over {self.step_n} runs")
        if self.memory is not None:
            parts.append(f"peak memory +-{self.memory:.1%} over {self.mem_n}")
        if self.ooms:
            parts.append(f"{self.oom_said_fit} of {self.ooms} OOM runs the model said fit")
        return "; ".join(parts)


def _relative(predicted: float | None, measured: float | None) -> float | None:
    """|predicted - measured| / measured, or None without both (or a measured figure of 0)."""
    if predicted is None or not measured:
        return None
    return abs(predicted - measured) / measured


class Summary:
    """What a study's summary shows, from one pass over its trials: the ``top`` rows in leaderboard order,
    the statuses counted, launched runs, GPU-hours (spent, and up to the best), early stops, the best ``ok``
    trial. Holds ``top`` records (at most twice that while adding) and one (number, GPU-hours) pair per trial,
    16 bytes, for the GPU-hours up to the best, which is known only at the end; never the study's records.
    ``provenance``: where the study's figures come from, when the caller knows (the summary says so).
    ``baseline``: the study's baseline as ``dse.json`` records it (:class:`Baseline`), when it does.
    ``probes``: what its probes cost (:class:`ProbeCost`), when it probed."""

    def __init__(
        self,
        top: int = 20,
        provenance: Provenance | None = None,
        baseline: Baseline | None = None,
        probes: ProbeCost | None = None,
    ):
        self.top = max(0, int(top))
        self.provenance = provenance
        self.baseline = baseline
        self.probes = probes
        self.baseline_trial: TrialRecord | None = None  # the first trial that ran the baseline's point
        self._rows: list[TrialRecord] = []
        self.counts: Counter = Counter()
        self.n = self.launched = self.stopped = self.pruned = 0
        self.spent = self.saved = 0.0
        self.best: TrialRecord | None = None
        self.model = ModelError()  # the model's error on the study's runs so far
        self._numbers, self._hours = array("q"), array("d")

    @classmethod
    def of(cls, records: Iterable[TrialRecord], top: int = 20) -> Summary:
        s = cls(top)
        for r in records:
            s.add(r)
        return s

    def feed(self, records: Iterable[TrialRecord]) -> Iterator[TrialRecord]:
        """``records`` passed through, each added on the way (one pass feeds the summary and a writer)."""
        for r in records:
            self.add(r)
            yield r

    def add(self, r: TrialRecord) -> None:
        self.n += 1
        self.counts[r.status] += 1
        self.model.add(r)
        if (
            self.baseline is not None
            and self.baseline.in_space
            and r.knobs == self.baseline.knobs
            and not r.interrupted
        ):
            if self.baseline_trial is None or r.number < self.baseline_trial.number:
                self.baseline_trial = r
        self.launched += r.status not in UNLAUNCHED_STATUSES
        h = r.gpu_hours or 0.0  # trials without a figure (recorded before GPU-hours were) count as 0
        self.spent += h
        self._numbers.append(r.number)
        self._hours.append(h)
        if r.metrics.get("early_stopped") or r.status == "pruned":  # as early_stop_savings counts them
            self.stopped += bool(r.metrics.get("early_stopped"))
            self.pruned += r.status == "pruned"
            self.saved += r.metrics.get("gpu_hours_saved") or 0.0
        if r.ok and (self.best is None or (r.reward, -r.number) > (self.best.reward, -self.best.number)):
            self.best = r
        if self.top:
            self._rows.append(r)
            if len(self._rows) >= 2 * self.top + 64:
                self._rows = sorted(self._rows, key=rank_key)[: self.top]

    @property
    def rows(self) -> list[TrialRecord]:
        """The top records, in leaderboard order."""
        self._rows = sorted(self._rows, key=rank_key)[: self.top]
        return list(self._rows)

    def baseline_line(self) -> str:
        """The best's gain over the study's baseline, with where its figures come from ('' when the study records
        none, or has no best yet)."""
        if self.baseline is None or self.best is None:
            return ""
        text = self.baseline.line(self.best, self.baseline_trial)
        if not self.baseline.in_space and (self.baseline.predicted or {}).get(self.baseline.metric):
            return f"{text}; the best {self.source()}, {self.baseline.source} {self.model.label()}"
        return f"{text}: {self.source()}" if "%" in text else text

    def baseline_gain(self) -> tuple[float, bool] | None:
        """The best's gain over the baseline as a fraction (what :meth:`baseline_line` leads with), and whether the
        baseline's figure is the model's prediction (a baseline outside the space); None where the line has no
        gain (no baseline or best, a baseline not run yet, failed, or without a prediction)."""
        b, best = self.baseline, self.best
        if b is None or best is None:
            return None
        if b.in_space:
            ran = self.baseline_trial
            value = ran.metrics.get(b.metric) if ran is not None and ran.ok else None
        else:
            value = (b.predicted or {}).get(b.metric)
        mine = best.metrics.get(b.metric)
        return (b.gain(mine, value), not b.in_space) if value and mine else None

    def source(self) -> str:
        """Where the study's own figures come from: ``measured``, or ``predicted (simulated ...)`` for the
        simulated backend's (the model's own, whatever their truth)."""
        if self.provenance is not None and self.provenance.simulated:
            return f"predicted (simulated, truth {self.provenance.truth})"
        return "measured"

    def model_line(self) -> str:
        """The model's error so far, predicted at launch against measured (:class:`ModelError`); '' before any."""
        p = self.provenance
        if p is not None and p.simulated and not str(p.truth).startswith("twin"):
            return ""  # the model's own figures (exact truth): its error against them says nothing
        if not (body := self.model.line()):
            return ""
        against = "simulated" if self.provenance is not None and self.provenance.simulated else "measured"
        return f"model error so far (predicted at launch vs {against}): {body}"

    @property
    def rows_held(self) -> int:
        """Records held now (tests check that this stays bounded by ``top``, not by the study)."""
        return len(self._rows)

    @property
    def to_best(self) -> float | None:
        """GPU-hours spent up to and including the best ``ok`` trial (None: no ok trial)."""
        if self.best is None:
            return None
        b = self.best.number
        return sum(h for n, h in zip(self._numbers, self._hours) if n <= b)

    def runs_line(self) -> str:
        """Launched runs, screened points and GPU-hours (spent, up to the best) and the early stops: one sentence,
        the same in ``dse run``'s summary, ``dse leaderboard`` and the report's header."""
        screened = self.counts.get("screened", 0)
        return (
            f"launched runs: {self.launched}"
            + (f"; screened (not launched): {screened}" if screened else "")
            + f"; GPU-hours: {self.spent:,.1f} spent"
            + (f", {to_best:,.1f} to the best" if (to_best := self.to_best) is not None else "")
            + self.savings_line()
            + (self.probes.line() if self.probes is not None else "")
        )

    def savings_line(self) -> str:
        """:func:`savings_line` of the trials added."""
        if not (self.stopped or self.pruned):
            return ""
        return (
            f"; early stop: {self.stopped} trials"
            + (f", {self.pruned} pruned" if self.pruned else "")
            + f", {self.saved:,.1f} GPU-hours saved"
        )


def relative_run_dirs(df: pd.DataFrame, study_dir: str | Path) -> pd.DataFrame:
    """``df``'s ``run_dir`` column relative to ``study_dir`` (``trials/00003``), in place. Decision: the study's
    ``leaderboard.csv`` and an export (``dse leaderboard DIR --csv FILE``) write the same table, run directories
    relative to the study directory, as the store and ``best/best.json`` keep them: a moved or copied study's
    tables stay right, and an export names the study it came from by its command (``DIR``)."""
    prefix = os.path.join(os.path.abspath(study_dir), "")
    # string prefixes, not os.path.relpath: one row per trial (185k on the big grid)
    df["run_dir"] = [p[len(prefix) :] if isinstance(p, str) and p.startswith(prefix) else p for p in df["run_dir"]]
    return df


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write atomically (a temp file renamed into place), so a reader never sees half a table. A text cell that a
    spreadsheet would read as a formula (``=``, ``+``, ``-``, ``@``) is written with a leading ``'``
    (:func:`dse.inputs.csv_cell`; dse's readers take it off)."""
    path = checked_output(Path(path), "csv")
    safe = df.copy()
    for col in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[col]):  # text (object or pandas' str dtype): its cells
            safe[col] = safe[col].map(csv_cell)
    try:
        with atomic_write(path, newline="") as fh:  # newline="": pandas writes its own line ends
            safe.to_csv(fh, index=False)
    except OSError as e:
        raise output_error(e, path, "csv") from None
    return path


def gpu_hours(records: Sequence[TrialRecord]) -> tuple[float, float | None]:
    """GPU-hours spent by the study, and spent up to and including its best ``ok`` trial (None: no ok trial).

    Trials without a figure (recorded before GPU-hours were) count as 0."""
    ordered = sorted(records, key=lambda r: r.number)
    spent = sum(r.gpu_hours or 0.0 for r in ordered)
    ok = [r for r in ordered if r.ok]
    if not ok:
        return spent, None
    best = max(ok, key=lambda r: (r.reward, -r.number))
    return spent, sum(r.gpu_hours or 0.0 for r in ordered if r.number <= best.number)


def early_stop_savings(records: Sequence[TrialRecord]) -> tuple[int, int, float]:
    """(trials stopped early once converged, trials pruned, GPU-hours both saved against running every trial
    to ``max_steps``)."""
    stopped = [r for r in records if r.metrics.get("early_stopped")]
    pruned = [r for r in records if r.status == "pruned"]
    return len(stopped), len(pruned), sum(r.metrics.get("gpu_hours_saved") or 0.0 for r in stopped + pruned)


def savings_line(records: Sequence[TrialRecord]) -> str:
    """The summary's early-stop sentence ('' when no trial was stopped early or pruned)."""
    n, p, saved = early_stop_savings(records)
    if not (n or p):
        return ""
    return f"; early stop: {n} trials" + (f", {p} pruned" if p else "") + f", {saved:,.1f} GPU-hours saved"


def checked_output(path: Path, param: str) -> Path:
    """``path``, checked before anything is read or written: a :class:`UserError` when it is a directory or
    its folder does not exist (nothing is written then)."""
    if path.is_dir():
        raise UserError("is a directory; give a file name", file=str(path), param=param)
    if not path.parent.is_dir():
        raise UserError("its folder does not exist", file=str(path), param=param)
    return path


def output_error(e: OSError, path: Path, param: str) -> Exception:
    """A full disk is dse's trouble (:class:`InfrastructureError`); anything else the user's choice of path."""
    return infrastructure(e, f"cannot write {path}") or UserError(
        f"cannot write: {e.strerror or e}", file=str(path), param=param
    )
