"""A learned search policy (experimental): Stable-Baselines3's PPO trained on :class:`dse.rl.searchgame.SearchGame`.

``dse train-policy SPACE`` trains one on twins of the space (:mod:`dse.envs.search`) and saves it; the ``policy``
agent (:mod:`dse.agents.policy`) loads it and asks it, at each proposal, for the probability of each value of each
knob given what the search has seen (the game's observation); it proposes the most probable point not yet tried that
the rules accept. Stable-Baselines3, torch and safetensors come with the ``rl`` extra (``pip install 'dse[rl]'``, a
CPU build of torch first: docs/rl.md); the controller itself never imports torch (SB3 and safetensors do).

A policy file is data, never code: a safetensors file (a JSON header and raw little-endian arrays; nothing in it is
unpickled or imported) holding the weights of one network whose architecture dse defines (:data:`ARCHITECTURE`:
SB3's ``ActorCriticPolicy``, two tanh MLPs), and in its header's metadata one JSON document (:class:`PolicyMeta`):
the architecture's sizes, the observation and action shapes, the knobs and the fingerprint of the space it was
trained on. :func:`load` validates the metadata (strict, bounded), checks every tensor's name, shape and dtype
against what the metadata implies before any network is built, then builds the network itself and loads the weights
into it. SB3's own ``PPO.load`` (which unpickles the zip's ``data`` member) is never called.

Why PPO with its default MLP: it is what SB3 users reach for first on a ``MultiDiscrete`` action, it trains on CPU
in a minute on a small space, and the point here is an honest baseline of a learned policy beside the
model-guided agent, not a tuned RL method.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dse.errors import UserError
from dse.rules.space import MAX_KNOBS, MAX_VALUES_PER_KNOB, WALK_LIMIT

RL_EXTRA = "the learned policy needs the rl extra: pip install 'dse[rl]' (install a CPU torch first: docs/rl.md)"
# PPO's settings for these short episodes (tens of steps): a rollout of 256 steps per environment, small batches
PPO_SETTINGS: dict[str, Any] = {"n_steps": 256, "batch_size": 64, "n_epochs": 5, "gamma": 0.95, "ent_coef": 0.01}
# MaskablePPO's for the shortlist encoding: the reward is -1 a run until the target, so a long horizon
MASKED_SETTINGS: dict[str, Any] = {"n_steps": 256, "batch_size": 64, "n_epochs": 5, "gamma": 0.99, "ent_coef": 0.01}
ARCHITECTURE: Final = (
    "sb3-actor-critic-mlp"  # SB3's ActorCriticPolicy: tanh MLPs for the policy (pi) and the value (vf)
)
NET_ARCH = [64, 64]  # SB3's default for PPO, written out so that the file says it
FORMAT: Final = "dse-policy"
VERSION: Final = 1
META_KEY = "dse_policy"  # the safetensors metadata entry that holds the JSON document
MAX_FILE_BYTES = 64 * 2**20  # a trained policy is tens of KB; this bounds what a hostile file makes dse read
MAX_WIDTH, MAX_DEPTH = 1024, 8  # per hidden layer, hidden layers per MLP
MAX_OBS = 4 * MAX_KNOBS + 64 + WALK_LIMIT  # 2 entries per knob, a score more, and one per knob value (walkable)

_Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Architecture(_Strict):
    """The network dse builds: which one (only :data:`ARCHITECTURE`) and its hidden layers' widths."""

    kind: Literal["sb3-actor-critic-mlp"] = ARCHITECTURE
    activation: Literal["tanh"] = "tanh"
    pi: list[_Width] = Field(default_factory=lambda: list(NET_ARCH), min_length=1, max_length=MAX_DEPTH)
    vf: list[_Width] = Field(default_factory=lambda: list(NET_ARCH), min_length=1, max_length=MAX_DEPTH)


class SpaceStamp(_Strict):
    """The fingerprint of the space a policy was trained on (:func:`dse.study.outdir.policy_fingerprint`): its hash, and
    its fields, so that a mismatch can name what differs."""

    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    fields: dict[str, Any] = Field(max_length=64)


