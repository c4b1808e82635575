"""Accuracy of the shipped performance model on published results it was NOT fitted on; prints figures,
asserts nothing.

    PYTHONPATH=. python bench/model_heldout.py            # per-row errors, MAPE by group, within-group Spearman,
                                                          # OOM classification, ranking
    PYTHONPATH=. python bench/model_heldout.py --no-rank  # skip the layout ranking

Data: ``bench/data/published_perf_heldout.tsv`` — NeMo 24.03/24.07/25.02/25.04/25.07 and Megatron-Bridge
25.09/25.11/26.02 performance summaries (rows absent from the calibration table), NeMo's long-sequence
tables (context parallelism up to 1M tokens), Narayanan et al. 2021, Table 1 (GPT 1.7B-1T on A100), and NVIDIA's
DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking v25.03: Llama 3.1 8B / 70B / 405B and Nemotron 4 15B /
340B on H100 in BF16 and delayed-scaling FP8, NeMo 24.09 and 24.12; v24.11.1: the Llama 3.1 tables in NeMo 24.09;
v25.04: the Llama 3.1 tables in NeMo 25.02.01, NeMo 2's performance scripts; each at the smallest and largest
scale of its table).
Architectures outside ``recipes.models`` are ``--model-file`` TOMLs in ``bench/data/heldout_models/``.
Columns beyond the calibration table's: ``recompute``, ``sp``, ``tp_comm_overlap`` (as the source's recipe
ran; NVIDIA's recipes overlap TP communication whenever tp > 1, the 2021 paper predates it),
``fp8_recipe`` (cs = per-tensor current scaling, mx = MXFP8 32x32 blocks, as stated), ``model_file``, and
``bf16_grads`` (1: the row's optimizer reduced gradients in bf16 in bf16 runs too, as the NeMo launcher's
``distributed_fused_adam`` with ``grad_sync_dtype: bf16`` of the DGX Cloud benchmarking recipes; empty: fp32 in
bf16 runs), ``param_remainders`` (1: that optimizer keeps the fp32 master weights as 16-bit remainders beside the
bf16 weights, as NeMo 1 sets it for ``distributed_fused_adam``), ``cross_entropy`` (also in the calibration table): the loss the row's container ran, priced by
dse.perfmodel.stack.cross_entropy_bytes. ``native``, Megatron's unfused fp32 loss: Megatron-LM 2021, NeMo 24.03,
and NeMo 24.07's GPT-3 and Llama 2 launcher configs (no ``cross_entropy_loss_fusion``); ``native_fused``,
Megatron-Core's fused loss: NeMo 24.07's Llama 3 and Nemotron configs (``cross_entropy_loss_fusion: true``; the
Nemotron 4 340B rows assumed like their siblings) and NeMo 2 up to 25.04 (GPTConfig's
``cross_entropy_loss_fusion=True`` with Megatron-Core's default ``cross_entropy_fusion_impl="native"``); ``te``,
Transformer Engine's: NeMo 25.07 (its performance scripts' ``set_perf_optimization_configs`` sets
``cross_entropy_fusion_impl="te"`` since the 25.07 refactor) and Megatron-Bridge. ``cuda_graphs`` (also in the
calibration table), on the GB200 / GB300 rows, whose Grace hosts the model's host-time term prices: 1 where
NVIDIA's preset for the row's container graphs the layers or the step, 0 where it does not, empty where no
preset says (NeMo 25.07's alternative 70B layout); the same as the knobs a user passes in the last two columns
(both tables), which the benches read: ``cuda_graph`` and ``cuda_graph_scope`` (NeMo 2's ``enable_cuda_graph``
and Bridge 25.09's ``cuda_graphs: true``: local, the whole layer; Bridge 25.11 and 26.02: local,
full_iteration); NeMo's ``scripts/performance/recommended_model_configs/
model_configs_gb200.csv`` at 2025-04-07 (NeMo 25.04) and 2025-06-14 / 07-10 (25.07), Megatron-Bridge's
``scripts/performance/configs`` at v0.1.0rc4 (25.09: the 8B per-tensor row not graphed, the MXFP8 one graphed),
v0.2.0 (25.11) and df0289c18 (26.02): graphs for Llama 3 8B, NeMo's GPT-3 175B and Nemotron 4 rows, none for
the FP8 Llama 3 70B and 3.1 405B presets. Empty on x86 rows, where the term does not apply.

Tokens/s/GPU is compared (convention-free); rows whose source gives only TFLOP/s/GPU carry tokens derived
from it (said in their ``source``). Rows with the same layout as a calibration row (another container's
measurement of it) are marked ``=cal`` and also left out of one MAPE figure, since they test container
drift rather than generalisation.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import model_accuracy  # noqa: E402  (reuse: load_rows, pct, ranking)
from dse.facts.containers import family_of  # noqa: E402
from dse.perfmodel import DEFAULT_PARAMS, HARDWARE, predict  # noqa: E402
from dse.perfmodel.trials import load_model_file, make_trial  # noqa: E402
from dse.recipes.models import RECIPES, Recipe  # noqa: E402
from dse.rules.constraints import check  # noqa: E402
from dse.rules.space import System, load_system  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent / "data"
DATA = DATA_DIR / "published_perf_heldout.tsv"
LAYOUT_KEYS = ("model", "gpu", "num_gpus", "precision", "seq_length", "gbs", "mbs", "tp", "pp", "cp", "vp", "fsdp")
# The 2021 paper's TFLOP/s count the recompute forward pass; the model reports model FLOPs, so it is
# compared in the noncausal convention and the published figure scaled by what recompute adds.
PREDICT_CONVENTION = {"causal": "causal", "noncausal": "noncausal", "noncausal_hw_full_recompute": "noncausal"}


def load_rows(path: Path = DATA) -> list[dict]:
    return model_accuracy.load_rows(path)


def recipe_for(row: dict) -> Recipe:
    """The registry recipe, or one around the row's ``--model-file`` architecture."""
    if row["model"] in RECIPES:
        return RECIPES[row["model"]]
    arch = load_model_file(DATA_DIR / row["model_file"])
    return Recipe(arch.name, arch, "", None, int(row["seq_length"]), int(row["num_gpus"]))


