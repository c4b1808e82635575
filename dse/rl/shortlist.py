"""The shortlist encoding of a search: one observation and one action for every space, whatever knobs it varies.

A policy trained on some spaces acts on others (held out: another model, GPU generation or scale) only if what it
sees and what it chooses do not depend on a space's knobs or their number. Here it chooses among ``SLOTS``
candidates, untried valid points: the first ``GREEDY`` by rank (the estimate below, less ``FIT_WEIGHT`` times
minus the log of the point's probability of fitting in memory), the rest by the guided agent's acquisition
(probability of fitting times expected improvement over the best found, with the estimate's uncertainty: the
points a run would teach the most about). The action is a slot, and the mask says which slots hold a point. Each
candidate is described by figures, never by positions of knob values:

* the model's forecast of the point and its estimate (both as log ratios to the model's best forecast over the
  space), the estimate against the best found so far (its expected gain), the forecast's peak memory as a fraction
  of the GPU's and the probability that it fits, how much of the estimate rests on runs (the share of the point's
  knob values already run), the share of those runs that ran out of memory, how many knob values it shares with the
  best point found, the estimate's uncertainty and the acquisition (against the highest of the slots);
* the search as a whole: the best found against the model's best forecast, the runs so far (of the budget, and
  /100), the mean residual of the runs (measured against forecast, the model's overall bias) and the last run's
  status (ok, out of memory, other).

The probability of fitting is soft, not a cut (a point forecast just beyond the GPU's memory is about as likely to
fit as not): the normal probability of the point's forecast headroom less the model's memory error on this search,
one error shared by the search's points, learned from the measured peaks of its runs (and from a run that ran out
of memory where the error so far said it fits), as the guided agent learns its memory border.

The estimate of a point and its uncertainty: its forecast (log), plus the guided agent's residual model (with its
priors) of the ``ok`` runs: a Bayesian linear model of log measured - log forecast over the model's overall bias,
each knob value and each pair of values of two knobs. A point shares its knob values with many others, so a few
runs correct the model's ranking of the whole space, and a run corrects most the points most like it: a first run
below its forecast lowers the points that share its knob values more than the others (a per-knob mean of the
runs' residuals, shrunk to their overall mean, moves every point alike after one run: the model's order stands).
This is how the learned policy (:mod:`dse.rl.policy`, ``encoding = "shortlist"``) sees a search: in training
(:class:`ShortlistEnv`, a view of :class:`dse.rl.searchgame.SearchGame`) and as the ``policy`` agent
(:mod:`dse.agents.policy`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from scipy.special import ndtr

from dse.perfmodel.residual import SIGMA, TAU_BIAS, TAU_KNOB, TAU_PAIR, ResidualModel
from dse.rl.searchgame import SearchGame, action_of

SLOTS = 16  # candidates per proposal
# The estimate's residual model has the guided agent's default priors (dse.perfmodel.residual). The memory
# forecast's error, as a fraction of the GPU's memory: one error shared by the search's points, prior sd MEM_SD (the
# guided agent's prior of a few GiB and a few percent, at a GPU's size), and each point's scatter about it,
# MEM_NOISE (the training spaces' twins: 0.2-0.3% within a twin, the shared error's sd across twins about 1%).
# FIT_WEIGHT: how much a point's rank drops per unit of -log(probability of fitting)
MEM_SD = 0.05
MEM_NOISE = 0.01
FIT_WEIGHT = 0.1
GREEDY = SLOTS // 2  # slots by rank; the rest by acquisition (the untried points not already in a slot)
SCALE = 10.0  # log ratios are observed x10 (a 10% gap is 1.0), clipped to +-CLIP
CLIP = 10.0
GLOBAL = ("best", "runs_budget", "runs", "mean_residual", "last_ok", "last_oom", "last_other")
PER_SLOT = (
    "present",
    "forecast",
    "estimate",
    "gain",
    "memory",
    "fit",
    "support",
    "oom_share",
    "like_best",
    "spread",
    "acquisition",
)
OBS_DIM = len(GLOBAL) + SLOTS * len(PER_SLOT)


def _cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF, element-wise (SciPy's ``ndtr``)."""
    return np.asarray(ndtr(np.asarray(z, dtype=float)))


