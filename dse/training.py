"""``dse train-policy SPACE``: a learned search policy (:mod:`dse.policy`) trained on twins of the space.

Each of ``twins`` sub-environments is ``dse/Recipe-v0`` on the twin of one seed (:func:`dse.envs.search.make_env`,
in memory), from ``first_twin`` on: by default seeds 1000 and up, so that the twins a search is judged on
(``bench/search_efficiency.py`` uses seeds 0..N-1) are never the ones the policy was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dse.envs.search import as_space, make_env, table
from dse.errors import UserError
from dse.policy import Policy, train

FIRST_TWIN = 1000  # training twins start here: the benchmark judges searches on seeds 0..N-1


@dataclass(frozen=True)
class Trained:
    policy: Policy
    path: Path | None
    twins: list[int]
    steps: int


def train_policy(
    space: str | Path,
    out: Path | None,
    *,
    twins: int = 8,
    steps: int = 60_000,
    seed: int = 0,
    budget: int = 50,
    first_twin: int = FIRST_TWIN,
) -> Trained:
    """PPO trained for ``steps`` steps on ``twins`` twins of ``space`` (seeds ``first_twin`` and up), saved to
    ``out`` when given (SB3's zip)."""
    if twins < 1 or steps < 64 or budget < 1:
        raise UserError(
            f"need at least 1 twin, 64 steps and a budget of 1 (got {twins}, {steps}, {budget})", field="--steps"
        )
    s = as_space(space)
    tab = table(s)
    seeds = [first_twin + i for i in range(twins)]

    def env_fn(ts: int):
        return lambda: make_env(s, "sim", twin_seed=ts, budget=budget, table_=tab)

    policy = train([env_fn(ts) for ts in seeds], steps, seed=seed)
    path = policy.save(out) if out is not None else None
    return Trained(policy, path, seeds, steps)