def row_knobs(row: dict) -> dict:
    tp = int(row["tp"])
    return dict(
        tp=tp,
        pp=int(row["pp"]),
        cp=int(row["cp"]),
        vp=int(row["vp"]),
        mbs=int(row["mbs"]),
        gbs=int(row["gbs"]),
        seq_length=int(row["seq_length"]),
        precision=row["precision"],
        fsdp=row["fsdp"] == "1",
        recompute=row["recompute"],
        sp=row["sp"] == "1",
        tp_comm_overlap=row["tp_comm_overlap"] == "1",
        cpu_offload_layers=int(row.get("cpu_offload_layers") or 0),  # 0: no table states offloading
        attention_backend=row.get("attention_backend") or "auto",
        fp8_recipe=fp8_recipe(row),
        **model_accuracy.row_graph(row),
    )


def fp8_recipe(row: dict) -> str:
    """The row's FP8 recipe: "mx" / "mx (assumed)": MXFP8; "delayed" (the NeMo launcher's amax-history scaling, as
    stated in the row's config): delayed; "cs": per-tensor current scaling; unstated: the per-tensor recipe of the
    row's container family (model_accuracy.container_fp8_recipe: delayed in NeMo 24.x, whose Transformer Engine has
    no other)."""
    stated = row.get("fp8_recipe", "")
    if stated.startswith("mx"):
        return "mxfp8"
    if stated in ("delayed", "cs"):
        return "delayed" if stated == "delayed" else "tensorwise"
    return model_accuracy.container_fp8_recipe(row)


def row_system(row: dict) -> System | None:
    """The row's system file (its ``system`` column, a path under bench/data: a fabric other than the GPU's default
    cluster, as Meta's), or None: the GPU's default system."""
    ref = row.get("system") or ""
    if not ref:
        return None
    if ref not in _SYSTEMS:
        _SYSTEMS[ref] = load_system(DATA_DIR / ref)
    return _SYSTEMS[ref]


_SYSTEMS: dict[str, System] = {}


def row_trial(row: dict, **override):
    knobs = row_knobs(row)
    knobs.update(override)
    return make_trial(
        recipe_for(row),
        row["gpu"],
        int(row["num_gpus"]),
        system=row_system(row),
        payload=model_accuracy.row_stack(row),
        container=model_accuracy.row_container_tag(row),
        **knobs,
    )


