"""One space over several GPU generations: ``dse run --space FILE --systems h100,b200,gb200``.

Each system gets its own sub-study in ``OUT/<system>/`` (an ordinary output directory: resumable with
``--resume``, readable by ``dse report`` and ``dse leaderboard``); the comparison of their best layouts is
:mod:`dse.compare`.

Decision (node counts): every generation runs on the **same number of GPUs** as the space asks for
(``num_nodes x gpus_per_node`` of the space's own system), so per-GPU throughput, speed-up and GPU-hours
compare like with like, and the global batch splits the same way. A system whose node size does not divide
that GPU count is refused with a one-line error before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dse import constraints
from dse.errors import UserError
from dse.space import Space, load_system
from dse.study import StudyResult, open_store, run_study
from dse.trial import resolve

WARM_START_TOP = 8  # seeds taken from a finished study: its best 8 ok points that are valid here


def parse_systems(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UserError("give one or more system names separated by commas, e.g. h100,b200,gb200", field="--systems")
    if len(set(names)) != len(names):
        raise UserError(f"a system is named twice in {text!r}", field="--systems")
    return names


def space_for(space: Space, system_ref: str) -> Space:
    """``space`` moved onto ``system_ref`` (a name in conf/systems or a path) at the same GPU count."""
    system = load_system(system_ref, file=space.source or None)
    gpus = space.num_nodes * space.system.gpus_per_node
    if gpus % system.gpus_per_node:
        raise UserError(
            f"{gpus} GPUs (the space's {space.num_nodes} nodes of {space.system.gpus_per_node}) do not fill "
            f"whole nodes of {system.name} ({system.gpus_per_node} GPUs per node)",
            field="--systems",
        )
    data = space.model_dump()
    data.update(system=system.model_dump(), num_nodes=gpus // system.gpus_per_node)
    try:
        return Space.model_validate(data)
    except UserError as e:
        raise UserError(f"on system {system.name}: {e}", field="--systems") from None


def run_generations(
    space: Space,
    systems: Sequence[str],
    *,
    out_dir: str | Path,
    resume: bool = False,
    rebuild: bool = False,
    warm_start: str | Path | None = None,
    on_start: Callable[[str, Space], Any] | None = None,
    **kwargs: Any,
) -> list[StudyResult]:
    """Run (or resume) one study of ``space`` per system in ``out_dir/<system>``; kwargs go to run_study.

    Every system is checked before the first study starts, so a bad name costs nothing. ``warm_start``: a
    finished study whose best points (:func:`warm_start_points`) each sub-study runs first. With ``resume``, a
    system whose directory holds no study yet is started fresh (so an interrupted sweep resumes as a whole)."""
    out = Path(out_dir)
    spaces = [(name, space_for(space, name)) for name in systems]
    results = []
    for name, sub in spaces:
        sub_out = out / Path(name).stem
        if on_start:
            on_start(name, sub)
        again = resume and (sub_out / "dse.json").exists()
        seeds = warm_start_points(sub, warm_start) if warm_start is not None else ()
        results.append(run_study(sub, out_dir=sub_out, resume=again, rebuild=rebuild and again, seeds=seeds, **kwargs))
    return results


def warm_start_points(space: Space, study_dir: str | Path, *, top: int = WARM_START_TOP) -> list[dict[str, Any]]:
    """The finished study's best ``top`` ok points that are points of ``space`` and valid on its system.

    A point is taken when every knob ``space`` varies has a value in the old point that ``space`` lists
    (knobs the old study did not vary are not guessed) and no constraint rejects it on ``space``'s system;
    best first (the old study's rewards rank them; they are not shown to the agent as outcomes here: the
    seeds are run again, on this system)."""
    store, _ = open_store(Path(study_dir))
    try:
        # streamed: only the ok trials whose point is one of ``space``'s are kept, as (-reward, number, values)
        ok = [
            (-r.reward, r.number, tuple(r.knobs[k] for k in space.knobs))
            for r in store.iter_records()
            if r.ok and all(k in r.knobs and r.knobs[k] in vals for k, vals in space.knobs.items())
        ]
    finally:
        store.close()
    points: list[dict[str, Any]] = []
    for _, _, values in sorted(ok, key=lambda t: t[:2]):
        if len(points) >= top:
            break
        point = dict(zip(space.knobs, values))
        if point not in points and constraints.check(resolve(space, point)) is None:
            points.append(point)
    return points
