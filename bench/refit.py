"""How a study learns, measured on replayed real runs: the guided agent through ``dse run``'s own loop on a replay
space (the model refit after each run, dse.perfmodel.refit), and what the refit model predicts for the runs it has not yet
launched.

Prints, per replay space: the runs the guided agent launched in order (status), whether it found the measured best
and after how many runs, the OOM runs it launched, the refit's step-time error (MAPE) on the recorded ok runs not
yet launched after each run, what the last refit predicts for the recorded out-of-memory points the agent did not
launch, and the time one refit takes (median and max over the study's refits).

    python bench/refit.py [SPACE ...]   (default: every bench/data/*/replay_space.toml)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dse.backends.replay import read_table  # noqa: E402
from dse.perfmodel import DEFAULT_PARAMS  # noqa: E402
from dse.perfmodel.refit import StudyModel  # noqa: E402
from dse.rules.space import load_space  # noqa: E402
from dse.rules.trial import resolve  # noqa: E402
from dse.study.loop import Request, run_study  # noqa: E402

REPLAYS = sorted(str(p) for p in (Path(__file__).parent / "data").glob("*/replay_space.toml"))


def _recorded_ok(space) -> dict[tuple, float]:
    """Every point of ``space`` the replay table holds an ok run of: its measured step time."""
    table = read_table(space.backend.replay, varied=space.knob_names, gpu=space.system.gpu)
    out = {}
    for p in space.points():
        o = table.outcome(resolve(space, p))
        if o is not None and o.status == "ok" and o.step_time_s:
            out[tuple(str(v) for v in p.values())] = o.step_time_s
    return out


def bench(path: str) -> None:
    space = load_space(path)
    with tempfile.TemporaryDirectory(prefix="dse-refit-") as tmp:
        res = run_study(space, Request(out_dir=Path(tmp) / "s", agent="guided", trials=30))
        records = sorted(res.records, key=lambda r: r.number)
    launched = [r for r in records if r.status in ("ok", "oom")]
    ok = [r for r in records if r.status == "ok" and r.metrics.get(space.objective.metric)]
    best_found = max(r.metrics[space.objective.metric] for r in ok)
    order = [f"{'/'.join(str(r.knobs[n]) for n in space.knob_names)}:{r.status}" for r in launched]
    print(f"{Path(path).parent.name}: guided launched {len(launched)} ({', '.join(order)})")
    print(f"  OOM runs launched: {sum(r.status == 'oom' for r in launched)}; best found {best_found:.1f}")
    # the refit, replayed on the agent's order: its error on the recorded ok runs not yet launched, and its cost
    model = StudyModel(space, DEFAULT_PARAMS, learns=True)
    recorded = _recorded_ok(space)
    times = []
    for i, r in enumerate(launched, 1):
        t0 = time.perf_counter()
        model.observe(r.number, resolve(space, r.knobs), r.status, r.metrics)
        times.append(time.perf_counter() - t0)
        ran = {tuple(str(x.knobs[n]) for n in space.knob_names) for x in launched[:i]}
        later = {k: st for k, st in recorded.items() if k not in ran}
        if later and i <= 5:
            errs = [
                abs(model.predict(resolve(space, dict(zip(space.knob_names, _typed(space, k))))).step_time_s / st - 1)
                for k, st in later.items()
            ]
            print(
                f"  after {i} runs: refit step-time error on the {len(later)} recorded ok runs not yet launched "
                f"{100 * statistics.fmean(errs):.1f}% (measured)"
            )
    ran = {tuple(str(x.knobs[n]) for n in space.knob_names) for x in launched}
    table = read_table(space.backend.replay, varied=space.knob_names, gpu=space.system.gpu)
    for p in space.points():
        trial = resolve(space, p)
        o = table.outcome(trial)
        if o is not None and o.status == "oom" and tuple(str(v) for v in p.values()) not in ran:
            print(
                f"  {'/'.join(str(v) for v in p.values())} ran out of memory in the recorded grid, not launched: "
                f"predicted {model.predict(trial).peak_memory_gib:.1f} GiB by the last refit, "
                f"{model.prepared(trial).peak_memory_gib(DEFAULT_PARAMS):.1f} by the shipped model, "
                f"of {model.prepared(trial).hw.memory_gib:.0f}"
            )
    print(f"  one refit: median {1e3 * statistics.median(times):.0f} ms, max {1e3 * max(times):.0f} ms (measured)")


def _typed(space, key: tuple) -> list:
    return [next(v for v in space.knobs[n] if str(v) == k) for n, k in zip(space.knob_names, key)]


def main() -> None:
    for path in sys.argv[1:] or REPLAYS:
        bench(path)


if __name__ == "__main__":
    main()
