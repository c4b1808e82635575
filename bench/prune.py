"""Early stop with and without pruning on the 405B space (simulated backend, ``max_steps = 100``).

For each agent (grid over every valid point; Optuna/TPE with 150 launched runs) and each setting (no early
stop; early stop; early stop + ``prune_margin`` M for each M given), one study of
``conf/spaces/llama3_405b_space.toml`` with ``max_steps = 100``, run through ``dse.study.loop.run_study`` (the
path ``dse run`` takes) in a temporary directory. Printed per study: trials launched, early-stopped and
pruned, GPU-hours spent and saved against the same agent without early stop, GPU-hours of the trials that
ran (``ok`` or ``pruned``: the ones an early stop can shorten; OOMs cost their start-up either way), and the
best layout with its TFLOP/s/GPU (and whether it is the layout found without early stop).

    python bench/prune.py                      # margins 0.05 0.1 0.2, grid and tpe
    python bench/prune.py --margins 0.1 --agents grid
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dse.rules.space import load_space  # noqa: E402
from dse.study.leaderboard import early_stop_savings, gpu_hours  # noqa: E402
from dse.study.loop import Request, run_study  # noqa: E402

SPACE = ROOT / "conf" / "spaces" / "llama3_405b_space.toml"


def space_file(tmp: Path, early: bool, margin: float | None) -> Path:
    text = SPACE.read_text().replace("max_steps = 50", "max_steps = 100")
    assert "max_steps = 100" in text
    if early:
        text += "\n[backend.early_stop]\nenabled = true\n" + (f"prune_margin = {margin}\n" if margin else "")
    name = f"space_{int(early)}_{margin}.toml"
    (tmp / name).write_text(text)
    return tmp / name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--margins", type=float, nargs="*", default=[0.05, 0.1, 0.2])
    ap.add_argument("--agents", nargs="*", default=["grid", "optuna"])
    ap.add_argument("--trials", type=int, default=150, help="launched runs for the optuna agent")
    args = ap.parse_args()
    print(
        f"{'agent':7} {'setting':17} {'launched':>8} {'early':>5} {'pruned':>6} {'GPU-h spent':>11} "
        f"{'saved':>6} {'ran GPU-h':>9} {'best layout (tp pp vp cp mbs recompute precision)':50} {'TFLOP/s':>7} same  s"
    )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for agent in args.agents:
            base_spent, base_best = None, None
            for early, margin in [(False, None), (True, None), *((True, m) for m in args.margins)]:
                space = load_space(space_file(tmp, early, margin))
                t0 = time.monotonic()
                res = run_study(
                    space,
                    Request(
                        out_dir=tmp / f"{agent}_{int(early)}_{margin}",
                        agent=agent,
                        trials=args.trials if agent != "grid" else None,
                    ),
                )
                secs = time.monotonic() - t0
                recs = res.records
                spent, _ = gpu_hours(recs)
                ran = sum(r.gpu_hours or 0.0 for r in recs if r.status in ("ok", "pruned"))
                n_early, n_pruned, _ = early_stop_savings(recs)
                best = max((r for r in recs if r.ok), key=lambda r: (r.reward, -r.number))
                layout = " ".join(str(best.knobs[k]) for k in space.knobs)
                if base_spent is None:
                    base_spent, base_best = spent, best.knobs
                setting = "no early stop" if not early else ("early stop" if margin is None else f"+ prune {margin:g}")
                launched = sum(r.status != "rejected" for r in recs)
                print(
                    f"{agent:7} {setting:17} {launched:8d} {n_early:5d} {n_pruned:6d} {spent:11,.0f} "
                    f"{100 * (1 - spent / base_spent):5.0f}% {ran:9,.0f} {layout:50} {best.metrics['tflops_per_gpu']:7.1f} "
                    f"{'yes' if best.knobs == base_best else 'no ':4} {secs:3.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
