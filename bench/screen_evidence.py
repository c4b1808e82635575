"""Evidence for the memory screen's margin: the model's predicted peak against the GPU's memory on every layout
whose outcome is known, and on the shipped spaces' twins; prints figures, asserts nothing.

Known outcomes: the real H200 runs (bench/data/h200_real_runs.tsv and h200_te_runs.tsv: every one ran), the
real H200 studies under bench/data/ (their leaderboard's ok and oom rows, predicted as ``dse run`` does: with
the space's calibration when it names one), the published rows (calibration and held-out: NVIDIA ran them, so
they fit) and Llama 3.1 405B at tp=pp=cp=1 on 1,024 H100s (1.6 TB of weights alone: OOM). For each margin the
screen removes a point whose predicted peak exceeds (1 + margin) x the GPU's memory: printed are the
false-screen rate (a layout known to fit that the screen would remove) and the caught-OOM rate.

The twins (``dse.perfmodel.twin``: the simulated backend's truth, whose memory reserve differs from the model's)
give a second, larger set: every valid point of a shipped space, its twin's fit against the model's screen.

    python bench/screen_evidence.py [--margins 0 0.05 0.1 ...] [--seeds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import h200_real_runs, h200_te_runs, model_accuracy, model_heldout  # noqa: E402
from dse.forecast import DEFAULT_SCREEN_MARGIN, screened_peak  # noqa: E402
from dse.perfmodel import predict  # noqa: E402
from dse.perfmodel.calibrate import calibrated_params  # noqa: E402
from dse.perfmodel.twin import make_twin, valid_trials  # noqa: E402
from dse.rules.space import load_space  # noqa: E402
from dse.rules.trial import resolve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ("h200_local_study", "h200_te_70b_4l_study", "h200_te_8b_4l_study")
TWIN_SPACES = (
    "conf/spaces/llama3_405b_space.toml",
    "conf/spaces/llama3_70b_space.toml",
    "conf/spaces/llama3_8b_space.toml",
)
MARGINS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)


def study_outcomes(name: str, errors: list | None = None) -> list[tuple[str, str, bool, float]]:
    """The ok and oom rows of a recorded real study: (set, id, truly OOM, predicted peak / GPU memory); the
    model's memory error (predicted / measured peak - 1) of each ok row is appended to ``errors``."""
    d = ROOT / "bench" / "data" / name
    import json

    meta = json.loads((d / "dse.json").read_text())
    space = load_space(ROOT / meta["space"])
    params = calibrated_params(space.backend.calibration)
    out = []
    with open(d / "leaderboard.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["status"] not in ("ok", "oom"):
                continue
            point = {k: type(v[0])(row[k]) if not isinstance(v[0], str) else row[k] for k, v in space.knobs.items()}
            p = predict(resolve(space, point), params=params)
            out.append((f"real H200 study ({name})", f"trial {row['trial']}", row["status"] == "oom", ratio(p)))
            if errors is not None and row["status"] == "ok" and row["peak_memory_gib"]:
                meas = float(row["peak_memory_gib"])
                errors.append(
                    (
                        f"{name} trial {row['trial']}",
                        p.peak_memory_gib / meas - 1,
                        (p.peak_memory_gib - meas) / p.gpu_memory_gib,
                    )
                )
    return out


def ratio(p) -> float:
    return p.peak_memory_gib / p.gpu_memory_gib


def known_outcomes(errors: list) -> list[tuple[str, str, bool, float]]:
    """Every layout whose outcome is known, as (set, id, truly OOM, predicted peak / GPU memory); the model's
    memory error on each run with a measured peak (predicted / measured peak allocated - 1) into ``errors``."""
    known = []
    for path, trial_of, label in (
        (h200_real_runs.TSV, h200_real_runs._trial, "real H200 runs (local spec)"),
        (h200_te_runs.TSV, h200_te_runs.trial, "real H200 runs (TE spec)"),
    ):
        for r in h200_real_runs.read_tsv(path):
            p = predict(trial_of(r))
            known.append((label, r["name"], False, ratio(p)))
            meas = float(r["peak_allocated_gib"])
            errors.append((r["name"], p.peak_memory_gib / meas - 1, (p.peak_memory_gib - meas) / p.gpu_memory_gib))
    for name in STUDIES:
        known.extend(study_outcomes(name, errors))
    for r in model_accuracy.load_rows():
        known.append(("published calibration", r["id"], False, ratio(predict(model_accuracy.row_trial(r)))))
    with contextlib.redirect_stdout(io.StringIO()):  # accuracy() prints its own table
        held = model_heldout.accuracy(model_heldout.load_rows())
    for x in held:
        known.append(("published held-out", x["row"]["id"], False, ratio(x["pred"])))
    row = next(r for r in model_accuracy.load_rows() if r["id"] == "mb2511_h100_405b")
    p = predict(model_accuracy.row_trial(row, tp=1, pp=1, cp=1, vp=1))
    known.append(("known OOM (405B tp=pp=cp=1)", "llama3_405b h100x1024 tp=pp=cp=1", True, ratio(p)))
    return known


def known_table(known, margins) -> None:
    fit = [k for k in known if not k[2]]
    oom = [k for k in known if k[2]]
    print("== known outcomes: predicted peak / GPU memory")
    print(f"  {'set':44s} {'n':>4s} {'OOM':>4s}  min-max")
    for name in dict.fromkeys(k[0] for k in known):
        ks = [k for k in known if k[0] == name]
        fr = [k[3] for k in ks]
        print(f"  {name:44s} {len(ks):4d} {sum(k[2] for k in ks):4d}  {100 * min(fr):5.1f}%-{100 * max(fr):5.1f}%")
    worst = max(fit, key=lambda k: k[3])
    print(f"  highest ratio among layouts that ran: {100 * worst[3]:.1f}% ({worst[1]}, {worst[0]})")
    print(f"\n  {'margin':>7s} {'false screens':>16s} {'caught OOM':>12s}")
    for m in margins:
        fs = [k for k in fit if screened_peak(k[3], 1.0, m)]
        caught = sum(screened_peak(k[3], 1.0, m) for k in oom)
        mark = "  <- default" if m == DEFAULT_SCREEN_MARGIN else ""
        names = f" ({', '.join(k[1] for k in fs[:3])})" if fs else ""
        print(
            f"  {100 * m:6.0f}% {len(fs):5d}/{len(fit):<4d} {100 * len(fs) / len(fit):4.1f}% {caught:5d}/{len(oom)}{mark}{names}"
        )


def twin_table(paths, seeds: int, margins) -> None:
    print(f"\n== twins ({seeds} seeds per space): every valid point, the twin's fit against the model's screen")
    print(
        f"  {'space':24s} {'margin':>7s} {'fit on twin':>11s} {'false screens':>14s} {'OOM on twin':>11s} {'caught':>8s}"
    )
    for path in paths:
        space = load_space(ROOT / path)
        trials = valid_trials(space)
        preds = [predict(t, params=calibrated_params(space.backend.calibration)) for t in trials]
        truth = []  # (twin fits, model's ratio)
        for seed in range(seeds):
            twin = make_twin(space, seed, trials=trials)
            truth.extend((twin.predict(t).fits, ratio(p)) for t, p in zip(trials, preds))
        fits = [r for f, r in truth if f]
        ooms = [r for f, r in truth if not f]
        for m in margins:
            fs = sum(screened_peak(r, 1.0, m) for r in fits)
            caught = sum(screened_peak(r, 1.0, m) for r in ooms)
            print(
                f"  {space.name:24s} {100 * m:6.0f}% {len(fits):11d} {fs:6d} ({100 * fs / max(len(fits), 1):4.1f}%)"
                f" {len(ooms):11d} {100 * caught / max(len(ooms), 1):7.1f}%"
            )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--margins", nargs="+", type=float, default=list(MARGINS))
    ap.add_argument("--seeds", type=int, default=10, help="twin seeds per shipped space")
    ap.add_argument("--spaces", nargs="+", default=list(TWIN_SPACES))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    errors: list = []
    known = known_outcomes(errors)
    errs = sorted(e[1] for e in errors)
    of_gpu = sorted(e[2] for e in errors)
    worst = max(errors, key=lambda x: x[2])
    print(
        f"== the model's peak-memory error on {len(errs)} real H200 runs with a measured peak: predicted / measured"
        f" - 1: median {100 * errs[len(errs) // 2]:+.1f}%, range {100 * errs[0]:+.1f}% to {100 * errs[-1]:+.1f}%;"
        f" as a share of the GPU's memory (what the margin is in): range {100 * of_gpu[0]:+.1f}% to"
        f" {100 * of_gpu[-1]:+.1f}% (largest over-prediction: {worst[0]})\n"
    )
    known_table(known, args.margins)
    if args.seeds:
        twin_table(args.spaces, args.seeds, args.margins)
    print(f"\ndefault margin {100 * DEFAULT_SCREEN_MARGIN:.0f}%; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
