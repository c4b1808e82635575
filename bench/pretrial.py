"""What ``dse run`` does with a space before its first trial: how many times a point is resolved, checked against
the validity rules, prepared for the model and predicted, and the wall time to the first launch. Each of these is
a call counted by a profile hook (a second, unprofiled pass gives the wall time). Not run in CI.

    python bench/pretrial.py [--space conf/spaces/llama3_405b_space.toml] [--agent guided] [--until first|end]

``--until end`` counts the whole study (the same counts go on through the trials).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from dse.cli import app
from dse.envs import recipe_env
from dse.perfmodel import model as perfmodel
from dse.rules import constraints
from dse.rules import trial as trial_mod

TARGETS = {
    trial_mod.resolve.__code__: "resolve",
    constraints.check.__code__: "check",
    perfmodel.prepare.__code__: "prepare",
    perfmodel.Prepared.predict.__code__: "predict",
}


class FirstTrial(Exception):
    """Raised at the first launch when counting stops there."""


def _run(space: str, agent: str | None, *, until: str, counts: Counter | None) -> float:
    """One ``dse run`` of ``space`` on the sim backend in a scratch directory: seconds to the first launch (or to the
    end); ``counts`` (when given) gets each target's calls by the hook."""
    real = recipe_env.run_trial
    start = time.perf_counter()
    elapsed: list[float] = []

    def first(*a, **k):
        if not elapsed:
            elapsed.append(time.perf_counter() - start)
            if counts is not None:
                counts.update({f"{k} (before the first trial)": v for k, v in list(counts.items()) if "(" not in k})
            if until == "first":
                raise FirstTrial
        return real(*a, **k)

    def hook(frame, event, arg):
        if event == "call":
            name = TARGETS.get(frame.f_code)
            if name is not None:
                counts[name] += 1  # type: ignore[index]

    recipe_env.run_trial = first  # type: ignore[assignment]
    argv = ["run", "--space", space, "--backend", "sim"] + (["--agent", agent] if agent else [])
    with tempfile.TemporaryDirectory() as tmp:
        if counts is not None:
            sys.setprofile(hook)
        try:
            app(argv + ["--out", str(Path(tmp) / "out")], standalone_mode=False)
        except FirstTrial:
            pass
        finally:
            sys.setprofile(None)
            recipe_env.run_trial = real  # type: ignore[assignment]
    return elapsed[0] if until == "first" else time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="conf/spaces/llama3_405b_space.toml")
    ap.add_argument("--agent", default=None, help="the space's own agent unless given")
    ap.add_argument("--until", choices=("first", "end"), default="first")
    args = ap.parse_args()
    counts: Counter = Counter()
    _run(args.space, args.agent, until=args.until, counts=counts)
    wall = _run(args.space, args.agent, until=args.until, counts=None)
    what = "before the first trial" if args.until == "first" else "the whole study"
    print(f"dse run --space {args.space} --backend sim{' --agent ' + args.agent if args.agent else ''}: {what}")
    for name in ("resolve", "check", "prepare", "predict"):
        print(f"  {name}: {counts[name]:,} calls (measured)")
    if args.until == "end":
        for name in ("resolve", "check", "prepare", "predict"):
            print(f"  {name} before the first trial: {counts[name + ' (before the first trial)']:,} calls (measured)")
    print(f"  wall {wall:.2f} s to {'the first launch' if args.until == 'first' else 'the end'} (measured, unprofiled)")


if __name__ == "__main__":
    main()
