"""Real one-GPU MoE runs of ``recipes.mcore`` (world size 1, EP 1) against the performance model.

    python bench/moe_gpu_runs.py                     # table: measured vs predicted, per run
    python bench/moe_gpu_runs.py --write-tsv LOGDIR  # rebuild bench/data/moe_gpu_runs.tsv from logs
    python bench/moe_gpu_runs.py --predict-plan bench/moe_gpu_plan.tsv ["NVIDIA H100 80GB HBM3"]
                                                     # the model's figures for a plan's runs, before they run

Same columns as ``bench/data/h200_te_runs.tsv`` plus the MoE settings and the GPU, read from the payload's
header lines (``> recipes.mcore: moe experts 16, top-k 2, ...``, ``> recipes.mcore: device ...``; a capacity factor
of 1.0 with padding is the ``moe_token_drop`` column). Logs: tests/fixtures/logs/real_moe/ (made with the plans
bench/moe_gpu_plan*.tsv; ``_h100`` in a name: an H100 machine's run). The prediction
is ``dse.perfmodel.predict`` for the same point on a one-GPU system of the run's GPU, where the model prices
an MoE; otherwise the measured figures alone are printed. Needs no torch.
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
import h200_real_runs as base  # noqa: E402
import h200_te_runs as te  # noqa: E402

TSV = ROOT / "bench" / "data" / "moe_gpu_runs.tsv"
LOGS = ROOT / "tests" / "fixtures" / "logs" / "real_moe"
MOE = (
    "num_experts",
    "moe_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_size",
    "moe_first_dense_layers",
    "ep",
    "etp",
    "moe_dispatcher",
    "moe_grouped_gemm",
    "moe_permute_fusion",
    "moe_token_drop",
    "kv_channels",
    "gpu",
    "host",
    # Megatron-LM's level-1 timers where the run printed them (--timing-log-level 1), ms per step, as step_time_ms
    # (the median over the steps after the warm-up); empty for a run without them
    "fwd_bwd_ms",
    "optimizer_ms",
)
COLUMNS = te.COLUMNS[:-1] + MOE + ("log",)
_MOE = re.compile(
    r"> recipes\.mcore: moe experts (\d+), top-k (\d+), expert ffn (\d+), shared expert ffn (\d+), "
    r"first dense layers (\d+), ep (\d+), etp (\d+), dispatcher (\w+), grouped gemm (\w+), permute fusion (\w+), "
    r".*kv channels (\d+)"
)
_GPU = re.compile(r"> recipes\.mcore: device (.+?)\s*$")
_HOST = re.compile(r"> recipes\.mcore: host (.+?)\s*$")  # logs from before the payload printed it have none
_TIMER = re.compile(r"^\s+(forward-backward|optimizer) \.+: \(([\d.]+), ([\d.]+)\)")
# the capacity in the MoE header (logs from before the payload printed it are dropless)
_CAPACITY = re.compile(r"capacity factor (\S+), padded (\w+),")


def token_drop(line: str, log: Path) -> bool:
    """Whether a MoE header line is dse's ``moe_token_drop`` (a capacity factor of 1.0, every expert padded to it) or
    dropless (no capacity factor); any other capacity is refused, as dse prices no other."""
    m = _CAPACITY.search(line)
    if m is None or (m.group(1) == "None" and m.group(2) == "False"):
        return False
    if m.group(1) == "1.0" and m.group(2) == "True":
        return True
    raise ValueError(
        f"{log}: capacity factor {m.group(1)}, padded {m.group(2)}: dse prices dropless or 1.0 padded only"
    )


def measure(log: Path) -> dict:
    """One TSV row: the TE bench's columns, then the MoE header's settings (a dense run: no experts)."""
    row = te.measure(log)
    row.update(
        num_experts=0,
        moe_topk=0,
        moe_ffn_hidden_size=0,
        moe_shared_expert_size=0,
        moe_first_dense_layers=0,
        ep=1,
        etp=1,
        moe_dispatcher="",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_token_drop=False,
        kv_channels=(row.get("hidden_size") or 0) // max(1, row.get("num_attention_heads") or 1),
        gpu="",
        host="",
    )
    timers: dict[str, list[float]] = {"forward-backward": [], "optimizer": []}
    for line in log.read_text(errors="replace").splitlines():
        if m := _MOE.search(line):
            n, k, f, sh, fd, ep, etp = (int(x) for x in m.groups()[:7])
            row.update(
                num_experts=n,
                moe_topk=k,
                moe_ffn_hidden_size=f,
                moe_shared_expert_size=sh,
                moe_first_dense_layers=fd,
                ep=ep,
                etp=etp,
                moe_dispatcher=m.group(8),
                moe_grouped_gemm=m.group(9) == "True",
                moe_permute_fusion=m.group(10) == "True",
                moe_token_drop=token_drop(line, log),
                kv_channels=int(m.group(11)),
            )
        elif m := _GPU.search(line):
            row["gpu"] = m.group(1)
        elif m := _HOST.search(line):
            row["host"] = m.group(1)
        elif m := _TIMER.search(line):
            timers[m.group(1)].append(float(m.group(3)))  # the max across ranks, as Megatron-LM reports it
    for col, name in (("fwd_bwd_ms", "forward-backward"), ("optimizer_ms", "optimizer")):
        steady = timers[name][base.warmup_steps(len(timers[name])) :]
        row[col] = round(statistics.median(steady), 2) if steady else ""
    return row


def write_tsv(logdir: Path, out: Path = TSV) -> list[dict]:
    rows = [measure(p) for p in sorted(logdir.glob("*.log"))]
    rows = [r for r in rows if r.get("step_time_ms") is not None and r["steps"] > base.warmup_steps(r["steps"])]
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, delimiter="\t", extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


def machine(row: dict) -> str:
    """The machine a run ran on, as far as its log says: the GPU, and the host's CPU where the payload printed it."""
    return f"{row['gpu']}, {row['host']}" if row.get("host") else row["gpu"]


