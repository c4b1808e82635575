"""One space over several GPU generations: ``dse run --space FILE --systems h100,b200,gb200``.

Each system gets its own sub-study in ``OUT/<system>/`` (an ordinary output directory: resumable with
``--resume``, readable by ``dse report`` and ``dse leaderboard``); the comparison of their best layouts is
:mod:`dse.results.compare`.

Decision (node counts): every generation runs on the **same number of GPUs** as the space asks for
(``num_nodes x gpus_per_node`` of the space's own system), so per-GPU throughput, speed-up and GPU-hours
compare like with like, and the global batch splits the same way. A system whose node size does not divide
that GPU count is refused with a one-line error before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dse.errors import UserError
from dse.forecast import Screen
from dse.rules import constraints
from dse.rules.counting import Count, count_valid
from dse.rules.space import Space, load_system
from dse.rules.trial import resolve
from dse.study.loop import Request, StudyResult, open_store, run_study

WARM_START_TOP = 8  # seeds taken from a finished study: its best 8 ok points that are valid here


def parse_systems(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UserError("give one or more system names separated by commas, e.g. h100,b200,gb200", param="systems")
    if len(set(names)) != len(names):
        raise UserError(f"a system is named twice in {text!r}", param="systems")
    return names


def space_for(space: Space, system_ref: str) -> Space:
    """``space`` moved onto ``system_ref`` (a name in conf/systems or a path) at the same GPU count."""
    system = load_system(system_ref, file=space.source or None)
    gpus = space.num_nodes * space.system.gpus_per_node
    if gpus % system.gpus_per_node:
        raise UserError(
            f"{gpus} GPUs (the space's {space.num_nodes} nodes of {space.system.gpus_per_node}) do not fill "
            f"whole nodes of {system.name} ({system.gpus_per_node} GPUs per node)",
            param="systems",
        )
    data = space.model_dump()
    data.update(system=system.model_dump(), num_nodes=gpus // system.gpus_per_node)
    try:
        return Space.model_validate(data)
    except UserError as e:
        raise UserError(f"on system {system.name}: {e}", param="systems") from None


def run_generations(
    space: Space,
    systems: Sequence[str],
    *,
    out_dir: str | Path,
    resume: bool = False,
    rebuild: bool = False,
    warm_start: str | Path | None = None,
    on_start: Callable[[str, Space], Any] | None = None,
    on_count: Callable[[str, Count], Any] | None = None,
    **kwargs: Any,
) -> list[StudyResult]:
    """Run (or resume) one study of ``space`` per system in ``out_dir/<system>``; kwargs go to run_study.

    Every system is checked before the first study starts, so a bad name costs nothing: each one's valid points
    are counted (``on_count``: the default layouts differ per GPU, so the same knobs can leave different points
    valid), and a system with none is an error naming the rules and the settings or recipe defaults that removed
    them (:meth:`dse.rules.counting.Count.empty_reason`). ``warm_start``: a
    finished study whose best points (:func:`warm_start_points`) each sub-study runs first. With ``resume``, a
    system whose directory holds no study yet is started fresh (so an interrupted sweep resumes as a whole)."""
    out = Path(out_dir)
    spaces = [(name, space_for(space, name)) for name in systems]
    check_counts(spaces, space.source or None, on_count)
    results = []
    for name, sub in spaces:
        sub_out = out / Path(name).stem
        if on_start:
            on_start(name, sub)
        again = resume and (sub_out / "dse.json").exists()
        seeds = warm_start_points(sub, warm_start) if warm_start is not None else ()
        results.append(
            run_study(sub, Request(out_dir=sub_out, resume=again, rebuild=rebuild and again, seeds=seeds, **kwargs))
        )
    return results


def check_counts(
    spaces: Sequence[tuple[str, Space]], source: str | None, on_count: Callable[[str, Count], Any] | None = None
) -> None:
    """Count each system's valid points (``on_count(name, count)`` for each); refuse, before any study, a system
    whose space has none."""
    counts = [(name, count_valid(sub)) for name, sub in spaces]
    for name, count in counts:
        if on_count:
            on_count(name, count)
    for name, count in counts:
        if count.valid == 0 and count.exact:
            raise UserError(f"on {Path(name).stem}: {count.empty_reason()}", file=source, param="systems")


@dataclass(frozen=True)
class Carried:
    """What ``--warm-start`` took from a finished study into ``space``: ``points`` (best first) and why the others
    stayed behind. ``trials``: the old study's trials; ``not_ok``: they did not run ok (nothing to learn as a
    seed); ``unlisted``: a value ``space`` does not list for a knob it varies (dropped, not mapped to a near
    value: that would be a layout the old study never measured); ``duplicates``: the same point here as a better
    one (the knobs ``space`` does not vary, or settles itself, no longer tell them apart); ``invalid``: a layout a
    constraint rejects on ``space``'s system and scale; ``screened``: one ``space``'s memory screen removes (it
    would not be launched: a reproducer's small layouts often do not fit at full scale); ``beyond``: valid points
    past the best ``top``."""

    points: list[dict[str, Any]]
    trials: int
    not_ok: int
    unlisted: int
    duplicates: int
    invalid: int
    screened: int
    beyond: int

    def line(self, study_dir: str | Path, where: str) -> str:
        """One line: what was carried and why the rest was not (``where``: the target, e.g. "at 8 nodes")."""
        why = [
            f"{n} {label}"
            for n, label in (
                (self.not_ok, "not ok there"),
                (self.unlisted, "with a value not listed here"),
                (self.invalid, f"invalid {where}"),
                (self.screened, f"predicted beyond the GPU's memory {where}"),
                (self.duplicates, "duplicates"),
                (self.beyond, "beyond the best seeds"),
            )
            if n
        ]
        tail = f": {', '.join(why)}" if why else ""
        return f"warm start: carried {len(self.points)} of {self.trials} points from {study_dir}{tail}"


def _target_defaults(space: Space) -> dict[str, Any]:
    """The value each knob ``space`` varies takes when a point leaves it out: the space's settings, else the
    recipe's layout for the system, as :func:`dse.rules.trial.resolve` settles them (a knob an old study did not vary)."""
    base = resolve(space, {}).values
    return {k: base.get(k) for k in space.knobs}


def carry_points(space: Space, study_dir: str | Path, *, top: int = WARM_START_TOP) -> Carried:
    """The finished study's best ``top`` ok points mapped into ``space`` and valid on its system and scale.

    Knobs the old study varied keep their values when ``space`` lists them (else the point is dropped); knobs it
    did not vary take ``space``'s settings or recipe default (:func:`_target_defaults`); the mapped point must
    pass every constraint on ``space``'s system and its memory screen. Best first (the old study's rewards rank them; they are not
    shown to the agent as outcomes: the seeds run again here). The study is read as a stream."""
    defaults = _target_defaults(space)
    store, _ = open_store(Path(study_dir))
    trials = not_ok = unlisted = 0
    ok: list[tuple[float, int, tuple]] = []  # (-reward, number, values): only the mapped ok points are kept
    try:
        for r in store.iter_records():
            trials += 1
            if not r.ok:
                not_ok += 1
                continue
            values = tuple(r.knobs.get(k, defaults[k]) for k in space.knobs)
            if all(v in vals for v, vals in zip(values, space.knobs.values())):
                ok.append((-r.reward, r.number, values))
            else:
                unlisted += 1
    finally:
        store.close()
    points: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    invalid = screened = beyond = 0
    screen = Screen(space)
    for _, _, values in sorted(ok, key=lambda t: t[:2]):
        if values in seen:
            continue
        seen.add(values)
        point = dict(zip(space.knobs, values))
        trial = resolve(space, point)
        if constraints.check(trial) is not None:
            invalid += 1
        elif screen.reason(trial) is not None:
            screened += 1
        elif len(points) >= top:
            beyond += 1
        else:
            points.append(point)
    return Carried(points, trials, not_ok, unlisted, len(ok) - len(seen), invalid, screened, beyond)


def warm_start_points(space: Space, study_dir: str | Path, *, top: int = WARM_START_TOP) -> list[dict[str, Any]]:
    """The points :func:`carry_points` carries from a finished study into ``space``."""
    return carry_points(space, study_dir, top=top).points
