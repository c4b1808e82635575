"""The best configuration of a study, ready to launch: ``DIR/best/`` with its knobs, metrics and scripts.

``best.json`` holds the winning trial's every resolved knob, its measured (or simulated) metrics and the
trainer command line and environment; ``launch.sbatch`` is the Slurm script for the space's system
(rendered as ``dse dry-run`` renders it, with the payload package staged beside it under ``code/``) and
``launch.sh`` the single-node torchrun script. A study on the simulated payload gets scripts for the NeMo 2
payload: the point of the file is to run the layout for real.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from dse.launch import build_plan
from dse.space import Space
from dse.store import TrialRecord
from dse.trial import resolve

BEST_DIR = "best"


def best_record(records: Sequence[TrialRecord]) -> TrialRecord | None:
    ok = [r for r in records if r.ok]
    return max(ok, key=lambda r: (r.reward, -r.number)) if ok else None


def write_best(space: Space, records: Sequence[TrialRecord], out_dir: Path) -> Path | None:
    """Write ``out_dir/best/`` for the best ``ok`` trial; None when no trial succeeded."""
    from dse.backends import load_backends
    from dse.backends.scripts import stage_code

    rec = best_record(records)
    if rec is None:
        return None
    trial = resolve(space, rec.knobs)
    payload = "nemo2" if space.backend.payload == "sim" else space.backend.payload
    plan = build_plan(trial, payload=payload)
    d = Path(out_dir) / BEST_DIR
    d.mkdir(parents=True, exist_ok=True)
    info = {"trial": rec.number, "reward": rec.reward, "objective": space.objective.metric,
            "run_dir": rec.run_dir, "knobs": trial.as_dict(), "varied": rec.knobs, "metrics": rec.metrics,
            "payload": payload, "argv": list(plan.argv), "env": dict(plan.env)}
    tmp = d / ".best.json.tmp"
    tmp.write_text(json.dumps(info, indent=2, default=str))
    os.replace(tmp, d / "best.json")
    stage_code(d)
    registry = load_backends()
    for name in ("slurm", "local"):  # the launch files a user takes away: both scripts
        registry[name]().write_script(plan, d)
    return d
