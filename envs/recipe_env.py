"""``RecipeEnv``: a Gymnasium environment in which each ``step`` is one trial of a space.

Action: a ``Dict`` of ``Discrete`` spaces, one per varying knob (the index of its value in the space file).
Observation: the run's status and its metrics (0 where unknown; the ``info`` dict has ``None`` there).
Reward: from the space's objective (:mod:`dse.reward`). A point that breaks a constraint is recorded as
``rejected`` with the failure reward and never launched. Every step is recorded in the store (when one is
given) before it returns, so the reward the agent receives is the reward the store keeps.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dse import constraints
from dse.backends.base import Backend
from dse.errors import UserError
from dse.launch import build_plan
from dse.parse import STATUSES, ParseContext, RunMetrics, parse_log
from dse.perfmodel import model_flops_per_step
from dse.reward import reward as compute_reward
from dse.space import Space
from dse.store import INTERRUPTED, Store, TrialRecord
from dse.trial import TrialConfig, resolve

METRIC_KEYS = ("step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib")
_STATUS_INDEX = {s: i + 1 for i, s in enumerate(STATUSES)}  # 0 = no trial yet


class RecipeEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, space: Space, backend: Backend, out_dir: str | Path, store: Store | None = None):
        self.space, self.backend, self.store = space, backend, store
        self.out_dir = Path(out_dir)
        self._names = space.knob_names
        self._values = [space.knobs[n] for n in self._names]
        # an OrderedDict keeps the space file's knob order (gymnasium sorts the keys of a plain dict)
        self.action_space = spaces.Dict(OrderedDict((n, spaces.Discrete(len(v))) for n, v in zip(self._names, self._values)))
        box = spaces.Box(low=0.0, high=1e9, shape=(1,), dtype=np.float64)  # finite: gymnasium warns on inf
        self.observation_space = spaces.Dict({"status": spaces.Discrete(len(STATUSES) + 1),
                                              **{k: box for k in METRIC_KEYS}})
        self._count = 0  # trial numbers when there is no store
        self.last_record: TrialRecord | None = None
        self._seed = 0  # the study's seed (from reset): the simulated jitter of a trial depends on it

    # -- helpers -------------------------------------------------------------------------------------
    def decode(self, action: dict[str, Any]) -> dict[str, Any]:
        """The space point (knob -> value) an action selects."""
        return {n: vals[int(action[n])] for n, vals in zip(self._names, self._values)}

    def encode(self, point: dict[str, Any]) -> dict[str, int]:
        """The action that selects ``point``; raises KeyError/ValueError for a point outside the space."""
        return {n: vals.index(point[n]) for n, vals in zip(self._names, self._values)}

    def trial(self, action: dict[str, Any]) -> TrialConfig:
        return resolve(self.space, self.decode(action))

    def rejection(self, action: dict[str, Any]) -> constraints.Rejection | None:
        """Why the action's point would be rejected (None when valid). Nothing is launched or recorded."""
        return constraints.check(self.trial(action))

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

    def step(self, action: dict[str, Any]):
        if not self.action_space.contains({k: np.int64(v) for k, v in action.items()}):
            raise ValueError(f"action {action!r} is not in the action space {self.action_space}")
        point = self.decode(action)
        number = self.store.next_number() if self.store is not None else self._count
        trial = resolve(self.space, point)
        run_dir: Path | None = None
        rejected = constraints.check(trial)
        if rejected:
            metrics = RunMetrics.rejected(f"{rejected.rule}: {rejected.reason}")
        else:
            run_dir = self.out_dir / "trials" / f"{number:05d}"
            metrics = self._launch(trial, run_dir)
        r = compute_reward(metrics, self.space.objective)
        rec = TrialRecord(number=number, knobs=point, status=metrics.status, reward=r, reason=metrics.reason,
                          metrics={k: v for k, v in metrics.to_dict().items() if k not in ("status", "reason")},
                          run_dir=str(run_dir) if run_dir else None, gpu=trial.system.gpu, num_gpus=trial.num_gpus)
        if self.store is not None:
            self.store.record(rec)
        self._count += 1
        self.last_record = rec
        # info holds what the action determined (deterministic, as gymnasium's checker demands); the trial's
        # number and run directory are in ``last_record``.
        info = {"status": metrics.status, "reason": metrics.reason, "knobs": point, "metrics": rec.metrics}
        return self._obs(metrics.status, rec.metrics), r, False, False, info

    def _launch(self, trial: TrialConfig, run_dir: Path) -> RunMetrics:
        if run_dir.exists():
            # Left by a run killed before its trial reached the store (records are written in batches):
            # keep it aside, never mix its files with this trial's.
            i = 0
            while (aside := run_dir.with_name(f"{run_dir.name}.orphan{i}")).exists():
                i += 1
            run_dir.rename(aside)
        run_dir.mkdir(parents=True)
        b = self.space.backend
        try:
            plan = build_plan(trial, payload=b.payload, seed=self._seed)
        except UserError as e:  # a value the launch path refuses: this trial fails, the study goes on
            return RunMetrics("failed", f"launch plan: {e}")
        ctx = ParseContext(gbs=trial.gbs, seq_length=trial.seq_length, num_gpus=trial.num_gpus,
                           model_flops_per_step=model_flops_per_step(trial.arch, trial.gbs, trial.seq_length,
                                                                     b.flops_convention),
                           stall_timeout_s=b.timeout_s)
        try:
            result = self.backend.run(plan, run_dir)
        except KeyboardInterrupt:
            self._record_interrupted(trial, run_dir)
            raise
        except Exception as e:  # a failed trial is data: record it, keep the study going
            return RunMetrics("failed", f"backend {self.backend.name} raised {type(e).__name__}: {e}")
        # Metrics come from this trial's own run directory and nowhere else (a reward read from another
        # trial's log stays plausible and silently wrong).
        if not Path(result.log_path).resolve().is_relative_to(run_dir.resolve()):
            return RunMetrics("failed", f"backend {self.backend.name} returned a log outside the run directory: "
                                        f"{result.log_path}")
        if not Path(result.log_path).exists():
            return RunMetrics("failed", f"no log at {result.log_path} (exit code {result.exit_code}, "
                                        f"state {result.scheduler_state})")
        return parse_log(result.log_path, exit_code=result.exit_code, scheduler_state=result.scheduler_state,
                         context=ctx)

    def _record_interrupted(self, trial: TrialConfig, run_dir: Path) -> None:
        if self.store is None:
            return
        number = self.store.next_number()
        self.store.record(TrialRecord(number=number, knobs=trial.varied_values(), status="failed",
                                      reward=self.space.objective.failed_reward, reason=INTERRUPTED,
                                      run_dir=str(run_dir), gpu=trial.system.gpu, num_gpus=trial.num_gpus))