class PolicyMeta(_Strict):
    """The JSON document a policy file carries (validated strictly; nothing in it is code). ``encoding``: "space"
    (the game's own observation and action: one space, its knobs by position) or "shortlist" (the shortlist encoding
    of :mod:`dse.rl.shortlist`: any space; the action one of its slots, ``action_sizes`` = [slots])."""

    format: Literal["dse-policy"] = FORMAT
    version: Literal[1] = VERSION
    encoding: Literal["space", "shortlist"] = "space"
    architecture: Architecture = Field(default_factory=Architecture)
    observation_dim: int = Field(ge=1, le=MAX_OBS)
    # space: one per knob, then the game's stop entry (2); candidates: the slots
    action_sizes: list[Annotated[int, Field(ge=1, le=MAX_VALUES_PER_KNOB)]] = Field(
        min_length=1, max_length=MAX_KNOBS + 1
    )
    knobs: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list, max_length=MAX_KNOBS)
    space: SpaceStamp | None = None
    trained: dict[str, int | list[int]] = Field(default_factory=dict, max_length=16)  # twins, steps, seed: a record

    @model_validator(mode="after")
    def _one_name_per_knob(self) -> PolicyMeta:
        if self.encoding == "space" and len(self.action_sizes) < 2:
            raise ValueError("a policy of one space has an action size per knob, then the stop entry")
        if self.encoding == "shortlist" and len(self.action_sizes) != 1:
            raise ValueError("a policy of the shortlist encoding has one action size: its slots")
        if self.knobs and len(self.knobs) + 1 != len(self.action_sizes):
            raise ValueError(f"{len(self.knobs)} knob names for {len(self.action_sizes)} action sizes (knobs, stop)")
        return self

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the network's state dict and its shape: what a file must hold, exactly."""
        a = self.architecture
        out: dict[str, tuple[int, ...]] = {}
        for name, widths in (("policy_net", a.pi), ("value_net", a.vf)):
            fan_in = self.observation_dim
            for i, w in enumerate(widths):  # Linear, Tanh, Linear, Tanh...: the Linear layers are 0, 2, 4...
                out[f"mlp_extractor.{name}.{2 * i}.weight"] = (w, fan_in)
                out[f"mlp_extractor.{name}.{2 * i}.bias"] = (w,)
                fan_in = w
        out["action_net.weight"] = (sum(self.action_sizes), a.pi[-1])
        out["action_net.bias"] = (sum(self.action_sizes),)
        out["value_net.weight"] = (1, a.vf[-1])
        out["value_net.bias"] = (1,)
        return out


def available() -> bool:
    """Whether Stable-Baselines3 (and so torch) and safetensors are installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("stable_baselines3", "safetensors"))


def _require(field: str = "search.agent") -> None:
    if not available():
        raise UserError(RL_EXTRA, field=field)


def _network(meta: PolicyMeta) -> Any:
    """SB3's ``ActorCriticPolicy`` for ``meta``'s shapes and widths, freshly initialised, in evaluation mode."""
    from gymnasium import spaces
    from stable_baselines3.common.policies import ActorCriticPolicy

    from dse.rl.searchgame import OBS_HIGH

    low = -OBS_HIGH if meta.encoding == "shortlist" else 0.0
    obs = spaces.Box(low=low, high=OBS_HIGH, shape=(meta.observation_dim,), dtype=np.float32)
    arch = meta.architecture
    act = (
        spaces.Discrete(meta.action_sizes[0])
        if meta.encoding == "shortlist"
        else spaces.MultiDiscrete(meta.action_sizes)
    )
    net = ActorCriticPolicy(obs, act, lambda _: 0.0, net_arch={"pi": arch.pi, "vf": arch.vf})
    net.set_training_mode(False)
    return net


class Policy:
    """A trained actor-critic network, asked for the log-probabilities of each knob's values given an observation,
    and the metadata it is saved with."""

    def __init__(self, net: Any, meta: PolicyMeta):
        self.net, self.meta = net, meta

    @property
    def sizes(self) -> list[int]:
        return list(self.meta.action_sizes)

    @property
    def obs_dim(self) -> int:
        return self.meta.observation_dim

    def choose(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The most probable action allowed by ``mask`` (a policy of the shortlist encoding: a slot)."""
        tensor, _ = self.net.obs_to_tensor(np.asarray(obs, dtype=np.float32))
        logits = self.net.get_distribution(tensor).distribution.logits.detach().cpu().numpy()[0]
        return int(np.argmax(np.where(mask, logits, -np.inf)))

    def log_probs(self, obs: np.ndarray) -> list[np.ndarray]:
        """One array per knob: the log-probability of each of its values (SB3's public policy API)."""
        tensor, _ = self.net.obs_to_tensor(np.asarray(obs, dtype=np.float32))
        dist = self.net.get_distribution(tensor)
        return [d.logits.detach().cpu().numpy()[0] for d in dist.distribution]

    def to_bytes(self) -> bytes:
        """The policy file's content: the weights and the metadata as one safetensors file (the caller writes it:
        :func:`dse.rl.training.save`)."""
        from safetensors.torch import save

        state = {k: v.detach().cpu().contiguous() for k, v in self.net.state_dict().items()}
        return save(state, metadata={META_KEY: self.meta.model_dump_json()})


