"""How a study learns: the model refit on the study's own measured runs, the screen's margin from the model's
measured error, and the out-of-memory neighbour rule.

The model is a prior (the shipped parameters, or the space's ``[backend] calibration``). After each measured run
(a real backend, a replay, or the simulated backend's ``twin`` truth, which stands in for a machine that is not the
model; never the simulated backend's ``exact`` truth, whose runs are the model itself and teach it nothing) the
study refits the step-time and memory parameters on its runs with :mod:`dse.perfmodel.calibrate`'s MAP fit (priors centred
on the prior's values), an out-of-memory run counting as a censored observation: its peak is above the GPU's memory
(:func:`dse.perfmodel.calibrate.memory_loss`). The fit is kept small so that it costs milliseconds per run: at most
:data:`MAX_TIME` time parameters (the first of :data:`dse.perfmodel.calibrate.STACK_TIME` the runs move) and as many memory
parameters as runs with a peak or an out-of-memory end, of three the runs move (:meth:`StudyModel._memory_candidates`:
the constant offset, the bytes per logit element of the runs' loss, the allocator's share of the activations), from
the previous fit's values (``bench/refit.py`` measures it). The logits grow with the micro-batch whatever the
recompute, so one out-of-memory run of a larger micro-batch raises every larger micro-batch's prediction, not only
its own point's.

The screen's margin: before the first measured peak, the space's ``[search] screen_margin`` (the shipped figure);
then the largest share of the GPU's memory by which the refit model missed a measured peak on the study's runs,
plus :data:`MARGIN_FLOOR`, and never more than the space's margin: the margin narrows as runs agree.

The out-of-memory neighbour rule: a point that needs at least the memory of a point that ran out (the same values
but a larger or equal micro-batch, sequence, and less or equal recompute) is not launched (``screened``, with the
out-of-memory trial it follows from), whatever the model says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dse.facts.calibration_file import Calibration
from dse.perfmodel.calibrate import (
    CALIBRATION_PRIORS,
    LOGITS_MEMORY,
    MEMORY,
    STACK_TIME,
    Loss,
    Run,
    errors,
    memory_loss,
    time_loss,
)
from dse.perfmodel.fit import nelder_mead
from dse.perfmodel.model import Prediction, Prepared, prepare
from dse.perfmodel.timing import Params
from dse.rules.space import Space

__all__ = ["MARGIN_FLOOR", "MAX_TIME", "StudyModel", "needs_more_memory"]

MAX_TIME = 2  # time parameters refit per run: a bounded subset, so that a refit costs milliseconds
CACHE = 20_000  # points kept prepared (the guided agent forecasts every point again after each refit)
QUICK_ITERS = 200  # one Nelder-Mead descent per refit, from the last fit's values (bench/refit.py times it)
MARGIN_FLOOR = 0.01  # the screen's margin never narrows below 1% of the GPU's memory
# knobs whose larger values need more memory, everything else equal (recompute: less recompute keeps more)
_MORE = {"mbs": None, "seq_length": None, "recompute": ("full", "selective", "none")}


def _order(name: str, value: Any) -> float:
    ranks = _MORE[name]
    if ranks is None:
        return float(value)
    return float(ranks.index(value)) if value in ranks else math.nan


def needs_more_memory(values: Mapping[str, Any], ran_out: Mapping[str, Any]) -> bool:
    """Whether a point (its resolved ``values``) needs at least the memory of ``ran_out``'s: every value the same
    but a larger or equal ``mbs`` and ``seq_length`` and a less or equal ``recompute``."""
    for k, v in ran_out.items():
        if k in _MORE:
            a, b = _order(k, values.get(k)), _order(k, v)
            if not (a >= b):  # NaN (a value outside the order) is not comparable: not a neighbour
                return False
        elif values.get(k) != v:
            return False
    return True


def _quick_fit(
    names: list[str], loss: Loss, base: Params, start: Params, centre_at: Params, *, restarts: bool = False
) -> Params:
    """dse calibrate's MAP fit of ``names`` (the loss plus Gaussian priors of calibrate's widths centred on
    ``centre_at``'s values: the study's prior, the shipped model or the calibration it starts from), in one
    short descent from ``start``'s values (the last refit's: one more run moves the optimum little) instead of
    calibrate's restarts and coordinate grid; ``base`` gives every other parameter. ``restarts``: also one descent
    from each parameter moved one prior width up, the best kept: the peak is a maximum of terms (a layer's backward
    working set or the logits), flat in a parameter until its term is the largest, where one descent from the last
    values never moves it (the memory fit's loss costs microseconds, so the extra descents cost little)."""
    priors = [CALIBRATION_PRIORS[n] for n in names]
    centre = np.array([p.to_z(getattr(centre_at, n)) for n, p in zip(names, priors)])
    width = np.array([p.width for p in priors])
    z0 = np.array([p.to_z(getattr(start, n)) for n, p in zip(names, priors)])

    def to_params(z: np.ndarray) -> Params:
        return base.with_values(**{n: p.from_z(float(v)) for n, p, v in zip(names, priors, z)})

    def objective(z: np.ndarray) -> float:
        return loss(to_params(z)) + float(np.sum(((z - centre) / width) ** 2))

    starts = [z0] + ([z0 + width * np.eye(len(names))[k] for k in range(len(names))] if restarts else [])
    fits = [nelder_mead(objective, z, step=0.3, iters=QUICK_ITERS, tol=1e-4) for z in starts]
    return to_params(min(fits, key=objective))


def _key(trial) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in trial.values.items())) + tuple(sorted(trial.env.items()))