def validity(row: dict) -> str | None:
    """The rule a row's layout breaks, or None. A missing userbuffer config in dse's table is not a layout
    problem (NVIDIA tuned one for its run), so the layout is checked again without TP overlap."""
    rej = check(row_trial(row))
    if rej is not None and rej.rule == "tp_comm_overlap_supported":
        rej = check(row_trial(row, tp_comm_overlap=False))
    return None if rej is None else f"{rej.rule}: {rej.reason}"


def calibration_layouts() -> dict[tuple, str]:
    return {tuple(r[k] for k in LAYOUT_KEYS): r["id"] for r in model_accuracy.load_rows()}


def group(row: dict) -> dict[str, str]:
    src = row["id"].split("_")[0]
    hw = HARDWARE[row["gpu"]]
    fam = "gpt3" if row["model"].startswith("gpt") else row["model"].split("_")[0].rstrip("0123456789")
    rec = row["fp8_recipe"].split(" ")[0] if row["precision"] == "fp8" else ""
    return {
        "source": src,
        "gpu": row["gpu"],
        "arch": hw.arch,
        "precision": row["precision"] + (f"/{rec}" if rec else ""),
        "model family": fam,
        "long context (cp>1 or seq>8k)": str(int(row["cp"]) > 1 or int(row["seq_length"]) > 8192),
        "container family": container_family(row),
    }


def container_family(row: dict) -> str:
    """The name of the container family (dse.facts.containers) the row ran, "none" where no container is known."""
    tag = model_accuracy.row_container_tag(row)
    return "none" if tag is None else family_of(tag).name


def dense(row: dict) -> bool:
    """A dense model (no mixture of experts in its architecture)."""
    arch = recipe_for(row).arch
    return not (getattr(arch, "num_moe_experts", None) or getattr(arch, "num_experts", None))


def in_fit(row: dict) -> bool:
    """The row joins the model's fit (bench/model_accuracy.py fit_extra_ids)."""
    return row["id"] in model_accuracy.FIT_EXTRA or row["id"].startswith(model_accuracy.FIT_CONTAINERS)


def bridge26_dense(row: dict) -> bool:
    """A Megatron-Bridge 26.x dense row in BF16 or FP8 (the NVFP4 rows have their own group)."""
    return container_family(row) == "bridge26" and dense(row) and row["precision"] in ("bf16", "fp8")


# Named groups of held-out rows, each printed with its size, MAPE and mean signed error: name -> row filter. A row may
# be in several; a group with no row is skipped. Add a group with one line here.
GROUPS: dict[str, Callable[[dict], bool]] = {
    "Megatron-Bridge 26.x dense (goal MAPE <= 4%)": bridge26_dense,
    "Megatron-Bridge 26.x dense, held out of the fit": lambda r: bridge26_dense(r) and not in_fit(r),
    "GB300, all containers (goal: mean signed within +-3%)": lambda r: r["gpu"] == "gb300",
    "GB300, Megatron-Bridge 26.x dense": lambda r: r["gpu"] == "gb300" and bridge26_dense(r),
    "Meta at scale (8K-16K H100, Meta's stack)": lambda r: r["id"].startswith("meta"),
    "never in the fit": lambda r: not in_fit(r),
}


def named_groups(results) -> None:
    """The :data:`GROUPS` of ``results``: size, MAPE and mean signed error of each."""
    print("\nnamed groups:")
    for name, keep in GROUPS.items():
        v = [x["err"] for x in results if keep(x["row"])]
        if v:
            print(
                f"  {name:55s} n={len(v):3d}  MAPE {mape(v):5.1f}%  mean signed {model_accuracy.pct(sum(v) / len(v))}"
            )


def mape(errs) -> float:
    errs = list(errs)
    return 100 * sum(map(abs, errs)) / len(errs) if errs else float("nan")