def gpu_key(name: str) -> str:
    """dse's GPU name (a row of dse.facts.hardware) for torch's device name: 'NVIDIA H100 80GB HBM3' -> h100."""
    from dse.facts.hardware import gpu_from_device_name

    key = gpu_from_device_name(name)
    if key is None:
        raise ValueError(f"no GPU of dse.facts.hardware in the device name {name!r}")
    return key


def trial(row: dict):
    """The dse TrialConfig of a row: a one-off recipe with the row's architecture (its experts, top-k, expert FFN,
    head size) on a one-GPU system of the run's GPU, the TE spec's precision and attention, and its MoE knobs."""
    from dataclasses import replace
    from types import MappingProxyType

    from dse.perfmodel.calibrate import arch_from_row, moe_values_from_row
    from dse.rules.space import load_system

    t = te.trial(row)
    arch = arch_from_row(row)
    recipe = replace(t.recipe, name=arch.name, arch=arch)
    values = {**t.values, **moe_values_from_row(row)}
    system = load_system({"gpu": gpu_key(row["gpu"]), "gpus_per_node": 1, "nvlink_domain": 1})
    return replace(t, recipe=recipe, system=system, values=MappingProxyType(values))


def bridge_gib(row: dict) -> float | None:
    """Megatron-Bridge's theoretical memory estimate for a MoE row (model states plus activations, GiB), as
    ``bench/moe_memory.py`` ports it; None for a dense row (that estimator is compared on MoE layouts only)."""
    if int(row["num_experts"]) == 0:
        return None
    import moe_memory

    t = trial(row)
    ref = moe_memory.ref_estimate(moe_memory.ref_config(t), t.num_microbatches)
    return (ref.states_bytes + ref.activation_bytes) / 2**30