@dataclass
class StudyModel:
    """The study's model: ``prior`` refit on its measured ``runs`` (``params``). ``learns``: whether the study's
    runs are evidence (see the module docstring)."""

    space: Space
    prior: Params
    learns: bool
    params: Params = field(init=False)
    runs: list[Run] = field(default_factory=list)
    ooms: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (trial number, resolved values)
    contradictions: list[str] = field(default_factory=list)  # out-of-memory runs the screen had let through
    # GiB: the most a run's peak came above the model's forecast at its launch (an out-of-memory run: at least up to
    # the GPU's memory); it starts at the figure the prior's calibration carries, and the calibration file keeps it
    memory_miss: float = 0.0
    cache: int = CACHE
    _prepared: dict[tuple, Prepared] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.params = self.prior

    # -- predictions -------------------------------------------------------------------------------------
    def prepared(self, trial) -> Prepared:
        key = _key(trial)
        got = self._prepared.get(key)
        if got is None:
            got = prepare(trial, flops_convention=self.space.backend.flops_convention)
            if len(self._prepared) < self.cache:
                self._prepared[key] = got
        return got

    def predict(self, trial) -> Prediction:
        """The prediction of ``trial`` under the current (refit) parameters."""
        return self.prepared(trial).predict(self.params)

    @property
    def margin(self) -> float:
        """The screen's margin (a share of the GPU's memory): the space's until a peak is measured, then the
        largest miss of a measured peak on the study's runs plus :data:`MARGIN_FLOOR`, at most the space's."""
        shipped = self.space.search.screen_margin
        misses = [
            abs(self.prepared(r.trial).peak_memory_gib(self.params) - r.peak_memory_gib)
            / self.prepared(r.trial).hw.memory_gib
            for r in self.runs
            if r.peak_memory_gib
        ]
        if not misses:
            return shipped
        return min(shipped, max(misses) + MARGIN_FLOOR)

    def oom_neighbour(self, trial) -> str | None:
        """Why ``trial`` is not launched by the out-of-memory neighbour rule, or None."""
        for number, values in self.ooms:
            if needs_more_memory(trial.values, values):
                return f"needs at least the memory of trial {number}, which ran out of memory"
        return None

    # -- learning ----------------------------------------------------------------------------------------
    def observe(
        self, number: int, trial, status: str, metrics: Mapping[str, Any] | None, *, refit: bool = True
    ) -> str | None:
        """A finished run: evidence when it is measured (ok with a step time, or out of memory); then the model is
        refit and the one line that says so returned (None when nothing was learnt)."""
        metrics = metrics or {}
        self._note_miss(trial, status, metrics)
        if status == "oom":
            self.ooms.append((number, dict(trial.values)))
            if self.predict(trial).peak_memory_gib <= self.prepared(trial).hw.memory_gib * (1 + self.margin):
                point = ", ".join(f"{k} {trial.values.get(k)}" for k in self.space.knob_names)
                self.contradictions.append(
                    f"trial {number} ({point}) ran out of memory where the model said it fits "
                    f"(predicted {self.predict(trial).peak_memory_gib:.1f} GiB of {self.prepared(trial).hw.memory_gib:.0f})"
                )
            run = Run(f"trial {number}", trial, None, None, oom=True)
        elif status == "ok" and metrics.get("step_time_s"):
            peak = metrics.get("peak_memory_gib")
            run = Run(f"trial {number}", trial, float(metrics["step_time_s"]), float(peak) if peak else None)
        else:
            return None
        if not self.learns:
            return None
        self.runs.append(run)
        return self.refit() if refit else None

    def _note_miss(self, trial, status: str, metrics: Mapping[str, Any]) -> None:
        """How far a measured run came above the forecast it launched with (the trial's ``predicted_peak_memory_gib``,
        else the model's prediction now): :attr:`memory_miss` keeps the largest."""
        if status not in ("ok", "oom") or (status == "ok" and not metrics.get("peak_memory_gib")):
            return
        predicted = metrics.get("predicted_peak_memory_gib")
        predicted = float(predicted) if predicted is not None else self.predict(trial).peak_memory_gib
        came = self.prepared(trial).hw.memory_gib if status == "oom" else float(metrics["peak_memory_gib"])
        if math.isfinite(came - predicted):
            self.memory_miss = max(self.memory_miss, came - predicted)

    def refit(self) -> str | None:
        """Refit on the runs so far (a bounded subset of parameters, from the prior's values); the one line."""
        if not self.runs:
            return None
        n_time = sum(1 for r in self.runs if r.step_time_s)
        n_mem = sum(1 for r in self.runs if r.peak_memory_gib or r.oom)
        time_names = [n for n in STACK_TIME if self._moves_time(n)][: min(n_time, MAX_TIME)]
        mem_names = [n for n in self._memory_candidates() if self._moves_memory(n)][:n_mem]
        P = self.params
        if time_names:
            P = _quick_fit(time_names, time_loss(self.runs), self.prior, P, self.prior)
        if mem_names:
            P = _quick_fit(mem_names, memory_loss(self.runs), P, P, self.prior, restarts=True)
        self.params = P
        return self.describe()

    def _memory_candidates(self) -> list[str]:
        """The memory parameters a refit may move, in order: the constant offset, the bytes per logit element of
        the runs' loss (:data:`dse.perfmodel.calibrate.LOGITS_MEMORY`: the one term that grows with the micro-batch in every
        recompute mode and that a stack's loss sets), then the allocator's share of the activations."""
        logits = {"te": "logits_bytes"}
        losses = {logits.get(self.prepared(r.trial).stack.cross_entropy, LOGITS_MEMORY[1]) for r in self.runs}
        return [MEMORY[0], *sorted(losses), *MEMORY[1:]]

    def _moves_memory(self, name: str) -> bool:
        """Whether moving ``name`` one prior width up moves some run's predicted peak (an out-of-memory run's too)
        by more than half a percent: a parameter no run depends on is not identifiable."""
        pr = CALIBRATION_PRIORS[name]
        moved = self.params.with_values(**{name: pr.from_z(pr.to_z(getattr(self.params, name)) + pr.width)})
        return any(
            abs(self.prepared(r.trial).peak_memory_gib(moved) / self.prepared(r.trial).peak_memory_gib(self.params) - 1)
            > 0.005
            for r in self.runs
            if r.peak_memory_gib or r.oom
        )

    def _moves_time(self, name: str) -> bool:
        pr = CALIBRATION_PRIORS[name]
        moved = self.prior.with_values(**{name: pr.from_z(pr.to_z(getattr(self.prior, name)) + pr.width)})
        return any(
            abs(math.log(self.prepared(r.trial).step_time_s(moved) / self.prepared(r.trial).step_time_s(self.prior)))
            > 0.005
            for r in self.runs
            if r.step_time_s
        )

    def describe(self) -> str:
        """One line: how the refit moved the step time and the peak memory, after how many runs, and the model's
        measured error on them."""
        runs = self.runs
        ratio = math.exp(
            sum(
                math.log(
                    self.prepared(r.trial).step_time_s(self.params) / self.prepared(r.trial).step_time_s(self.prior)
                )
                for r in runs
            )
            / len(runs)
        )
        mem = sum(
            self.prepared(r.trial).peak_memory_gib(self.params) - self.prepared(r.trial).peak_memory_gib(self.prior)
            for r in runs
        ) / len(runs)
        err = errors(runs, self.params) if any(r.step_time_s for r in runs) else {}
        parts = [f"model: step time x{ratio:.2f}, peak memory {mem:+.1f} GiB after {len(runs)} runs"]
        if err.get("step_time_mape") is not None:
            parts.append(f"measured step-time error {err['step_time_mape']:.1f}%")
        parts.append(f"screen margin {100 * self.margin:.0f}%")
        return parts[0] + " (" + ", ".join(parts[1:]) + ")"

    def calibration(self, gpu: str, source: str) -> Calibration:
        """The refit as a calibration file's content (``--calibration``, ``--warm-start`` take it)."""
        names = sorted({*STACK_TIME, *MEMORY, *LOGITS_MEMORY})
        return Calibration(
            gpu=gpu,
            params={n: float(getattr(self.params, n)) for n in names},
            sources=[source],
            runs=len(self.runs),
            fit={"after": errors(self.runs, self.params)},
            memory_miss_gib=self.memory_miss,
        )
