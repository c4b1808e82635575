"""The walk of a space file through ``dse run``: which of dse's modules its data passes through, in order, and how
often the way climbs back up an import layer. Not run in CI.

    python bench/walk.py [--space conf/spaces/llama3_405b_space.toml] [--until first|end] [--show]

A profile hook follows the space: each dse function the first time it is called with a ``Space`` or a resolved point
(``TrialConfig``) among its arguments (or as the ``space`` of the object it is a method of) is one step of the walk, in its module; the point's own
methods (its derived values) are not. Consecutive
steps in one module are one stay; a module is entered once per stay; a climb back up is a stay in a module of a
higher layer than the stay before it (the rooms of the import contracts in ``pyproject.toml``, each in its own
order, top to bottom; a module named in no layer takes its package's). The goal: at most 20 climbs, no module entered more than 5 times.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

from dse.cli import app
from dse.envs import recipe_env
from dse.rules.space import Space
from dse.rules.trial import TrialConfig

ROOT = Path(__file__).resolve().parents[1]


FOLLOWED = (Space, TrialConfig)  # the space and its points resolved


class FirstTrial(Exception):
    """Raised at the first launch when the walk stops there."""


def _names(layer: str) -> list[str]:
    return [m.strip() for m in layer.replace(":", "|").split("|")]


def layers() -> list[list[str]]:
    """The rooms of pyproject.toml's main layers contract, top to bottom, each room that has its own order (a
    package's contract, or the contract naming exactly a layer's modules) replaced by that order; a room's
    independent siblings join its top layer. Each a list of module names."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    ordered = [c for c in contracts if c["type"] == "layers"]
    main = next(c for c in ordered if "containers" not in c)
    inner = [c for c in ordered if c is not main]
    table: list[list[str]] = []
    for layer in main["layers"]:
        names = _names(layer)
        for c in inner:
            room = c.get("containers", [None])[0]
            sub = [[f"{room}.{m}" if room else m for m in _names(x)] for x in c["layers"]]
            if room in names:
                sub[0] += names  # the room's own module and its independent siblings
                break
            if sorted(sum(sub, [])) == sorted(names):
                break
        else:
            sub = [names]
        table.extend(sub)
    return table


def layer_of(module: str, table: list[list[str]]) -> int:
    """The index of ``module``'s layer (0 the top): the layer naming its longest prefix."""
    best, depth = len(table), -1
    for i, names in enumerate(table):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > depth:
                best, depth = i, len(name)
    return best


def _carries_space(frame) -> bool:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    local = frame.f_locals
    if n and code.co_varnames[0] == "self" and isinstance(local.get("self"), FOLLOWED):
        return False  # a method of the point itself (its derived values) is the data, not a step of its way
    for name in code.co_varnames[:n]:
        v = local.get(name)
        if isinstance(v, FOLLOWED) or (name == "self" and isinstance(getattr(v, "space", None), Space)):
            return True
    return False


def walk(space: str, until: str) -> list[tuple[str, str]]:
    """The walk's steps: (module, function) of each dse function first called with the space."""
    seen: set = set()
    steps: list[tuple[str, str]] = []

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in seen:
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("dse.") or module.startswith("dse.recipes"):
            return
        if _carries_space(frame):
            seen.add(code)
            steps.append((module, code.co_qualname))

    real = recipe_env.run_trial

    def first(*a, **k):
        if until == "first":
            raise FirstTrial
        return real(*a, **k)

    recipe_env.run_trial = first  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        sys.setprofile(hook)
        try:
            app(["run", "--space", space, "--backend", "sim", "--out", str(Path(tmp) / "out")], standalone_mode=False)
        except FirstTrial:
            pass
        finally:
            sys.setprofile(None)
            recipe_env.run_trial = real  # type: ignore[assignment]
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="conf/spaces/llama3_405b_space.toml")
    ap.add_argument("--until", choices=("first", "end"), default="end")
    ap.add_argument("--show", action="store_true", help="print every stay")
    args = ap.parse_args()
    table = layers()
    steps = walk(args.space, args.until)
    stays: list[str] = []
    for module, _ in steps:
        if not stays or stays[-1] != module:
            stays.append(module)
    entered = Counter(stays)
    climbs = sum(layer_of(b, table) < layer_of(a, table) for a, b in zip(stays, stays[1:]))
    if args.show:
        for module in stays:
            print(f"  [{layer_of(module, table):2d}] {module}")
    what = "to the first trial" if args.until == "first" else "through the whole study"
    print(f"the walk of {args.space} through dse run --backend sim, {what} (measured):")
    print(f"  {len(steps)} functions, {len(entered)} modules, {len(stays)} stays, {climbs} climbs back up a layer")
    print("  entered most: " + ", ".join(f"{m} {n}" for m, n in entered.most_common(6)))
    over = [m for m, n in entered.items() if n > 5]
    print(f"  modules entered more than 5 times: {len(over)} (goal 0); climbs: {climbs} (goal <= 20)")


if __name__ == "__main__":
    main()
