"""How long ``dse calibrate`` takes on a large study, and its leave-one-out error. Prints figures; asserts nothing.

    python bench/calibrate_speed.py                 # an 86-trial simulated study (twin truth, seed 1), then calibrate
    python bench/calibrate_speed.py --trials 24     # a smaller one
    python bench/calibrate_speed.py --study DIR     # an existing study directory (or a TSV of runs)
    python bench/calibrate_speed.py --scratch       # also leave-one-out refitting each run from scratch (slow)

The study is ``dse run`` on the shipped llama3_8b space (random agent, seed 0) against the simulated backend's
twin truth, so that the model has something to learn; out-of-memory trials count as runs too. ``calibrate`` is
timed end to end (loading the runs, choosing the parameters, the fit, the leave-one-out refits): wall-clock and
CPU seconds, since the wall clock of a shared machine says as much about its load as about dse. ``--scratch`` runs
the leave-one-out as it was before the refits started from the full fit (each a full MAP fit on the other runs),
for its error beside the warm-started one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPACE = "conf/spaces/llama3_8b_space.toml"


def build_study(out: Path, trials: int) -> Path:
    """An ``trials``-trial simulated study of the shipped llama3_8b space in ``out``."""
    cmd = [sys.executable, "-m", "dse", "run", "--space", SPACE, "--trials", str(trials), "--agent", "random"]
    cmd += ["--seed", "0", "--twin-seed", "1", "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return out


def scratch_loo(source: Path) -> tuple[float, float, float | None]:
    """(seconds, step-time MAPE, memory MAPE) of a leave-one-out that refits every left-out run from scratch."""
    from dse.perfmodel.calibrate import choose_params, errors, fit_runs, load_runs

    runs, _ = load_runs([source])
    t_names, m_names = choose_params(runs, None)
    t0 = time.perf_counter()
    st, mem = [], []
    for i, run in enumerate(runs):
        if not run.step_time_s:
            continue
        rest = [r for j, r in enumerate(runs) if j != i]
        n_t = sum(1 for r in rest if r.step_time_s)
        n_m = sum(1 for r in rest if r.peak_memory_gib or r.oom)
        e = errors([run], fit_runs(rest, t_names[:n_t], m_names[:n_m]))
        st.append(e["step_time_mape"])
        if e["memory_mape"] is not None:
            mem.append(e["memory_mape"])
    return time.perf_counter() - t0, statistics.fmean(st), statistics.fmean(mem) if mem else None


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}%"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=86)
    ap.add_argument("--study", type=Path, default=None, help="an existing study directory or TSV instead")
    ap.add_argument("--scratch", action="store_true", help="also the leave-one-out with refits from scratch")
    args = ap.parse_args(argv)
    os.chdir(ROOT)  # the study's dse.json names its space relative to where dse run ran
    sys.path.insert(0, str(ROOT))
    from dse.perfmodel.calibrate import calibrate

    with tempfile.TemporaryDirectory() as tmp:
        source = args.study or build_study(Path(tmp) / "study", args.trials)
        w0, c0 = time.perf_counter(), time.process_time()
        cal, report = calibrate([source])
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        print(f"dse calibrate on {source if args.study else f'a {args.trials}-trial sim study'}: {cal.runs} runs")
        print(f"  {wall:.1f} s wall-clock, {cpu:.1f} s CPU (load average {os.getloadavg()[0]:.1f})")
        moved = ", ".join(f"{r['name']} {r['old']:.4g} -> {r['new']:.4g}" for r in report)
        print(f"  fitted: {moved}")
        b, a, lo = cal.fit["before"], cal.fit["after"], cal.loo or {}
        print(
            f"  step-time MAPE {pct(b['step_time_mape'])} shipped -> {pct(a['step_time_mape'])} fitted, "
            f"{pct(lo.get('step_time_mape'))} leave-one-out; peak memory {pct(b['memory_mape'])} -> "
            f"{pct(a['memory_mape'])}, {pct(lo.get('memory_mape'))} leave-one-out"
        )
        if args.scratch:
            secs, st, mem = scratch_loo(source)
            print(f"  leave-one-out refitting from scratch: {secs:.1f} s, step time {pct(st)}, memory {pct(mem)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
