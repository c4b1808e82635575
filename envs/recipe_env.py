"""``RecipeEnv``: a Gymnasium environment in which each ``step`` is one trial of a space.

Action: a ``Dict`` of ``Discrete`` spaces, one per varying knob (the index of its value in the space file). An action
not in that space (a knob missing or unknown, an index out of range, a value that is not an integer: a float, a bool
or a complex number, however integral) is a ``ValueError`` from ``step``, never truncated or run.
Observation: the run's status and its metrics (0 where unknown; the ``info`` dict has ``None`` there).
Reward: from the space's objective (:mod:`dse.reward`).

``step`` is decode, check, run, reward: a point that breaks a constraint is ``rejected`` with the failure
reward and never launched; a valid one runs through :func:`dse.execute.run_trial` in the directory that
``run_dirs()`` names. The outcome is in ``info`` (status, reason, knobs, metrics, whether it launched). The
environment records nothing and numbers nothing of its own but run directories: the study (``dse.study.loop``)
numbers and records trials, so the environment works from any RL library without a store.

Pruning (``[backend.early_stop] prune_margin``) compares a running trial with ``best()``, the best value of the
objective's metric measured so far: the study passes its own (it knows the trials of a resumed study, and
of other workers); without one the environment uses the best of its own ``ok`` steps. ``cancel`` (the study's,
under ``--parallel``) stops the runs in flight through their backend's stop check (:func:`dse.execute.run_trial`).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dse.backends.base import Backend
from dse.execute import run_trial
from dse.logs.parse import STATUSES, RunMetrics
from dse.reward import reward as compute_reward
from dse.rules import constraints
from dse.rules.points import Points
from dse.rules.space import Objective, Space
from dse.rules.trial import TrialConfig

METRIC_KEYS = ("step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib")
_STATUS_INDEX = {s: i + 1 for i, s in enumerate(STATUSES)}  # 0 = no trial yet


def better(
    best: float | None, metrics: RunMetrics | dict[str, Any], objective: Objective, *, ok: bool | None = None
) -> float | None:
    """``best`` updated with one trial's metrics (a RunMetrics, or a stored metrics dict with ``ok``): only
    an ``ok`` trial with a finite value of the objective's metric counts."""
    if isinstance(metrics, RunMetrics):
        ok, value = metrics.ok, getattr(metrics, objective.metric)
    else:
        value = metrics.get(objective.metric)
    if not ok or value is None or not math.isfinite(value):
        return best
    if best is None:
        return float(value)
    return max(best, value) if objective.sense == "maximize" else min(best, value)