def accuracy(rows, params=DEFAULT_PARAMS) -> list[dict]:
    cal = calibration_layouts()
    print(
        f"{'row':32s} {'pub tok/s':>10s} {'pred':>10s} {'err':>8s}  {'pub TF':>7s} {'pred TF':>7s}  "
        f"{'mem GiB':>13s} fits  note"
    )
    out = []
    for r in rows:
        bad = validity(r)
        t = row_trial(r)
        conv = r["flops_convention"]
        p = predict(t, flops_convention=PREDICT_CONVENTION[conv], params=params)
        pub = float(r["tokens_per_s_per_gpu"])
        e = p.tokens_per_s_per_gpu / pub - 1
        same = cal.get(tuple(r[k] for k in LAYOUT_KEYS))
        note = []
        if same:
            note.append(f"=cal {same}")
        if bad:
            note.append(f"INVALID {bad}")
        pred_tf = p.tflops_per_gpu
        if (
            conv == "noncausal_hw_full_recompute"
        ):  # the published FLOPs per token (incl. recompute) at the predicted rate
            pred_tf = p.tokens_per_s_per_gpu * float(r["tflops_per_gpu"]) / pub
            note.append("TF incl. recompute")
        out.append(dict(row=r, err=e, pred=p, same=same, invalid=bad))
        print(
            f"{r['id']:32s} {pub:10.1f} {p.tokens_per_s_per_gpu:10.1f} {model_accuracy.pct(e):>8s}  "
            f"{float(r['tflops_per_gpu']):7.0f} {pred_tf:7.0f}  {p.peak_memory_gib:6.1f}/{p.gpu_memory_gib:4.0f}"
            f" {'yes ' if p.fits else 'OOM '} {'; '.join(note)}"
        )
    return out


def summary(results) -> None:
    errs = [x["err"] for x in results]
    fresh = [x["err"] for x in results if not x["same"]]
    print(f"\nMAPE (tokens/s/GPU), all {len(errs)} held-out rows: {mape(errs):.1f}%")
    print(
        f"MAPE without the {len(errs) - len(fresh)} rows whose layout is in the calibration set: "
        f"{mape(fresh):.1f}% ({len(fresh)} rows)"
    )
    signed = sum(errs) / len(errs)
    in_fit = model_accuracy.fit_extra_ids()
    clean = [x["err"] for x in results if not x["same"] and x["row"]["id"] not in in_fit]
    print(
        f"MAPE without those and the {len(in_fit)} rows in the fit ({', '.join(model_accuracy.FIT_EXTRA)} and "
        f"those of {', '.join(model_accuracy.FIT_CONTAINERS)}): {mape(clean):.1f}% ({len(clean)} rows)"
    )
    print(f"mean signed error: {model_accuracy.pct(signed)} (positive: the model is optimistic)")
    within = [sum(abs(e) <= lim for e in errs) for lim in (0.10, 0.15, 0.25)]
    print(f"rows within 10% / 15% / 25%: {within[0]} / {within[1]} / {within[2]} of {len(errs)}")
    oom = [x["row"]["id"] for x in results if not x["pred"].fits]
    print(
        f"published layouts the model calls OOM: {len(oom)} of {len(results)}" + (f" ({', '.join(oom)})" if oom else "")
    )
    inv = [x["row"]["id"] for x in results if x["invalid"]]
    print(f"published layouts dse.rules.constraints rejects: {len(inv)}" + (f" ({', '.join(inv)})" if inv else ""))
    named_groups(results)
    keys = list(group(results[0]["row"]))
    for key in keys:
        by = defaultdict(list)
        for x in results:
            by[group(x["row"])[key]].append(x["err"])
        print(f"\nby {key}:")
        for k, v in sorted(by.items()):
            print(f"  {k:14s} n={len(v):3d}  MAPE {mape(v):5.1f}%  mean signed {model_accuracy.pct(sum(v) / len(v))}")
    worst = sorted(results, key=lambda x: -abs(x["err"]))[:12]
    print(
        "\nworst rows (time shares of the predicted step: compute / host wait / TP / CP / bubble / PP p2p / DP / "
        "optimizer):"
    )
    for x in worst:
        b, st = x["pred"].breakdown, x["pred"].step_time_s
        shares = [
            b[k] / st
            for k in (
                "time.layer_compute_s",
                "time.host_wait_s",
                "time.tp_exposed_s",
                "time.cp_exposed_s",
                "time.bubble_s",
                "time.pp_p2p_s",
                "time.dp_exposed_s",
                "time.optimizer_s",
            )
        ]
        print(f"  {x['row']['id']:32s} {model_accuracy.pct(x['err'])}  " + " ".join(f"{100 * s:4.0f}%" for s in shares))


