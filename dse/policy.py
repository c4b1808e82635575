"""A learned search policy (experimental): Stable-Baselines3's PPO trained on :class:`dse.searchgame.SearchGame`.

``dse train-policy SPACE`` trains one on twins of the space (:mod:`dse.envs.search`) and saves it (SB3's own zip);
the ``policy`` agent (:mod:`dse.agents.policy`) loads it and asks it, at each proposal, for the probability of
each value of each knob given what the search has seen (the game's observation); it proposes the most probable point
not yet tried that the rules accept. Stable-Baselines3 and torch come with the ``rl`` extra (``pip install
'dse[rl]'``, a CPU build of torch first: docs/rl.md); the controller itself never imports torch (SB3 does).

Why PPO with its default MLP: it is what SB3 users reach for first on a ``MultiDiscrete`` action, it trains on CPU
in a minute on a small space, and the point here is an honest baseline of a learned policy beside the
model-guided agent, not a tuned RL method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dse.errors import UserError

RL_EXTRA = "the learned policy needs the rl extra: pip install 'dse[rl]' (install a CPU torch first: docs/rl.md)"
# PPO's settings for these short episodes (tens of steps): a rollout of 256 steps per environment, small batches
PPO_SETTINGS: dict[str, Any] = {"n_steps": 256, "batch_size": 64, "n_epochs": 5, "gamma": 0.95, "ent_coef": 0.01}


def available() -> bool:
    """Whether Stable-Baselines3 (and so torch) is installed."""
    import importlib.util

    return importlib.util.find_spec("stable_baselines3") is not None


def _sb3():
    if not available():
        raise UserError(RL_EXTRA, field="search.agent")
    import stable_baselines3

    return stable_baselines3


class Policy:
    """A trained PPO model, asked for the log-probabilities of each knob's values given an observation."""

    def __init__(self, model: Any):
        self.model = model

    @property
    def sizes(self) -> list[int]:
        return [int(n) for n in self.model.action_space.nvec]

    @property
    def obs_dim(self) -> int:
        return int(self.model.observation_space.shape[0])

    def log_probs(self, obs: np.ndarray) -> list[np.ndarray]:
        """One array per knob: the log-probability of each of its values (SB3's public policy API)."""
        policy = self.model.policy
        tensor, _ = policy.obs_to_tensor(np.asarray(obs, dtype=np.float32))
        dist = policy.get_distribution(tensor)
        return [d.logits.detach().cpu().numpy()[0] for d in dist.distribution]

    def save(self, path: str | Path) -> Path:
        self.model.save(str(path))
        p = Path(path)
        return p if p.suffix == ".zip" else p.with_name(p.name + ".zip")


def train(env_fns: Sequence[Callable[[], Any]], steps: int, *, seed: int = 0) -> Policy:
    """PPO trained for ``steps`` environment steps on the environments ``env_fns`` make (one SB3 ``DummyVecEnv``)."""
    sb3 = _sb3()
    from stable_baselines3.common.vec_env import DummyVecEnv

    vec = DummyVecEnv(list(env_fns))
    settings = dict(PPO_SETTINGS, n_steps=max(16, min(PPO_SETTINGS["n_steps"], steps // max(len(env_fns), 1))))
    settings["batch_size"] = min(settings["batch_size"], settings["n_steps"] * len(env_fns))
    model = sb3.PPO("MlpPolicy", vec, seed=seed, device="cpu", verbose=0, **settings)
    model.learn(total_timesteps=steps)
    return Policy(model)


def load(path: str | Path, sizes: Sequence[int], obs_dim: int, *, field: str = "search.options.policy") -> Policy:
    """The policy saved at ``path``; a one-line error when it is missing or was trained on another space."""
    sb3 = _sb3()
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such policy file (train one with dse train-policy SPACE --out {p})", field=field)
    try:
        policy = Policy(sb3.PPO.load(str(p), device="cpu"))
    except Exception as e:  # a file that is not an SB3 model: one line, not a traceback
        raise UserError(
            f"{p}: not a policy saved by dse train-policy ({str(e).splitlines()[0]})", field=field
        ) from None
    if policy.sizes != list(sizes) or policy.obs_dim != obs_dim:
        raise UserError(
            f"{p}: trained on a space of {policy.sizes} knob values, this one has {list(sizes)}; "
            "train a policy on this space (dse train-policy)",
            field=field,
        )
    return policy