class RecipeEnv(gym.Env):
    """One trial per step. ``run_dirs`` gives the run directory of the next launched trial (default:
    ``out_dir/trials/NNNNN``, numbered by the launches of this environment)."""

    metadata = {"render_modes": []}
    action_space: spaces.Dict  # one Discrete per varied knob (agents read it as such)

    def __init__(
        self,
        space: Space,
        backend: Backend,
        out_dir: str | Path,
        run_dirs: Callable[[], Path] | None = None,
        best: Callable[[], float | None] | None = None,
        cancel: threading.Event | None = None,
        points: Points | None = None,
    ):
        self.space, self.backend, self.cancel = space, backend, cancel
        # each point resolved and checked once: the study's evaluator (shared with its agent, screen and model)
        self.points = points if points is not None else Points(space)
        self.out_dir = Path(out_dir)
        self._names = space.knob_names
        self._values = [space.knobs[n] for n in self._names]
        # an OrderedDict keeps the space file's knob order (gymnasium sorts the keys of a plain dict)
        self.action_space = spaces.Dict(
            OrderedDict((n, spaces.Discrete(len(v))) for n, v in zip(self._names, self._values))
        )
        box = spaces.Box(low=0.0, high=1e9, shape=(1,), dtype=np.float64)  # finite: gymnasium warns on inf
        self.observation_space = spaces.Dict(
            {"status": spaces.Discrete(len(STATUSES) + 1), **{k: box for k in METRIC_KEYS}}
        )
        self._launched = 0
        self.run_dirs = run_dirs or (lambda: self.out_dir / "trials" / f"{self._launched:05d}")
        self._seed = 0  # the study's seed (from reset): the simulated jitter of a trial depends on it
        self._best: float | None = None  # the best metric of this environment's own ok steps
        self.best = best or (lambda: self._best)

    # -- helpers -------------------------------------------------------------------------------------
    def decode(self, action: dict[str, Any]) -> dict[str, Any]:
        """The space point (knob -> value) an action selects."""
        return {n: vals[int(action[n])] for n, vals in zip(self._names, self._values)}

    def encode(self, point: dict[str, Any]) -> dict[str, int]:
        """The action that selects ``point``; raises KeyError/ValueError for a point outside the space."""
        return {n: vals.index(point[n]) for n, vals in zip(self._names, self._values)}

    def trial(self, action: dict[str, Any]) -> TrialConfig:
        return self.points.trial(self.decode(action))

    def rejection(self, action: dict[str, Any]) -> constraints.Rejection | None:
        """Why the action's point would be rejected (None when valid). Nothing is launched or recorded."""
        return self._rejected(self.decode(action))

    def _rejected(self, point: dict[str, Any]) -> constraints.Rejection | None:
        broken = self.points.check(point)
        return broken if broken is not None else self._refused(self.points.trial(point))

    def check(self, trial: TrialConfig) -> constraints.Rejection | None:
        """The first validity rule ``trial`` breaks, else the backend's refusal (a replay table without the point,
        :meth:`dse.backends.base.Backend.refusal`) as a rule named after the backend; None when it may launch."""
        broken = constraints.check(trial)
        return broken if broken is not None else self._refused(trial)

    def _refused(self, trial: TrialConfig) -> constraints.Rejection | None:
        why = self.backend.refusal(trial)
        return None if why is None else constraints.Rejection(self.backend.name, why)

    def action_mask(self, action: dict[str, Any]) -> bool:
        """Gymnasium-style action masking for agents that skip invalid points: True when valid."""
        return self.rejection(action) is None

    def _obs(self, status: str | None, metrics: dict[str, Any]) -> dict[str, Any]:
        obs: dict[str, Any] = {"status": _STATUS_INDEX.get(status, 0) if status else 0}
        for k in METRIC_KEYS:
            v = metrics.get(k)
            obs[k] = np.array([min(v, 1e9) if v is not None and math.isfinite(v) and v > 0 else 0.0], dtype=np.float64)
        return obs

    # -- gymnasium API -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed = seed
        return self._obs(None, {}), {}

    def check_action(self, action: Any) -> None:
        """A ValueError when ``action`` is not in the action space (see the module docstring)."""
        ok = isinstance(action, dict) and set(action) == set(self._names)
        ok = ok and all(not isinstance(v, bool) and isinstance(v, int | np.integer) for v in action.values())
        if not (ok and all(0 <= action[n] < len(v) for n, v in zip(self._names, self._values))):
            raise ValueError(
                f"action {action!r} is not in the action space {self.action_space}: give a dict of one integer per "
                f"knob ({', '.join(self._names)}), each from 0 to its number of values - 1"
            )

    def step(self, action: dict[str, Any]):
        self.check_action(action)
        point = self.decode(action)
        trial = self.points.trial(point)
        rejected = self._rejected(point)
        if rejected:
            metrics = RunMetrics.rejected(f"{rejected.rule}: {rejected.reason}")
        else:
            run_dir = self.run_dirs()
            self._launched += 1
            metrics = run_trial(
                trial,
                run_dir,
                self.backend,
                self.space.backend,
                seed=self._seed,
                objective=self.space.objective,
                best=self.best,
                cancel=self.cancel,
            )
            self._best = better(self._best, metrics, self.space.objective)
        return self.outcome(action, metrics, launched=not rejected, trial=trial)

    def outcome(
        self, action: dict[str, Any], metrics: RunMetrics, *, launched: bool = True, trial: TrialConfig | None = None
    ):
        """``step``'s return for ``action`` given its run's ``metrics`` (also for a run parsed outside ``step``:
        a Slurm job found finished after a Ctrl-C)."""
        trial = trial or self.trial(action)
        r = compute_reward(metrics, self.space.objective)
        values = {k: v for k, v in metrics.to_dict().items() if k not in ("status", "reason")}
        # info holds what the action determined (deterministic, as gymnasium's checker demands): the run
        # directory is the caller's (``run_dirs``), not part of the outcome.
        info = {
            "status": metrics.status,
            "reason": metrics.reason,
            "knobs": self.decode(action),
            "metrics": values,
            "launched": launched,
            "gpu": trial.system.gpu,
            "num_gpus": trial.num_gpus,
        }
        return self._obs(metrics.status, values), r, False, False, info