def utility(reward: float) -> float:
    """A reward as log throughput: log(r) for a rate, -log(-r) for a (negated) step time (as the guided agent)."""
    return math.log(reward) if reward > 0 else -math.log(-reward)


def features() -> list[str]:
    """The names of the observation's entries, in order."""
    return [*GLOBAL, *(f"slot{i}.{f}" for i in range(SLOTS) for f in PER_SLOT)]


class Shortlist:
    """What a search has seen, in the shortlist encoding: ``keys`` (N x knobs) the valid points, ``reward`` their
    forecast reward (signed: higher is better), ``peak`` and ``memory`` their forecast peak and the GPU's memory;
    ``budget`` the launched runs of the search."""

    def __init__(
        self,
        keys: np.ndarray,
        reward: Sequence[float],
        peak: Sequence[float],
        memory: Sequence[float],
        budget: int,
    ):
        self.keys = np.asarray(keys, dtype=np.int64).reshape(len(reward), -1)
        self.base = np.array([utility(r) for r in reward], dtype=float)
        self.ref = float(self.base.max()) if len(self.base) else 0.0
        self.mem = np.clip(np.asarray(peak, dtype=float) / np.maximum(np.asarray(memory, dtype=float), 1e-9), 0, 4)
        self.budget = max(int(budget), 1)
        self.sizes = [int(self.keys[:, j].max()) + 1 if len(self.keys) else 1 for j in range(self.keys.shape[1])]
        self.index = {tuple(int(v) for v in k): i for i, k in enumerate(self.keys)}
        self.tried = np.zeros(len(self.base), dtype=bool)
        self.run_n = [np.zeros(n) for n in self.sizes]  # launched runs with that value
        self.oom_n = [np.zeros(n) for n in self.sizes]
        self.runs = 0
        self.best_u = -math.inf
        self.best: int | None = None
        self.mem_ok: list[tuple[int, float]] = []  # ok runs with a measured peak: (point, measured - forecast)
        self.mem_oom: list[int] = []  # points that ran out of memory
        self.last = "none"
        self.slots = np.full(SLOTS, -1, dtype=np.int64)
        self.residual = ResidualModel(self.keys, TAU_BIAS, TAU_KNOB, TAU_PAIR, SIGMA)
        self.ok_rows: list[int] = []  # ok runs: the point and its residual (log measured - log forecast)
        self.ok_resid: list[float] = []
        self._post: tuple[int, np.ndarray, np.ndarray] | None = None

    @classmethod
    def of_game(cls, game: SearchGame) -> Shortlist:
        """The encoding of ``game``'s space (its valid points and the model's forecasts)."""
        keys = list(game.forecasts)
        f = [game.forecasts[k] for k in keys]
        arr = np.array(keys, dtype=np.int64).reshape(len(keys), len(game.sizes))
        return cls(arr, [x.reward for x in f], [x.peak_memory_gib for x in f], [x.memory_gib for x in f], game.budget)

    def observe(self, i: int, status: str, reward: float | None, peak_fraction: float | None = None) -> None:
        """Point ``i`` ran (``status``; ``reward`` signed, None unless ok; ``peak_fraction``: its measured peak
        memory as a fraction of the GPU's, when known): note its outcome."""
        self.tried[i] = True
        if status == "oom":  # its peak was at least the GPU's memory
            self.mem_oom.append(i)
        elif peak_fraction is not None and math.isfinite(peak_fraction):
            self.mem_ok.append((i, peak_fraction - self.mem[i]))
        self.runs += 1
        k = self.keys[i]
        ok = status == "ok" and reward is not None and reward != 0 and math.isfinite(reward)
        for j, v in enumerate(k):
            self.run_n[j][v] += 1
            if status == "oom":
                self.oom_n[j][v] += 1
        if ok:
            assert reward is not None
            u = utility(reward)
            r = u - self.base[i]
            self.ok_rows.append(i)
            self.ok_resid.append(r)
            if u > self.best_u:
                self.best_u, self.best = u, i
        self.last = "ok" if ok else "oom" if status == "oom" else "other"

    def _posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Every point's estimate (log) and its uncertainty: the forecast plus the guided agent's residual model
        (:class:`dse.perfmodel.residual.ResidualModel`, with the guided agent's default priors) of the ok runs'
        residuals (log measured - log forecast); the uncertainty includes the point's own scatter. Kept until the next
        ok run."""
        if self._post is not None and self._post[0] == len(self.ok_rows):
            return self._post[1], self._post[2]
        mean, sd = self.residual.posterior(self.ok_rows, self.ok_resid)
        self._post = (len(self.ok_rows), self.base + mean, sd)
        return self._post[1], sd

    def estimates(self) -> np.ndarray:
        """Every point's estimate (log): its forecast corrected by the runs (:meth:`_posterior`)."""
        return self._posterior()[0]

    def memory_error(self) -> tuple[float, float]:
        """The model's memory error on this search (measured peak - forecast, as a fraction of the GPU's memory):
        its posterior mean and variance, as the guided agent learns its memory border. One error shared by every
        point (a twin's, or a cluster's, memory reserve and fragmentation move the border for all), prior
        N(0, ``MEM_SD``), each ok run's measured peak an observation of it with ``MEM_NOISE`` scatter; a run that
        ran out of memory although the current estimate says it fits, an observation just past the border (one
        forecast beyond the memory that ran out says little: the forecast already said so)."""
        d = [r for _, r in self.mem_ok]
        for _ in range(3):
            prec = 1.0 / MEM_SD**2 + len(d) / MEM_NOISE**2
            mean = sum(d) / MEM_NOISE**2 / prec
            past = [1.0 - self.mem[i] for i in self.mem_oom if self.mem[i] + mean < 1.0]
            if len(d) == len(self.mem_ok) + len(past):
                break
            d = [r for _, r in self.mem_ok] + past
        return mean, 1.0 / prec

    def fit(self) -> np.ndarray:
        """Per point: the probability that it fits in the GPU's memory: the normal probability of its forecast
        headroom less the model's memory error (:meth:`memory_error`; its uncertainty and one point's scatter).
        A soft margin, not a cut: before any run a point forecast just beyond the memory is about as likely to fit
        as not, and ranks by its promise times that."""
        mean, var = self.memory_error()
        return _cdf((1.0 - self.mem - mean) / math.sqrt(var + MEM_NOISE**2))

    def spread(self) -> np.ndarray:
        """Per point: the uncertainty (log) of its estimate (:meth:`_posterior`): the guided agent's prior, narrowed
        by the runs that share the point's knob values and pairs of values."""
        return self._posterior()[1]

    def acquisition(self, est: np.ndarray, sd: np.ndarray, fit: np.ndarray) -> np.ndarray:
        """Per point: its probability of fitting times its expected improvement over the best found (before any ok
        run, over the lowest estimate, so the estimates' order leads): the guided agent's acquisition, on the
        shortlist's estimates."""
        best = self.best_u if self.best is not None else (float(est.min()) if len(est) else 0.0)
        z = (est - best) / sd
        return fit * sd * (z * _cdf(z) + np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi))

    def rank(self, est: np.ndarray, fit: np.ndarray) -> np.ndarray:
        """Per point: what orders the slots: its estimate (log), less ``FIT_WEIGHT`` times minus the log of its
        probability of fitting."""
        return est + FIT_WEIGHT * np.log(np.maximum(fit, 1e-9))

    def order(self, rank: np.ndarray, acq: np.ndarray) -> np.ndarray:
        """The points of the slots: the ``GREEDY`` untried points of the highest rank, then the untried points of
        the highest acquisition among the others (ties: the lower index), up to ``SLOTS``."""
        free = np.flatnonzero(~self.tried)
        greedy = free[np.lexsort((free, -rank[free]))][:GREEDY]
        rest = np.setdiff1d(free, greedy)
        explore = rest[np.lexsort((rest, -acq[rest]))][: SLOTS - len(greedy)]
        return np.concatenate([greedy, explore]).astype(np.int64)

    def observation(self) -> np.ndarray:
        """The observation (:func:`features` names its entries); fills :attr:`slots` (point per slot, -1: empty):
        the untried points by :meth:`order`."""
        est, sd, fit = self.estimates(), self.spread(), self.fit()
        acq = self.acquisition(est, sd, fit)
        order = self.order(self.rank(est, fit), acq)
        self.slots[:] = -1
        self.slots[: len(order)] = order
        best_u = self.best_u if self.best is not None else self.ref - 0.5
        mean = sum(self.ok_resid) / len(self.ok_resid) if self.ok_resid else 0.0
        head = [
            SCALE * (best_u - self.ref),
            self.runs / self.budget,
            min(self.runs / 100.0, 1.0),
            SCALE * mean,
            float(self.last == "ok"),
            float(self.last == "oom"),
            float(self.last == "other"),
        ]
        rows = np.zeros((SLOTS, len(PER_SLOT)))
        if len(order):
            k = self.keys[order]
            nk = max(self.keys.shape[1], 1)
            support = sum(self.run_n[j][k[:, j]] > 0 for j in range(self.keys.shape[1])) / nk
            ooms = sum(self.oom_n[j][k[:, j]] for j in range(self.keys.shape[1]))
            runs = sum(self.run_n[j][k[:, j]] for j in range(self.keys.shape[1]))
            like = (k == self.keys[self.best]).mean(axis=1) if self.best is not None else np.zeros(len(order))
            rows[: len(order)] = np.stack(
                [
                    np.ones(len(order)),
                    SCALE * (self.base[order] - self.ref),
                    SCALE * (est[order] - self.ref),
                    SCALE * (est[order] - best_u),
                    self.mem[order],
                    fit[order],
                    support,
                    ooms / np.maximum(runs, 1),
                    like,
                    SCALE * sd[order],
                    acq[order] / top if (top := float(acq[order].max())) > 0 else np.zeros(len(order)),
                ],
                axis=1,
            )
        obs = np.concatenate([np.array(head), rows.ravel()])
        return np.clip(obs, -CLIP, CLIP).astype(np.float32)

    def mask(self) -> np.ndarray:
        """One bool per slot: True where it holds a point (after :meth:`observation`)."""
        return self.slots >= 0

    def point(self, slot: int) -> int:
        """The point (row of :attr:`keys`) in ``slot``; a ValueError for an empty slot."""
        i = int(self.slots[slot]) if 0 <= slot < SLOTS else -1
        if i < 0:
            raise ValueError(f"slot {slot} holds no candidate; the mask says which do")
        return i


