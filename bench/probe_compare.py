"""Probe vs model vs real run: the H100 logs of ``bench/h100_probe_device.sh``.

    python bench/probe_compare.py

Part 1 (bench/data/h100_mcore_grid): the one-GPU grid (llama3_8b_4l, seq 4096), each point's real run (dse's local
backend) beside its world-1 probe (recipes.mcore --fake-process-group) and the model's predicted peak.
Part 2 (bench/data/h100_probes): probes of ranks of 64- and 1,024-GPU layouts beside the model's predicted peak of
the probed rank's stage (dse.probe.model_rank_gib), and each probe's GPU-minutes. Peaks are Megatron's
``max allocated`` (GiB); every figure says whether it is measured or predicted.
"""

from __future__ import annotations

import csv
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dse.probe import ProbeRank, model_rank_gib, model_stage_gib  # noqa: E402
from dse.rules.space import load_space  # noqa: E402
from dse.rules.trial import resolve  # noqa: E402

GRID = ROOT / "bench/data/h100_mcore_grid"
PROBES = ROOT / "bench/data/h100_probes"
# the DeepSeek-V3 slice's probes (bench/h100_probe_plan_dsv3.tsv; gpu.txt there names the card they ran on)
DSV3_PROBES = ROOT / "bench/data/dsv3_probes"
SPACE_GRID = ROOT / "conf/spaces/llama3_8b_4l_h100_local_space.toml"

# The layouts bench/h100_probe_plan.tsv and bench/h100_probe_plan_dsv3.tsv probed, as dse spaces (one point each):
# recipe, nodes of 8 GPUs, settings, the folder of the logs.
LAYOUTS = {
    "l70b_w64_tp8pp8": ("llama3_70b", 8, 'tp = 8\npp = 8\ngbs = 16\nrecompute = "selective"', PROBES),
    "l405b_w1024_tp8pp16": ("llama3_405b", 128, 'tp = 8\npp = 16\ngbs = 128\nrecompute = "full"', PROBES),
    "q30b_w64_pp4ep16": (
        "qwen3_30b_a3b",
        8,
        'tp = 1\npp = 4\nep = 16\netp = 1\ngbs = 64\nrecompute = "selective"\nmoe_grouped_gemm = false',
        PROBES,
    ),
    "dsv3_w128_pp4ep32": (
        "deepseek_v3_8l",
        16,
        'tp = 1\npp = 4\nep = 32\netp = 1\ngbs = 128\nrecompute = "selective"\nmoe_grouped_gemm = false',
        DSV3_PROBES,
    ),
    "dsv3_w64_pp4ep16": (
        "deepseek_v3_8l",
        8,
        'tp = 1\npp = 4\nep = 16\netp = 1\ngbs = 64\nrecompute = "selective"\nmoe_grouped_gemm = false',
        DSV3_PROBES,
    ),
}
SPACE = """name = "{name}"
recipe = "{recipe}"
system = {{ gpu = "h100", gpus_per_node = 8, nvlink_domain = 8 }}
num_nodes = {nodes}
[settings]
{settings}
cp = 1
vp = 1
mbs = 1
seq_length = 4096
attention_backend = "local"
[knobs]
sp = [false]
[backend]
kind = "local"
payload = "mcore"
"""


def max_allocated_gib(log: Path) -> float | None:
    mib = [float(x) for x in re.findall(r"\| max allocated: ([0-9.]+)", log.read_text())]
    return max(mib) / 1024 if mib else None


def step_ms(log: Path) -> float | None:
    ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", log.read_text())]
    return ms[-1] if ms else None


def _pct(a: float | None, b: float | None) -> str:
    return f"{100.0 * (a - b) / b:+.1f}%" if a is not None and b else "-"


def grid_rows() -> list[dict]:
    space = load_space(SPACE_GRID)
    rows = []
    for r in csv.DictReader((GRID / "leaderboard.csv").read_text().splitlines()):
        point = {"mbs": int(r["mbs"]), "recompute": r["recompute"]}
        log = GRID / "probes" / f"grid_probe_{int(r['trial']):05d}.log"
        probe_ok = "memory (MB)" in log.read_text() and "OutOfMemoryError" not in log.read_text()
        rows.append(
            {
                "trial": int(r["trial"]),
                **point,
                "real_status": r["status"],
                "real_peak_gib": float(r["peak_memory_gib"]) if r["peak_memory_gib"] else None,
                "probe_status": "ok" if probe_ok else "oom",
                "probe_peak_gib": max_allocated_gib(log),
                "model_peak_gib": model_stage_gib(resolve(space, point))["first"],
            }
        )
    return sorted(rows, key=lambda x: x["trial"])