def per_expert_ms(rows: list[dict], out: list[dict]) -> list[tuple[str, int, float, float]]:
    """The step time one more expert adds, per MoE layer and micro-batch (ms): the least-squares slope of the step
    time over the number of experts among runs that differ in nothing else (same batch sizes, top-k, dispatcher,
    permutation fusion, sequence, precision, recompute, attention backend, layer spec and grouped-GEMM setting),
    measured and predicted. Returns (group, runs, measured, predicted)."""
    import numpy as np  # a pandas dependency

    keys = (
        "layer_spec",
        "moe_grouped_gemm",
        "mbs",
        "gbs",
        "moe_topk",
        "moe_dispatcher",
        "moe_permute_fusion",
        "moe_token_drop",
        "seq_length",
        "precision",
        "fp8_recipe",
        "recompute",
        "attention_backend",
        "gpu",
        "host",
    )
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for row, fig in zip(rows, out, strict=True):
        if int(row["num_experts"]) and fig["pred_step_time_ms"] is not None:
            groups.setdefault(tuple(str(row[k]) for k in keys), []).append((row, fig))
    result = []
    for key, members in groups.items():
        experts = np.array([float(r["num_experts"]) for r, _ in members])
        if len(set(experts)) < 2:
            continue
        r0 = members[0][0]
        per = (int(r0["gbs"]) // int(r0["mbs"])) * int(r0["num_layers"])  # layer forward-backward passes a step
        meas = np.polyfit(experts, [f["step_time_ms"] for _, f in members], 1)[0] / per
        pred = np.polyfit(experts, [f["pred_step_time_ms"] for _, f in members], 1)[0] / per
        name = " ".join(f"{k}={v}" for k, v in zip(keys, key, strict=True))
        print(
            f"per expert, per MoE layer and micro-batch ({name}; {len(members)} runs, "
            f"{len(set(experts))} expert counts): measured {meas:.3f} ms, model {pred:.3f} ms"
        )
        result.append((name, len(members), float(meas), float(pred)))
    return result


def model_host_ms(row: dict) -> tuple[float, float]:
    """The model's host time of one MoE layer and micro-batch of ``row`` (ms): the forward's and the forward's plus the
    backward's (dse.perfmodel.moe.moe_host_passes_s, under the shipped parameters)."""
    from dse.perfmodel.layout import machine_for
    from dse.perfmodel.model import prepare
    from dse.perfmodel.moe import moe_host_passes_s
    from dse.perfmodel.timing import DEFAULT_PARAMS

    p = prepare(trial(row))
    fwd, bwd = moe_host_passes_s(p.shape, p.layout, machine_for(p.hw, DEFAULT_PARAMS, p.layout))
    return fwd * 1e3, (fwd + bwd) * 1e3


def host_split(rows: list[dict]) -> list[tuple[str, float, float]]:
    """What the host-bound runs say of a MoE layer's host time, per layer spec and machine (16 experts, top-2, the
    all-to-all dispatcher, bf16, sequence 2048, global batch 8; grouped GEMMs as the spec runs them by default: on for
    TE, off for the local spec): the step's least-squares slope over the micro-batches a step runs (micro-batch 1, 2
    and 4) per MoE layer, forward and backward (the per-micro-batch time of a step that waits for its host is the
    host's), and what full recompute adds at micro-batch 2 per layer and micro-batch, one more forward. Returns
    (layer spec, forward + backward ms, forward ms); prints the machine and the backward's ratio to the forward."""
    import numpy as np  # a pandas dependency

    def alike(r: dict, spec: str) -> bool:
        return (
            r["layer_spec"] == spec
            and int(r["num_experts"]) == 16
            and int(r["moe_topk"]) == 2
            and r["moe_dispatcher"] == "alltoall"
            and str(r["moe_permute_fusion"]) == "False"  # a row read back from the TSV holds strings
            and str(r["moe_token_drop"]) == "False"
            and str(r["moe_grouped_gemm"]) == str(spec == "te")
            and r["precision"] == "bf16"
            and int(r["seq_length"]) == 2048
            and int(r["gbs"]) == 8
        )

    out = []
    for spec, where in ((s, m) for s in ("te", "local") for m in sorted({machine(r) for r in rows})):
        runs = [r for r in rows if alike(r, spec) and machine(r) == where]  # one machine's host at a time
        plain = [r for r in runs if r["recompute"] == "none"]
        full = [float(r["step_time_ms"]) for r in runs if r["recompute"] == "full" and int(r["mbs"]) == 2]
        if len({r["mbs"] for r in plain}) < 2 or not full:
            continue
        layers = int(plain[0]["num_layers"])
        slope = np.polyfit([8 // int(r["mbs"]) for r in plain], [float(r["step_time_ms"]) for r in plain], 1)[0]
        both = float(slope) / layers
        base2 = [float(r["step_time_ms"]) for r in plain if int(r["mbs"]) == 2]
        fwd = (sum(full) / len(full) - sum(base2) / len(base2)) / (4 * layers)
        fwd_model, both_model = model_host_ms(next(r for r in plain if int(r["mbs"]) == 2))
        print(
            f"host time of a MoE layer and micro-batch ({spec} spec, {where}, {len(plain)} runs over micro-batch 1-4, "
            f"{len(full)} with full recompute): forward + backward {both:.1f} ms (model {both_model:.1f}), forward "
            f"{fwd:.1f} ms (full recompute's extra; model {fwd_model:.1f}), backward / forward {(both - fwd) / fwd:.1f}"
        )
        out.append((spec, both, fwd))
    return out


def last_steps_ms(log: Path, n: int = 3) -> float:
    """The mean of a run's last ``n`` logged step times (ms): a dropless run's steps still fall after the warm-up
    steps the mean leaves out (new per-expert shapes every step), a token-drop run's do not."""
    times = [
        float(m.group(2)) for line in log.read_text(errors="replace").splitlines() if (m := base._ITER.search(line))
    ]
    return sum(times[-n:]) / len(times[-n:])


def setting_key(row: dict, leave_out: tuple[str, ...] = ()) -> tuple:
    """A run's configuration, its GPU included, less ``leave_out``: every column but what the run measured, its
    name and log, its length (``steps``) and its host's CPU (another machine of the same GPU runs the same point).
    ``model`` is the preset's name, ``_custom`` once an override (a capacity's, an expert count's) is given: the
    shape columns say what it is."""
    outcome = {"name", "log", "steps", "step_time_ms", "tflops_per_gpu", "tokens_per_s_per_gpu", "loss_first"}
    outcome |= {"loss_last", "peak_allocated_gib", "peak_reserved_gib", "model", "fwd_bwd_ms", "optimizer_ms", "host"}
    return tuple(str(row[c]) for c in COLUMNS if c not in outcome and c not in leave_out)


def token_drop_pairs(rows: list[dict], out: list[dict]) -> list[tuple[str, float, float]]:
    """Token drop's speed-up on a real GPU: each token-drop run against its dropless twin (the run that differs in
    nothing else on the same GPU), the dropless step time over the token-drop one, measured (over the measured
    steps, and over the last three) and predicted. Returns (token-drop run, measured ratio, predicted ratio)."""

    def key(r: dict) -> tuple:  # the twin ran on the same machine for as many steps
        return (*setting_key(r, leave_out=("moe_token_drop",)), str(r["host"]), str(r["steps"]))

    twins = {key(r): (r, f) for r, f in zip(rows, out, strict=True) if str(r["moe_token_drop"]) == "False"}
    pairs = []
    for r, f in zip(rows, out, strict=True):
        if str(r["moe_token_drop"]) != "True" or key(r) not in twins or f["pred_step_time_ms"] is None:
            continue
        dr, d = twins[key(r)]
        meas, pred = d["step_time_ms"] / f["step_time_ms"], d["pred_step_time_ms"] / f["pred_step_time_ms"]
        last = last_steps_ms(LOGS / dr["log"]) / last_steps_ms(LOGS / r["log"])
        print(
            f"token drop, {r['name']} against {d['name']} ({r['gpu']}): dropless / token drop step time "
            f"measured {meas:.2f} ({last:.2f} over the last three steps), model {pred:.2f}"
        )
        pairs.append((r["name"], meas, pred))
    return pairs


def repeats(rows: list[dict], out: list[dict]) -> tuple[int, float, float] | None:
    """How well a run predicts another run of the same configuration on the same GPU (:func:`setting_key`: a
    different call, machine or run length): per configuration measured twice or more, its step times' spread; over
    all such runs, the MAPE of predicting each run's step time by the mean of its repeats' (about what a model that
    gives one figure per configuration can reach while the runs differ by that much) beside the model's MAPE on the same
    runs. Returns (runs, repeats' MAPE, model's MAPE), None where no configuration ran twice."""
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for r, f in zip(rows, out, strict=True):
        groups.setdefault(setting_key(r), []).append((r, f))
    oracle, model = [], []
    for runs in groups.values():
        if len(runs) < 2:
            continue
        times = [f["step_time_ms"] for _, f in runs]
        print(
            f"repeats of one configuration ({runs[0][1]['gpu']}): "
            + ", ".join(f"{r['name']} {t:.0f} ms ({r['steps']} steps)" for (r, _), t in zip(runs, times, strict=True))
            + f": spread {100 * (max(times) / min(times) - 1):.0f}%"
        )
        for i, (_, f) in enumerate(runs):
            others = times[:i] + times[i + 1 :]
            oracle.append(abs(sum(others) / len(others) / f["step_time_ms"] - 1))
            if f["pred_step_time_ms"] is not None:
                model.append(abs(f["pred_step_time_ms"] / f["step_time_ms"] - 1))
    if not oracle:
        return None
    o, m = 100 * sum(oracle) / len(oracle), 100 * sum(model) / max(len(model), 1)
    print(
        f"repeats: {len(oracle)} runs of configurations measured 2+ times: their repeats' mean predicts each to "
        f"{o:.1f}% (step time MAPE), the model {m:.1f}% on the same runs"
    )
    return len(oracle), o, m


_ITER_TS = re.compile(r"^\s*\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] iteration\s+(\d+)/")


def gpu_busy(log: Path) -> float | None:
    """The GPU's busy share over a run's iterations 2 to the last (the first carries the warm-up), from the
    ``nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 100`` samples recorded beside
    the run as ``NAME.smi.csv``; None where none were. ``utilization.gpu`` is the share of the sample period in
    which a kernel ran: a step that waits for its host shows a low figure."""
    from datetime import datetime

    smi = log.with_suffix(".smi.csv")
    if not smi.is_file():
        return None
    stamps = [
        datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        for line in log.read_text(errors="replace").splitlines()
        if (m := _ITER_TS.match(line)) and int(m.group(2)) >= 2
    ]
    if len(stamps) < 2:
        return None
    lo, hi = stamps[0], stamps[-1]
    busy = []
    for line in smi.read_text().splitlines()[1:]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[1].endswith("%"):
            continue
        t = datetime.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")
        if lo <= t <= hi:
            busy.append(float(parts[1].rstrip(" %")))
    return sum(busy) / len(busy) / 100.0 if busy else None


def report(rows: list[dict]) -> list[dict]:
    """Print measured vs predicted per run (step time, TFLOP/s, peak memory; for a MoE row also Megatron-Bridge's
    theoretical memory estimate, ``bench/moe_memory.py``); return the printed figures."""
    predict = base._predictor()
    head = (
        f"{'run':26} {'E':>3} {'k':>2} {'gg':>3} {'mbs':>3} {'step ms':>8} {'pred':>7} {'err':>7} | "
        f"{'TF/s':>6} {'tok/s':>7} | {'mem GiB':>7} {'pred':>6} {'err':>7} {'Bridge':>6} {'err':>7}"
    )
    print(head)
    print("-" * len(head))
    out = []
    for row in rows:
        st, tf, mem = float(row["step_time_ms"]), float(row["tflops_per_gpu"]), float(row["peak_allocated_gib"])
        p = predict(trial(row)) if predict else None
        pst = p.step_time_s * 1e3 if p else None
        pmem = p.peak_memory_gib if p else None
        ref = bridge_gib(row) if p else None
        gg = "on" if row["moe_grouped_gemm"] in (True, "True") else "off"
        print(
            f"{row['name']:26} {int(row['num_experts']):3d} {int(row['moe_topk']):2d} {gg:>3} {int(row['mbs']):3d} "
            f"{st:8.1f} {pst or 0:7.1f} {base._err(pst, st):>7} | {tf:6.1f} {float(row['tokens_per_s_per_gpu']):7.0f} | "
            f"{mem:7.2f} {pmem or 0:6.2f} {base._err(pmem, mem):>7} {'-' if ref is None else f'{ref:.2f}':>6} {base._err(ref, mem):>7}"
        )
        out.append(
            {
                "name": row["name"],
                "step_time_ms": st,
                "pred_step_time_ms": pst,
                "tflops_per_gpu": tf,
                "peak_allocated_gib": mem,
                "pred_peak_memory_gib": pmem,
                # the model's peak less its allocator reserve, which the payload's peak allocation leaves out
                "pred_allocated_gib": pmem - p.breakdown["mem.reserve_gib"] if p else None,
                "bridge_memory_gib": ref,
                "gpu": row["gpu"],
                "machine": machine(row),
            }
        )
    gpus = ", ".join(sorted({r["gpu"] for r in rows}))
    if predict is None:
        print(f"{len(rows)} runs on {gpus} (dse.perfmodel.predict not found: measured figures only)")
        return out
    base.print_mape(out, f"1 GPU: {gpus}")
    if len({r["machine"] for r in out}) > 1:  # the machines differ in their hosts as well as their GPUs: each apart
        for m in sorted({r["machine"] for r in out}):
            base.print_mape([r for r in out if r["machine"] == m], f"{m} alone")
    per_expert_ms(rows, out)
    token_drop_pairs(rows, out)
    repeats(rows, out)
    moe = [r for r in out if r["bridge_memory_gib"] is not None]
    if moe:

        def mape(figs: list[dict], key: str) -> float:  # percent, against the measured peak allocation
            return 100 * sum(abs(f[key] / f["peak_allocated_gib"] - 1) for f in figs) / len(figs)

        print(
            f"peak memory of the {len(moe)} MoE runs: dse MAPE {mape(moe, 'pred_peak_memory_gib'):.1f}% "
            f"({mape(moe, 'pred_allocated_gib'):.1f}% less its allocator reserve), Megatron-Bridge's theoretical "
            f"estimate {mape(moe, 'bridge_memory_gib'):.1f}%"
        )
        for spec in sorted({r["layer_spec"] for r in rows}):
            sub = [f for r, f in zip(rows, out, strict=True) if r["layer_spec"] == spec and f["bridge_memory_gib"]]
            if sub:
                near = sum(abs(f["pred_allocated_gib"] / f["bridge_memory_gib"] - 1) <= 0.10 for f in sub)
                print(
                    f"  layer spec {spec} ({len(sub)} runs): dse {mape(sub, 'pred_peak_memory_gib'):.1f}% "
                    f"({mape(sub, 'pred_allocated_gib'):.1f}% less the reserve), Bridge "
                    f"{mape(sub, 'bridge_memory_gib'):.1f}%; dse less the reserve within 10% of Bridge's "
                    f"estimate for {near} of {len(sub)}"
                )
    host_split(rows)
    for row in rows:
        share = gpu_busy(LOGS / row["log"])
        if share is not None:
            print(
                f"GPU busy over {row['name']}'s iterations 2-{row['steps']} (nvidia-smi every 100 ms): {100 * share:.0f}%"
            )
    import pandas as pd  # Spearman's rank correlation (pandas is a dependency; scipy is not)

    df = pd.DataFrame(out)
    print(
        f"Spearman step time {df.step_time_ms.corr(df.pred_step_time_ms, method='spearman'):.2f} · "
        f"peak memory {df.peak_allocated_gib.corr(df.pred_peak_memory_gib, method='spearman'):.2f}"
    )
    return out


def plan_rows(plan: Path, gpu: str) -> list[dict]:
    """One row per run of a plan file (``NAME<TAB>ARGS``), resolved by the payload's own parser and checks for one
    GPU with Transformer Engine: the columns :func:`trial` reads, without measurements."""
    from dse.recipes.mcore.config import check, config_from_argv

    rows = []
    for line in plan.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, args = line.split("\t", 1)
        c = check(config_from_argv(args.split())[0], 1, te_available=True)
        row = {k: str(v) for k, v in c.to_dict().items()}
        row.update(
            name=name,
            cpu_offload_layers=str(c.cpu_offloading_num_layers if c.cpu_offloading else 0),
            fp8_recipe=c.fp8_recipe or "",
            moe_topk=str(c.moe_topk if c.is_moe else 0),
            moe_ffn_hidden_size=str(c.expert_ffn if c.is_moe else 0),
            kv_channels=str(c.head_dim),
            moe_grouped_gemm=str(bool(c.moe_grouped_gemm)),
            moe_token_drop=str(c.moe_capacity_factor == 1.0 and c.moe_pad_to_capacity),
            gpu=gpu,
        )
        rows.append(row)
    return rows


def predict_plan(plan: Path, gpu: str) -> list[dict]:
    """Print the model's step time, TFLOP/s and peak memory for each run of a plan (before it is measured)."""
    from dse.perfmodel import predict

    print(f"{'run':26} {'E':>3} {'k':>2} {'gg':>3} {'mbs':>3} {'step ms':>8} {'TF/s':>6} {'mem GiB':>7} {'Bridge':>6}")
    out = []
    for row in plan_rows(plan, gpu):
        p = predict(trial(row))
        ref = bridge_gib(row)
        gg = "on" if row["moe_grouped_gemm"] == "True" else "off"
        print(
            f"{row['name']:26} {int(row['num_experts']):3d} {int(row['moe_topk']):2d} {gg:>3} {int(row['mbs']):3d} "
            f"{p.step_time_s * 1e3:8.1f} {p.tflops_per_gpu:6.1f} {p.peak_memory_gib:7.2f} "
            f"{'-' if ref is None else f'{ref:.2f}':>6}"
        )
        out.append(
            {
                "name": row["name"],
                "step_time_ms": p.step_time_s * 1e3,
                "peak_memory_gib": p.peak_memory_gib,
                "bridge_memory_gib": ref,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--predict-plan"]:
        if len(argv) not in (2, 3):
            print("usage: python bench/moe_gpu_runs.py --predict-plan PLAN.tsv [GPU NAME]", file=sys.stderr)
            return 2
        predict_plan(Path(argv[1]), argv[2] if len(argv) == 3 else "NVIDIA H200")
        return 0
    return base.run_cli(argv, doc=__doc__, tsv=TSV, write=write_tsv, show=report)


if __name__ == "__main__":
    sys.exit(main())