def _learn(algorithm: Any, vec: Any, base: Mapping[str, Any], arch: Architecture, steps: int, seed: int) -> Any:
    """``algorithm`` (SB3's PPO or SB3-contrib's MaskablePPO) with ``arch``'s network, trained on ``vec`` for
    ``steps`` steps: its rollout at most ``base``'s n_steps, shorter for short runs (at least 16 per environment),
    its batch at most one rollout."""
    n_steps = max(16, min(base["n_steps"], steps // max(vec.num_envs, 1)))
    settings = dict(base, n_steps=n_steps, batch_size=min(base["batch_size"], n_steps * vec.num_envs))
    from stable_baselines3.common.logger import Logger

    model = algorithm(
        "MlpPolicy",
        vec,
        seed=seed,
        device="cpu",
        verbose=0,
        policy_kwargs={"net_arch": {"pi": arch.pi, "vf": arch.vf}},
        **settings,
    )
    # a logger with no outputs: left to itself, learn() configures SB3's default one, which makes a directory
    # tempdir/SB3-<date> on every call (stable_baselines3.common.logger.configure) and leaves it behind
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(total_timesteps=steps)
    return model


def train(
    env_fns: Sequence[Callable[[], Any]],
    steps: int,
    *,
    seed: int = 0,
    knobs: Sequence[str] = (),
    space: Mapping[str, Any] | None = None,
) -> Policy:
    """PPO trained for ``steps`` environment steps on the environments ``env_fns`` make (one SB3 ``DummyVecEnv``);
    ``knobs`` and ``space`` (the space's :func:`dse.study.outdir.policy_fingerprint`) go into the policy's metadata."""
    _require()
    import stable_baselines3 as sb3
    from stable_baselines3.common.vec_env import DummyVecEnv

    vec = DummyVecEnv(list(env_fns))
    arch = Architecture()
    model = _learn(sb3.PPO, vec, PPO_SETTINGS, arch, steps, seed)
    from gymnasium import spaces

    obs, act = vec.observation_space, vec.action_space
    if not isinstance(act, spaces.MultiDiscrete) or obs.shape is None or len(obs.shape) != 1:
        raise TypeError(f"a policy learns a MultiDiscrete action from a flat observation; got {act} and {obs}")
    meta = PolicyMeta(
        architecture=arch,
        observation_dim=int(obs.shape[0]),
        action_sizes=[int(n) for n in act.nvec],
        knobs=list(knobs),
        space=SpaceStamp.model_validate(dict(space)) if space is not None else None,
        trained={
            "steps": int(steps),
            "seed": int(seed),
            "environments": len(env_fns),
            "budget": int(vec.get_attr("budget")[0]),
        },
    )
    model.policy.set_training_mode(False)
    return Policy(model.policy, meta)


def train_masked(
    env_fns: Sequence[Callable[[], Any]], steps: int, *, seed: int = 0, spaces_: Sequence[str] = ()
) -> Policy:
    """MaskablePPO (SB3-contrib) trained for ``steps`` steps on the environments ``env_fns`` make: each a
    :class:`dse.rl.shortlist.ShortlistEnv` (the shortlist encoding, its mask from ``action_masks()``); ``spaces_``:
    the names of the spaces trained on (a record in the metadata)."""
    _require()
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from dse.rl.shortlist import OBS_DIM, SLOTS

    vec = DummyVecEnv(list(env_fns))
    arch = Architecture()
    model = _learn(MaskablePPO, vec, MASKED_SETTINGS, arch, steps, seed)
    meta = PolicyMeta(
        encoding="shortlist",
        architecture=arch,
        observation_dim=OBS_DIM,
        action_sizes=[SLOTS],
        trained={
            "steps": int(steps),
            "seed": int(seed),
            "environments": len(env_fns),
            "budget": int(vec.get_attr("game")[0].budget),
        },
    )
    model.policy.set_training_mode(False)
    return Policy(model.policy, meta)


def _read(p: Path, field: str) -> tuple[PolicyMeta, dict[str, Any]]:
    """The metadata and the tensors of the policy file ``p``: its header read and validated, every tensor checked
    against the metadata's shapes before any is read. A one-line error for anything else."""
    from safetensors import safe_open

    def bad(why: str) -> UserError:
        return UserError(f"{p}: not a policy written by dse train-policy ({why})", field=field)

    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            raw = (f.metadata() or {}).get(META_KEY)
            if raw is None:
                raise bad(f"no {META_KEY!r} metadata")
            meta = PolicyMeta.model_validate_json(raw)
            want = meta.shapes()
            got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            if got != want:
                wrong = sorted(set(got) ^ set(want)) or sorted(k for k in want if got[k] != want[k])
                raise bad(f"its tensors do not match its metadata: {', '.join(wrong[:3])}")
            if any(f.get_slice(k).get_dtype() != "F32" for k in want):
                raise bad("its tensors are not float32")
            return meta, {k: f.get_tensor(k) for k in want}
    except UserError:
        raise
    except ValidationError as e:
        err = e.errors()[0]
        raise bad(f"metadata {'.'.join(str(x) for x in err['loc']) or 'document'}: {err['msg']}") from None
    except Exception as e:  # safetensors' own errors (not a safetensors file, a bad header): one line
        raise bad(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def check_path(path: str | Path, *, field: str = "search.options.policy") -> Path:
    """``path`` when it names a regular file of a plausible size that starts as a safetensors file does (an 8-byte
    header length, then ``{``); a one-line error otherwise. Reads those 9 bytes and nothing more (``dse validate``
    checks a policy this far and no further: a zip, a pickle, is refused here without being opened as one)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such policy file (train one with dse train-policy SPACE --out {p})", field=field)
    if not p.is_file():
        raise UserError(f"{p}: not a regular file; a policy is a file written by dse train-policy", field=field)
    try:
        with open(p, "rb") as fh:
            size, head = os.fstat(fh.fileno()).st_size, fh.read(9)
    except OSError as e:
        raise UserError(f"{p}: cannot read: {e.strerror or e}", field=field) from None
    if size > MAX_FILE_BYTES:
        raise UserError(
            f"{p}: {size:,} bytes; a policy written by dse train-policy is at most {MAX_FILE_BYTES:,}", field=field
        )
    if len(head) < 9 or not 2 <= int.from_bytes(head[:8], "little") <= size - 8 or head[8:] != b"{":
        raise UserError(f"{p}: not a policy written by dse train-policy (not a safetensors file)", field=field)
    return p


def load_shortlist(path: str | Path, *, field: str = "search.options.policy") -> Policy:
    """A policy of the shortlist encoding (:mod:`dse.rl.shortlist`) saved at ``path``: it acts on any space; a one-line
    error when the file is not one (a policy of one space, a pickle, anything else)."""
    from dse.rl.shortlist import OBS_DIM, SLOTS

    _require()
    p = check_path(path, field=field)
    meta, tensors = _read(p, field)
    if meta.encoding != "shortlist" or meta.observation_dim != OBS_DIM or meta.action_sizes != [SLOTS]:
        raise UserError(
            f"{p}: not a policy of the shortlist encoding ({OBS_DIM} features, {SLOTS} slots); "
            "train one with dse train-policy --shortlist",
            field=field,
        )
    net = _network(meta)
    net.load_state_dict(tensors, strict=True)
    return Policy(net, meta)


def encoding(path: str | Path, *, field: str = "search.options.policy") -> str:
    """The encoding a policy file says it was trained with ("space" or "shortlist"), its header read and checked."""
    _require()
    return _read(check_path(path, field=field), field)[0].encoding


def load(
    path: str | Path,
    sizes: Sequence[int],
    obs_dim: int,
    *,
    space: Mapping[str, Any] | None = None,
    field: str = "search.options.policy",
) -> Policy:
    """The policy saved at ``path`` (see the module docstring); a one-line error when it is missing, is not a policy
    file, or was trained on another space (``space``: this space's :func:`dse.study.outdir.policy_fingerprint`)."""
    _require()
    p = check_path(path, field=field)
    meta, tensors = _read(p, field)
    if meta.encoding != "space":
        raise UserError(f"{p}: a policy of the shortlist encoding; the policy agent reads it as such", field=field)
    if meta.action_sizes != list(sizes) or meta.observation_dim != obs_dim:
        raise UserError(
            f"{p}: trained on a space of {meta.action_sizes} knob values, this one has {list(sizes)}; "
            "train a policy on this space (dse train-policy)",
            field=field,
        )
    if space is not None and meta.space is not None and meta.space.hash != space["hash"]:
        fields = space.get("fields") or {}
        changed = sorted(k for k in set(fields) | set(meta.space.fields) if fields.get(k) != meta.space.fields.get(k))
        raise UserError(
            f"{p}: trained on another space (differs in {', '.join(changed) or 'its fingerprint'}); "
            "train a policy on this space (dse train-policy)",
            field=field,
        )
    net = _network(meta)
    net.load_state_dict(tensors, strict=True)
    return Policy(net, meta)