def graphed_group(results) -> None:
    """The graphed GB200/GB300 rows (a Grace host, ``cuda_graph`` set by the row's preset): their MAPE with the
    graph knobs as NVIDIA's script set them, and without (what a user could pass before the knobs existed: the
    host's launch time on every layer)."""
    xs = [
        x for x in results if x["row"]["gpu"] in ("gb200", "gb300") and (x["row"].get("cuda_graph") or "none") != "none"
    ]
    if not xs:
        return
    off = [predict(row_trial(x["row"], cuda_graph="none")).tokens_per_s_per_gpu for x in xs]
    errs_off = [o / float(x["row"]["tokens_per_s_per_gpu"]) - 1 for o, x in zip(off, xs, strict=True)]
    print(
        f"\ngraphed GB200/GB300 rows: n={len(xs)}  MAPE {mape(x['err'] for x in xs):.1f}% (goal <= 6%)  "
        f"mean signed {model_accuracy.pct(sum(x['err'] for x in xs) / len(xs))}; "
        f"predicted without the graph knobs: MAPE {mape(errs_off):.1f}%"
    )
    for x, e_off in zip(xs, errs_off, strict=True):
        r = x["row"]
        print(
            f"  {r['id']:32s} {r['cuda_graph']}/{r['cuda_graph_scope']:15s} {model_accuracy.pct(x['err'])}  "
            f"(cuda_graph=none: {model_accuracy.pct(e_off)})"
        )


def nvfp4_group(results) -> None:
    """The NVFP4 rows (Megatron-Bridge 26.x) as a group: MAPE over all of them and over those outside the joint fit
    (``model_accuracy.fit_extra_ids``: the 26.02 and 26.04 rows are in it, those of 26.02.01, 26.04.01 and 26.06
    are not), and whether every published layout is accepted and fits."""
    xs = [x for x in results if x["row"]["precision"] == "nvfp4"]
    if not xs:
        return
    in_fit = set(model_accuracy.fit_extra_ids())
    held = [x["err"] for x in xs if x["row"]["id"] not in in_fit]
    print(
        f"\nNVFP4 group: MAPE {mape(x['err'] for x in xs):.1f}% ({len(xs)} rows), held out {mape(held):.1f}% "
        f"({len(held)} rows outside the fit), mean signed "
        f"{model_accuracy.pct(sum(x['err'] for x in xs) / len(xs))}; predicted to fit "
        f"{sum(x['pred'].fits for x in xs)} of {len(xs)}, rejected {sum(bool(x['invalid']) for x in xs)}"
    )
    for gpu in sorted({x["row"]["gpu"] for x in xs}):
        v = [x["err"] for x in xs if x["row"]["gpu"] == gpu]
        print(
            f"  NVFP4 {gpu:6s} n={len(v):3d}  MAPE {mape(v):5.1f}%  mean signed {model_accuracy.pct(sum(v) / len(v))}"
        )


def spearman(x, y) -> float:
    """Spearman's rank correlation (SciPy's ``spearmanr``: Pearson's on average ranks, ties sharing a rank), rounded
    to 12 decimals: a rank correlation is a ratio of small integers, and the floating-point Pearson formula gives,
    say, 5 layouts with one swap of neighbours as 0.8999999999999998 where it is 0.9, the goal's threshold."""
    from scipy.stats import spearmanr  # noqa: PLC0415

    x, y = list(x), list(y)
    if len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")  # no ranking to correlate (SciPy would say so with a warning)
    return round(float(spearmanr(x, y).statistic), 12)


def within_group_spearman(results, min_layouts: int = 3) -> list[float]:
    """Ranking kept inside each (model, GPU) group of the held-out rows with ``min_layouts`` layouts or more:
    Spearman of predicted vs published tokens/s/GPU over the group's layouts. A layout is the layout keys
    plus the FP8 recipe (MXFP8 or per-tensor); rows of one layout from several containers are one point at
    their mean published figure, since the model cannot (and should not) rank container drift."""
    by = defaultdict(lambda: defaultdict(list))
    for x in results:
        r = x["row"]
        lay = tuple(r[k] for k in LAYOUT_KEYS) + (row_knobs(r)["fp8_recipe"],)
        by[(r["model"], r["gpu"])][lay].append(x)
    print(
        f"\n== within-group Spearman (predicted vs published tokens/s/GPU over the layouts of each (model, GPU) "
        f"group with >= {min_layouts} layouts)"
    )
    rhos = []
    for (model, gpu), lays in sorted(by.items()):
        if len(lays) < min_layouts:
            continue
        pub = [sum(float(x["row"]["tokens_per_s_per_gpu"]) for x in xs) / len(xs) for xs in lays.values()]
        pred = [xs[0]["pred"].tokens_per_s_per_gpu for xs in lays.values()]
        rho = spearman(pred, pub)
        rhos.append(rho)
        print(
            f"  {model:16s} {gpu:6s} layouts={len(lays):2d} rows={sum(map(len, lays.values())):2d}  Spearman {rho:+.3f}"
        )
    if rhos:
        print(f"  {len(rhos)} groups: mean {sum(rhos) / len(rhos):+.3f}, lowest {min(rhos):+.3f} (goal >= 0.9 each)")
    return rhos


