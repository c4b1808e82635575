"""The ``policy`` agent (experimental): a learned search policy (PPO, Stable-Baselines3) proposes the points.

With ``[search.options] policy = "FILE"`` it uses a policy that ``dse train-policy SPACE`` trained on twins of
the space (a relative path is relative to the space file; the file is data, never code: :mod:`dse.rl.policy`), refused
when it was trained on another space; without one it first trains a policy of ``train_steps`` steps on the space's
model forecast (the model as the truth: cheap, and no better than the model's own order). At each proposal it builds the observation of
:class:`dse.rl.searchgame.SearchGame` from what it has seen (the last point, its outcome, the best so far, the model's
forecast of the last point) and draws a point from the policy, as the policy acted while it trained; it draws again
while the point is one already tried or one the rules reject (the model's forecast says which, or the action mask
where there is no model), and after 256 draws takes the most probable untried point. It stops when none is left.

The policy is read (or trained) in :meth:`PolicyAgent.prepare`, not in the constructor: ``dse validate`` builds the
agent without preparing it, so it checks only that the file is there.

Needs the ``rl`` extra (Stable-Baselines3, torch, safetensors); without it, choosing this agent is a one-line error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from dse.agents.base import Action, Agent, Forecaster, NoOptions
from dse.errors import UserError
from dse.logs.parse import UNLAUNCHED_STATUSES
from dse.rl.policy import Policy, check_path, encoding, load, load_shortlist, train
from dse.rl.searchgame import (
    DEFAULT_BUDGET,
    Forecast,
    History,
    Key,
    Outcome,
    SearchGame,
    fraction,
    observation_space,
    reference,
    value_counts,
)
from dse.rl.shortlist import Shortlist

MAX_POINTS = 200_000  # every point is kept as a candidate row (as the guided agent's)
DRAWS = 256  # draws from the policy per proposal before the most probable untried point is taken
# Policies trained on a model's forecast in this process, by (knobs, sizes, forecasts, seed, steps): training is
# seconds of PPO, and a study, a resume or the contract suite builds the same agent more than once.
_TRAINED: dict[tuple, Policy] = {}


class PolicyOptions(NoOptions):
    """``[search.options]`` of the policy agent."""

    policy: str | None = Field(None, min_length=1, max_length=4096)  # a policy saved by dse train-policy
    train_steps: int = Field(1024, ge=64, le=10_000_000)  # without a policy: PPO steps on the model's forecast
    # derived by the study from the space (dse.study.outdir.policy_fingerprint), not a setting: a policy trained on
    # another space is refused
    space_fingerprint: dict[str, Any] | None = None


class PolicyAgent(Agent):
    name = "policy"
    Options = PolicyOptions
    uses_mask = True
    uses_model = True
    requires = ("stable_baselines3", "safetensors")  # the rl extra: the contract suite skips the agent without it
    path_options = ("policy",)

    def __init__(
        self,
        action_space,
        *,
        forecast: Forecaster | None = None,
        policy: str | None = None,
        train_steps: int = 1024,
        space_fingerprint: dict[str, Any] | None = None,
        **kw: Any,
    ):
        super().__init__(action_space, **kw)
        if math.prod(self.sizes) > MAX_POINTS:
            raise UserError(
                f"the policy agent ranks every point; this space has {math.prod(self.sizes):,} (at most {MAX_POINTS:,})",
                field="search.agent",
            )
        self.forecasts: dict[Key, Forecast] = {}
        keys: list[Key] = []
        for key in self.all_keys():
            action = self.to_action(key)
            f = forecast(action) if forecast is not None else None
            if f is not None and f.reward and math.isfinite(f.reward):
                self.forecasts[key] = Forecast(f.reward, f.peak_memory_gib, f.memory_gib)
                keys.append(key)
            elif forecast is None and self.valid(action):
                keys.append(key)
        self.keys = np.array(keys, dtype=int).reshape(len(keys), len(self.sizes))
        self.tried = np.zeros(len(keys), dtype=bool)
        self.index = {k: i for i, k in enumerate(keys)}
        self.ref = reference(self.forecasts)
        self.history = History(self.sizes, value_counts(self.keys, self.sizes))
        self._rng = np.random.default_rng(self.seed)
        if policy is not None:
            check_path(policy)  # there, a regular file, a safetensors header: dse validate checks this far
        self.path, self.train_steps, self.space_fingerprint = policy, train_steps, space_fingerprint
        self._policy: Policy | None = None
        self.shortlist: Shortlist | None = None  # the shortlist encoding, when the policy file was trained with it

    def prepare(self) -> None:
        """Read the policy file (:func:`dse.rl.policy.load`: validated, rebuilt, never unpickled), or train a policy on
        the model's forecast when the options name none."""
        self._prepared()

    def _prepared(self) -> Policy:
        if self._policy is None and self.path and encoding(self.path) == "shortlist":
            if not self.forecasts:
                raise UserError(
                    "a policy of the shortlist encoding ranks points by the model's forecast; this space has none",
                    field="search.options.policy",
                )
            self._policy = load_shortlist(self.path)
            fs = [self.forecasts[tuple(int(v) for v in k)] for k in self.keys]
            budget = self._policy.meta.trained.get("budget", DEFAULT_BUDGET)
            self.shortlist = Shortlist(
                self.keys,
                [f.reward for f in fs],
                [f.peak_memory_gib for f in fs],
                [f.memory_gib for f in fs],
                budget if isinstance(budget, int) and budget > 0 else DEFAULT_BUDGET,
            )
        if self._policy is None:
            dim = observation_space(self.sizes).shape[0]
            self._policy = (
                load(self.path, [*self.sizes, 2], dim, space=self.space_fingerprint)
                if self.path
                else self._train_on_model(self.train_steps)
            )
            # the observation's share of the budget spent is as the policy's training episodes counted it
            budget = self._policy.meta.trained.get("budget", DEFAULT_BUDGET)
            self.history.budget = budget if isinstance(budget, int) and budget > 0 else DEFAULT_BUDGET
        return self._policy

    @property
    def policy(self) -> Policy:
        """The policy (read or trained on first use when :meth:`prepare` has not run)."""
        return self._prepared()

    def _train_on_model(self, steps: int) -> Policy:
        """A policy trained on the model's forecast as the truth (no twin at hand): the fallback without a file."""
        forecasts = self.forecasts or {tuple(int(i) for i in k): Forecast(1.0, 0.0, 1.0) for k in self.keys}

        def truth(key: Key) -> Outcome:
            f = forecasts[key]
            return Outcome("ok", f.reward, f.peak_memory_gib) if f.peak_memory_gib <= f.memory_gib else Outcome("oom")

        def make() -> SearchGame:
            return SearchGame(self.names, self.sizes, forecasts, truth, budget=min(DEFAULT_BUDGET, len(forecasts)))

        key = (tuple(self.names), tuple(self.sizes), tuple(sorted(forecasts.items())), self.seed, steps)
        if key not in _TRAINED:
            _TRAINED[key] = train([make], steps, seed=self.seed)
        return _TRAINED[key]

    def propose(self) -> Action | None:
        """A point drawn from the policy (as it acted while it trained), redrawn while the draw is one already
        tried or one the rules reject; after ``DRAWS`` draws, the most probable untried point."""
        untried = ~self.tried
        if not untried.any():
            self.stop_reason = f"stopped: every valid point tried, after {self.history.runs} runs"
            return None
        policy = self.policy
        if self.shortlist is not None:  # the shortlist encoding: the most probable of the candidates
            obs = self.shortlist.observation()
            mask = self.shortlist.mask()
            if not mask.any():
                self.stop_reason = f"stopped: every valid point tried, after {self.history.runs} runs"
                return None
            return self.to_action(self.shortlist.keys[self.shortlist.point(policy.choose(obs, mask))])
        logp = policy.log_probs(self.history.vector())[: len(self.sizes)]  # the knobs' (the agent never stops)
        probs = [np.exp(lp - lp.max()) / np.exp(lp - lp.max()).sum() for lp in logp]
        draws = np.stack([self._rng.choice(len(p), size=DRAWS, p=p) for p in probs], axis=1)
        for row in draws:
            i = self.index.get(tuple(int(v) for v in row))
            if i is not None and untried[i]:
                return self.to_action(self.keys[i])
        score = np.zeros(len(self.keys))
        for j, lp in enumerate(logp):
            score += lp[self.keys[:, j]]
        i = int(np.argmax(np.where(untried, score, -np.inf)))
        return self.to_action(self.keys[i])

    def abandon(self, action: Action) -> None:
        """Not proposed again (the draw would keep finding it), and not recorded in the policy's history."""
        key = self.key(action)
        if key in self.index:
            self.tried[self.index[key]] = True
        if self.shortlist is not None and key in self.shortlist.index:
            self.shortlist.tried[self.shortlist.index[key]] = True

    def observe(
        self,
        action: Action,
        reward: float,
        ok: bool,
        *,
        status: str | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> None:
        super().observe(action, reward, ok, status=status, metrics=metrics)
        key = self.key(action)
        if key in self.index:
            self.tried[self.index[key]] = True
        if self.shortlist is not None and key in self.shortlist.index:
            i = self.shortlist.index[key]
            if status in UNLAUNCHED_STATUSES:  # not run (screened): never a candidate again, no run to learn from
                self.shortlist.tried[i] = True
            elif not self.shortlist.tried[i]:
                f = self.forecasts.get(key)
                peak = (metrics or {}).get("peak_memory_gib")
                frac = peak / f.memory_gib if f is not None and isinstance(peak, int | float) and f.memory_gib else None
                self.shortlist.observe(i, status or ("ok" if ok else "failed"), reward if ok else None, frac)
        value = fraction(reward, self.ref) if ok else 0.0
        self.history.record(key, status or ("ok" if ok else "failed"), value, self.forecasts.get(key), self.ref)
