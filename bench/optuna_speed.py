"""What an Optuna study costs the controller in simulation: one ``dse run`` study (the study loop, the simulated
backend, the store, best/) by the optuna agent, timed, with the sampler's asks counted (each TPE ask fits every
trial told so far, so the asks, not the launches, set the cost). Not run in CI.

    python bench/optuna_speed.py [--space conf/spaces/llama3_70b_space.toml] [--trials 100] [--sampler tpe]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dse.rules.space import load_space  # noqa: E402
from dse.study import loop as study  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="conf/spaces/llama3_70b_space.toml")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--sampler", default="tpe")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    space = load_space(Path(args.space))
    asks = 0
    ask = optuna.Study.ask

    def counted(self, *a, **k):  # counts the asks of the agent's own (in-memory) study
        nonlocal asks
        asks += 1
        return ask(self, *a, **k)

    optuna.Study.ask = counted  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = time.perf_counter(), time.process_time()
        result = study.run_study(
            space,
            study.Request(
                out_dir=Path(tmp) / "out", agent="optuna", sampler=args.sampler, trials=args.trials, seed=args.seed
            ),
        )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        statuses = collections.Counter(r.status for r in result.records)
    best = result.summary.best
    print(f"{args.space}, optuna {args.sampler}, --trials {args.trials}, seed {args.seed} (measured):")
    print(f"  wall {wall:.1f} s, CPU {cpu:.1f} s; sampler asks {asks:,}; trials recorded {sum(statuses.values()):,}")
    print("  statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    if best is not None:
        print(
            f"  best {space.objective.metric} (measured on the simulated backend): {best.metrics.get(space.objective.metric)}"
        )


if __name__ == "__main__":
    main()