def observation_space() -> spaces.Box:
    return spaces.Box(low=-CLIP, high=CLIP, shape=(OBS_DIM,), dtype=np.float32)


class ShortlistEnv(gym.Env):
    """:class:`SearchGame` seen through the shortlist encoding: the action a slot (``Discrete(SLOTS)``, masked by
    :meth:`action_masks`), the observation :meth:`Shortlist.observation`. Its reward for training is -1 per
    launched run, and an episode ends when the best found reaches the game's target of the twin's true best
    (``info["solved"]``: an oracle of simulation, which trains the policy and never enters what it observes), or
    when the game ends. ``twins``: the twin seeds a reset draws from (uniformly, by the reset's seed)."""

    metadata = {"render_modes": []}

    def __init__(self, game: SearchGame, twins: Sequence[int]):
        self.game, self.twins = game, list(twins)
        self.action_space = spaces.Discrete(SLOTS)
        self.observation_space = observation_space()
        self.cand = Shortlist.of_game(game)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        twin = self.twins[int(self.np_random.integers(len(self.twins)))]
        self.game.reset(options={"twin_seed": twin})
        self.cand = Shortlist.of_game(self.game)
        return self.cand.observation(), {"twin_seed": twin}

    def action_masks(self) -> np.ndarray:
        return self.cand.mask()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        i = self.cand.point(int(action))
        key = tuple(int(v) for v in self.cand.keys[i])
        _, _, terminated, truncated, info = self.game.step(action_of(key))
        metrics = info.get("metrics") or {}
        peak, cap = metrics.get("peak_memory_gib"), self.game.forecasts[key].memory_gib
        self.cand.observe(i, info["status"], info.get("reward"), peak / cap if peak is not None and cap else None)
        done = bool(info["solved"]) or terminated
        return self.cand.observation(), -1.0, done, truncated and not done, info