def _runs(folder: Path) -> list[dict]:
    return list(csv.DictReader((folder / "runs.tsv").read_text().splitlines(), delimiter="\t"))


def probe_rows() -> list[dict]:
    """Every probed rank that ran to its end, beside the model's figure of its stage; a probe that failed (ran out
    of memory, say, after its first iteration's memory line) is left out here and listed by :func:`probe_failures`."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (recipe, nodes, settings, folder) in LAYOUTS.items():
            path = Path(tmp) / f"{name}.toml"
            path.write_text(SPACE.format(name=name, recipe=recipe, nodes=nodes, settings=settings))
            space = load_space(path)
            trial = resolve(space, {"sp": False})
            stages = model_stage_gib(trial)
            for run in (r for r in _runs(folder) if r["name"].startswith(name + "_r")):
                rank, world = int(run["rank"]), int(run["world"])
                stage = rank // (world // trial.layout.pp)
                why = "first stage" if stage == 0 else "last stage" if stage == trial.layout.pp - 1 else "middle"
                log = folder / f"{run['name']}.log"
                if run["rc"] != "0" or max_allocated_gib(log) is None:
                    continue
                # the model's figure of the probed stage itself (a middle stage's: stageK)
                model = model_rank_gib(stages, ProbeRank(rank, stage, 0, 0, why))
                out.append(
                    {
                        "probe": run["name"],
                        "world": world,
                        "rank": rank,
                        "stage": stage,
                        "probe_peak_gib": max_allocated_gib(log),
                        "model_peak_gib": model,
                        "probe_step_ms": step_ms(log),
                        "gpu_minutes": float(run["wall_s"]) / 60.0,
                    }
                )
    return out


def probe_failures() -> list[dict]:
    """The probes of :data:`LAYOUTS` that failed, with why (out of memory or the last error line)."""
    out = []
    for name, (_recipe, _nodes, _settings, folder) in LAYOUTS.items():
        for run in (r for r in _runs(folder) if r["name"].startswith(name + "_r")):
            log = folder / f"{run['name']}.log"
            if run["rc"] == "0" and max_allocated_gib(log) is not None:
                continue
            errors = [ln for ln in log.read_text().splitlines() if "Error" in ln]
            why = "out of memory" if any("OutOfMemoryError" in e for e in errors) else (errors or ["no output"])[-1]
            out.append({"probe": run["name"], "rank": int(run["rank"]), "world": int(run["world"]), "why": why})
    return out


def main() -> None:
    print("one-GPU grid, llama3_8b_4l seq 4096 on H100 (peak GiB: real and probe measured, model predicted)")
    print(f"{'trial':>5} {'mbs':>3} {'recompute':>9} {'real':>12} {'probe':>12} {'probe-real':>10} {'model':>7}")
    for r in grid_rows():
        real = f"{r['real_peak_gib']:.2f}" if r["real_status"] == "ok" else r["real_status"]
        probe = f"{r['probe_peak_gib']:.2f}" if r["probe_status"] == "ok" else r["probe_status"]
        diff = _pct(r["probe_peak_gib"], r["real_peak_gib"]) if r["real_status"] == r["probe_status"] == "ok" else "-"
        print(
            f"{r['trial']:>5} {r['mbs']:>3} {r['recompute']:>9} {real:>12} {probe:>12} {diff:>10} "
            f"{r['model_peak_gib']:>7.2f}"
        )
    print()
    print("probes of large layouts on one H100 (probe measured, model predicted for the probed rank's stage)")
    print(
        f"{'probe':>26} {'rank':>9} {'stage':>5} {'probe GiB':>9} {'model GiB':>9} {'model-probe':>11} "
        f"{'step ms':>8} {'GPU-min':>7}"
    )
    rows = probe_rows()
    for r in rows:
        model = f"{r['model_peak_gib']:>9.2f}" if r["model_peak_gib"] is not None else f"{'-':>9}"
        print(
            f"{r['probe']:>26} {r['rank']:>4}/{r['world']:<4} {r['stage']:>5} {r['probe_peak_gib']:>9.2f} "
            f"{model} {_pct(r['model_peak_gib'], r['probe_peak_gib']):>11} "
            f"{r['probe_step_ms']:>8.0f} {r['gpu_minutes']:>7.2f}"
        )
    for f in probe_failures():
        print(f"{f['probe']:>26} {f['rank']:>4}/{f['world']:<4} failed: {f['why'][:80]} (measured)")
    l405 = sum(r["gpu_minutes"] for r in rows if r["probe"].startswith("l405b"))
    print(f"probing the 405B point (3 ranks): {l405:.2f} GPU-minutes (measured wall time of the probes)")


if __name__ == "__main__":
    main()