def oom_table(results, params=DEFAULT_PARAMS) -> None:
    """OOM classification on every layout whose outcome is known: the real H200 runs (bench/data: all ran),
    the published rows (calibration and held-out: NVIDIA ran them, so they fit) and Llama 3.1 405B at
    tp=pp=cp=1 on 1,024 H100s (1.6 TB of weights alone: OOM). The OOM logs under tests/fixtures/logs/ are
    hand-written parser fixtures, not runs, so they are not outcomes."""
    from bench import h200_real_runs, h200_te_runs  # noqa: PLC0415

    known = []  # (set, id, truth_oom, prediction)
    for r in h200_real_runs.read_tsv():
        known.append(("real H200 (local spec)", r["name"], False, predict(h200_real_runs._trial(r), params=params)))
    for r in h200_real_runs.read_tsv(h200_te_runs.TSV):
        known.append(("real H200 (TE spec)", r["name"], False, predict(h200_te_runs.trial(r), params=params)))
    for r in model_accuracy.load_rows():
        known.append(("published calibration", r["id"], False, predict(model_accuracy.row_trial(r), params=params)))
    for x in results:
        known.append(("published held-out", x["row"]["id"], False, x["pred"]))
    row = next(r for r in model_accuracy.load_rows() if r["id"] == "mb2511_h100_405b")
    known.append(
        (
            "known OOM",
            "llama3_405b h100x1024 tp=pp=cp=1",
            True,
            predict(model_accuracy.row_trial(row, tp=1, pp=1, cp=1, vp=1), params=params),
        )
    )
    print("\n== OOM classification (layouts with a known outcome)")
    print(f"  {'set':24s} {'n':>4s} {'truly OOM':>9s} {'called OOM':>10s}  peak / HBM (min-max)")
    for name in dict.fromkeys(k[0] for k in known):
        ks = [k for k in known if k[0] == name]
        fr = [k[3].peak_memory_gib / k[3].gpu_memory_gib for k in ks]
        print(
            f"  {name:24s} {len(ks):4d} {sum(k[2] for k in ks):9d} {sum(not k[3].fits for k in ks):10d}  "
            f"{100 * min(fr):5.1f}%-{100 * max(fr):5.1f}%"
        )
    oom = [k for k in known if k[2]]
    fit = [k for k in known if not k[2]]
    tp = sum(not k[3].fits for k in oom)
    fp = [k for k in fit if not k[3].fits]
    print(
        f"  recall (OOM called OOM): {tp}/{len(oom)}; false-positive rate (ran, called OOM): {len(fp)}/{len(fit)}"
        + (f" ({', '.join(k[1] for k in fp)})" if fp else "")
    )
    pub = [k[3].peak_memory_gib / k[3].gpu_memory_gib for k in fit if k[0].startswith("published")]
    print(
        f"  published layouts: predicted peak {100 * min(pub):.0f}-{100 * max(pub):.0f}% of HBM "
        f"(NVIDIA's recipes are tuned to fill memory: the band's top is the one to watch)"
    )


def ranking(results, params=DEFAULT_PARAMS) -> None:
    """model_accuracy's ranking on the rows whose model is in the registry (its layout generator and
    trials read the registry); every held-out row there runs without recompute, as its trials assume."""
    rows = [x["row"] for x in results if x["row"]["model"] in RECIPES and x["row"]["recompute"] == "none"]
    model_accuracy.ranking(rows, params)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-rank", action="store_true", help="skip the layout ranking")
    args = ap.parse_args(argv)
    rows = load_rows()
    print("== held-out accuracy of the shipped model (never fitted on these rows)")
    results = accuracy(rows)
    summary(results)
    graphed_group(results)
    nvfp4_group(results)
    within_group_spearman(results)
    oom_table(results)
    if not args.no_rank:
        print("\n== ranking of the published layout among valid layouts (registry models only)")
        ranking(results)


if __name__ == "__main__":
    main()
