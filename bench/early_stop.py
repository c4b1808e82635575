"""Steady-state early stop on the recorded real logs: steps each log needed, and the error of the estimate.

For every real log in the repository (dense H200 runs: tests/fixtures/logs/real_h200*, bench/data/h200_local_study;
the one-GPU MoE runs on H200 and H100 machines: tests/fixtures/logs/real_moe), the rule of :mod:`dse.logs.steady`
is replayed step by step on the log's step times; printed per log: the steps logged, the steps the rule needed,
the early estimate and its error against the full-run median (what ``dse parse`` reports for the whole log). Then
a sweep of (min_steps, window, tolerance) with, for each, the share of logs stopped, the mean share of steps run
and the worst error, over the dense logs and over the MoE logs apart (host-bound runs whose steps drift further
after the warm-up), to show why the defaults are what they are.

    python bench/early_stop.py            # the defaults, per log, then the sweep
"""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dse.logs.parse import LogFollower, parse_log  # noqa: E402
from dse.logs.steady import Rule, estimate, steps_needed  # noqa: E402
from dse.rules.space import EarlyStopSettings  # noqa: E402


def real_logs() -> list[Path]:
    """The dense H200 logs the defaults were first chosen on."""
    logs = sorted((ROOT / "tests" / "fixtures" / "logs").glob("real_h200*/*.log"))
    logs += sorted((ROOT / "bench" / "data" / "h200_local_study" / "trials").glob("*/log.txt"))
    return logs


def moe_logs() -> list[Path]:
    """The one-GPU MoE logs (recipes.mcore's small MoE and its dense twin, H200 and H100 machines)."""
    return sorted((ROOT / "tests" / "fixtures" / "logs" / "real_moe").glob("*.log"))


def ok_series(logs: list[Path]) -> list[tuple[Path, list[float | None], float]]:
    """(log, its step times, the full-run median) for each log whose result is ``ok``."""
    data = []
    for log in logs:
        m = parse_log(log)
        if m.status == "ok" and m.step_time_s is not None:
            data.append((log.relative_to(ROOT), series(log), m.step_time_s))
    return data


def series(log: Path) -> list[float | None]:
    f = LogFollower(log)
    f.poll()
    return f.step_times()


def replay(times: list[float | None], full: float, rule: Rule) -> tuple[int | None, float | None]:
    """(steps needed, relative error of the estimate then) for one log."""
    n = steps_needed(times, rule)
    if n is None:
        return None, None
    est = estimate(times[:n])
    return n, abs(est / full - 1.0)


def main() -> None:
    d = EarlyStopSettings()
    rule = Rule(d.min_steps, d.window, d.tolerance)
    sets = {"dense H200": ok_series(real_logs()), "one-GPU MoE": ok_series(moe_logs())}
    print(
        f"defaults: min_steps={rule.min_steps} window={rule.window} tolerance={rule.tolerance:g}; "
        + ", ".join(f"{len(v)} {k} logs" for k, v in sets.items())
        + " with an ok result"
    )
    print(f"{'log':62} {'steps':>5} {'needed':>6} {'full median s':>13} {'error %':>8}")
    for data in sets.values():
        needed_share = []
        for name, times, full in data:
            n, err = replay(times, full, rule)
            needed_share.append((n or len(times)) / len(times))
            print(
                f"{str(name):62} {len(times):5d} {n if n else '-':>6} {full:13.4f} "
                f"{(f'{100 * err:8.2f}' if err is not None else '       -')}"
            )
        print(f"steps run with early stop: {100 * statistics.fmean(needed_share):.0f}% of the logged steps on average")
    print()
    print("sweep: min_steps window tolerance | per set: logs stopped, mean steps run %, worst error %")
    for ms, w, tol in itertools.product((3, 5, 8), (2, 3, 5), (0.005, 0.01, 0.02)):
        r = Rule(ms, w, tol)
        cells = []
        for data in sets.values():
            res = [replay(t, f, r) for _, t, f in data]
            stopped = [x for x in res if x[0] is not None]
            share = statistics.fmean((n or len(t)) / len(t) for (n, _), (_, t, _) in zip(res, data, strict=True))
            worst = max((e for _, e in stopped), default=float("nan"))
            cells.append(f"{len(stopped):2d}/{len(data):2d} {100 * share:4.0f} {100 * worst:6.2f}")
        mark = "  <- defaults" if (ms, w, tol) == (rule.min_steps, rule.window, rule.tolerance) else ""
        print(f"  {ms:9d} {w:6d} {tol:9.3f} | " + " | ".join(cells) + mark)


if __name__ == "__main__":
    main()
