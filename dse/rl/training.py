"""``dse train-policy SPACE``: a learned search policy (:mod:`dse.rl.policy`) trained on twins of the space.

Each of ``twins`` sub-environments is ``dse/Recipe-v0`` on the twin of one seed (:func:`dse.envs.search.make_env`,
in memory), from ``first_twin`` on: by default seeds 1000 and up, so that the twins a search is judged on
(``bench/search_efficiency.py`` uses seeds 0..N-1) are never the ones the policy was trained on.

The output is checked before any training (a minute to hours): a path that exists is refused unless ``force`` (and
a directory, or anything not a regular file, always), and the directory must take a new file (one is created there
and removed). The policy is written to a temporary file beside the output and then linked into place, so a reader
never sees half a policy and, without ``force``, a file that appeared meanwhile is not replaced either.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dse.envs.search import as_space, make_env, table
from dse.errors import UserError
from dse.rl.policy import Policy, available, train
from dse.study.outdir import policy_fingerprint

FIRST_TWIN = 1000  # training twins start here: the benchmark judges searches on seeds 0..N-1
# Bounds of the inputs, so that a typo cannot start a run of days or exhaust memory:
# - twins: each is one environment holding its own outcome of every valid point of the space (up to 100,000) in
#   memory, and PPO collects a rollout from each in turn; 64 is 8 times the default of 8.
# - steps: PPO trains at about 800 environment steps a second on one free core (docs/rl.md), so 10,000,000 steps is
#   about 3.5 hours; the documented policies use 60,000 (the default) to 200,000.
# - budget: launched runs per training episode, at most the points a walkable space has.
# - seed: what NumPy's and torch's seeding accept (an unsigned 32-bit integer).
MAX_TWINS = 64
MIN_STEPS, MAX_STEPS = 64, 10_000_000
MAX_BUDGET = 100_000
MAX_SEED = 2**32 - 1
MAX_SPACES = 32  # spaces a shortlist policy trains on at once: one environment each


@dataclass(frozen=True)
class Trained:
    policy: Policy
    path: Path | None
    twins: list[int]
    steps: int


def check_inputs(*, twins: int, steps: int, budget: int, seed: int, first_twin: int = FIRST_TWIN) -> None:
    """Each input within its bound (see above); a one-line error naming the option otherwise."""
    for name, value, lo, hi in (
        ("twins", twins, 1, MAX_TWINS),
        ("steps", steps, MIN_STEPS, MAX_STEPS),
        ("budget", budget, 1, MAX_BUDGET),
        ("seed", seed, 0, MAX_SEED),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise UserError(f"{value!r} is out of range; give an integer from {lo:,} to {hi:,}", param=name)
    if not 0 <= first_twin <= MAX_SEED - twins + 1:
        raise UserError(f"twin seeds {first_twin}.. are not unsigned 32-bit integers", field="first_twin")


def check_out(out: Path, *, force: bool = False) -> None:
    """``out`` may be written: not there (or ``force`` and a regular file), in a directory that takes a new file.
    A one-line error naming ``out`` otherwise; nothing is left behind."""
    if out.is_dir() or ((out.exists() or out.is_symlink()) and not out.is_file()):
        raise UserError("is not a regular file; give the path of the policy file to write", file=str(out), param="out")
    if (out.exists() or out.is_symlink()) and not force:
        raise UserError(
            "already exists; pass {param:force} to replace it (or another {param:out})", file=str(out), param="out"
        )
    if not out.parent.is_dir():
        raise UserError(f"no such directory: {out.parent}", file=str(out), param="out")
    probe = _temporary(out)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        raise UserError(f"cannot write here: {e.strerror or e}", file=str(out), param="out") from None
    os.unlink(probe)


def _temporary(out: Path) -> Path:
    return out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")


def save(policy: Policy, out: Path, *, force: bool = False) -> Path:
    """Write ``policy`` to ``out``: a temporary file beside it, then linked into place (``force``: renamed over it).
    Without ``force`` an ``out`` that exists by now is refused, never replaced."""
    tmp = _temporary(out)
    data = policy.to_bytes()
    try:
        # permissions as a plain open gives (0666 less the umask), as every file dse writes
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if force:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)  # fails when out exists: the one check that cannot race
            except FileExistsError:
                raise UserError(
                    "appeared while the policy trained; pass --force to replace it (or another --out)",
                    file=str(out),
                    param="out",
                ) from None
            except OSError:  # a file system without hard links: check, then rename
                if out.exists() or out.is_symlink():
                    raise UserError("already exists; pass --force to replace it", file=str(out), param="out") from None
                os.replace(tmp, out)
    except OSError as e:
        raise UserError(f"cannot write: {e.strerror or e}", file=str(out), param="out") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return out


def train_policy(
    space: str | Path,
    out: Path | None,
    *,
    twins: int = 8,
    steps: int = 60_000,
    seed: int = 0,
    budget: int = 50,
    first_twin: int = FIRST_TWIN,
    force: bool = False,
) -> Trained:
    """PPO trained for ``steps`` steps on ``twins`` twins of ``space`` (seeds ``first_twin`` and up), saved to
    ``out`` when given (:mod:`dse.rl.policy`'s file; an existing ``out`` only with ``force``). Inputs and the output
    are checked before training."""
    check_inputs(twins=twins, steps=steps, budget=budget, seed=seed, first_twin=first_twin)
    if out is not None:
        check_out(out, force=force)
    if not available():
        from dse.rl.policy import RL_EXTRA

        raise UserError(RL_EXTRA, field="train-policy")
    s = as_space(space)
    tab = table(s)
    seeds = [first_twin + i for i in range(twins)]

    def env_fn(ts: int):
        return lambda: make_env(s, "sim", twin_seed=ts, budget=budget, table_=tab)

    stamp = policy_fingerprint(s)
    policy = train([env_fn(ts) for ts in seeds], steps, seed=seed, knobs=s.knob_names, space=stamp)
    path = save(policy, out, force=force) if out is not None else None
    return Trained(policy, path, seeds, steps)


def training_twins(twins: int, seed: int) -> list[list[int]]:
    """Per training space of the suite (:func:`dse.envs.suite.benchmarks` of ``train``, in order): ``twins``
    distinct twin seeds of its ``train`` split, drawn at random by ``seed`` (two training seeds, two sets of twins)."""
    from dse.envs import suite

    draw = np.random.default_rng(seed)
    out = []
    for b in suite.benchmarks("train"):
        lo, hi = b.twin_range("train") or (0, 0)
        out.append([lo + int(t) for t in draw.choice(hi - lo + 1, size=twins, replace=False)])
    return out


def train_shortlist(
    spaces: Sequence[str | Path],
    out: Path | None,
    *,
    twins: int = 16,
    steps: int = 60_000,
    seed: int = 0,
    budget: int = 50,
    first_twin: int = FIRST_TWIN,
    force: bool = False,
) -> Trained:
    """A policy of the shortlist encoding (:mod:`dse.rl.shortlist`), MaskablePPO trained for ``steps`` steps over
    ``twins`` twins of each of ``spaces`` (seeds ``first_twin`` and up), or, when ``spaces`` is empty, of each
    training space of the suite (:func:`dse.envs.suite.benchmarks`: ``twins`` twins of its ``train`` split drawn
    at random by ``seed``, so two training seeds train on different twins); each episode on a twin drawn afresh
    from them, each twin built once, one environment per space. Saved to ``out`` when given. It acts on any
    space."""
    check_inputs(twins=twins, steps=steps, budget=budget, seed=seed, first_twin=first_twin)
    if len(spaces) > MAX_SPACES:
        raise UserError(f"{len(spaces)} spaces; give at most {MAX_SPACES}", field="SPACE")
    if out is not None:
        check_out(out, force=force)
    if not available() or importlib.util.find_spec("sb3_contrib") is None:
        from dse.rl.policy import RL_EXTRA

        raise UserError(RL_EXTRA, field="train-policy")
    from dse.rl.policy import train_masked
    from dse.rl.searchgame import CachedDraw
    from dse.rl.shortlist import ShortlistEnv

    games: list[tuple[object, list[int]]] = []
    if spaces:
        seeds = [first_twin + i for i in range(twins)]
        for sp in spaces:
            s = as_space(sp)
            games.append((make_env(s, "sim", twin_seed=seeds[0], budget=budget, table_=table(s)), seeds))
    else:
        from dse.envs import suite

        for b, seeds in zip(suite.benchmarks("train"), training_twins(twins, seed)):
            games.append((suite.make_benchmark(b.id, "train", budget=budget), seeds))
    for game, _ in games:
        game.redraw = CachedDraw(game.redraw)  # type: ignore[attr-defined]

    def env_fn(game, seeds):
        return lambda: ShortlistEnv(game, seeds)

    policy = train_masked([env_fn(g, ts) for g, ts in games], steps, seed=seed)
    path = save(policy, out, force=force) if out is not None else None
    return Trained(policy, path, sorted({t for _, ts in games for t in ts}), steps)
