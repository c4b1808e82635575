"""Accuracy of the performance model on NVIDIA's published mixture-of-experts rows; prints figures, asserts nothing.

    PYTHONPATH=. python bench/model_moe.py          # every row, fitted and held out: error, fit in memory, MAPE,
                                                   # Spearman per (model, GPU) group of 3+ layouts, over
                                                   # all rows, and the share of groups at rho >= 0.8; the
                                                   # consistency line: what an oracle knowing the same
                                                   # configuration's figure in another container reaches
    PYTHONPATH=. python bench/model_moe.py --fit    # refit the MoE parameters (dse.perfmodel.timing MOE_FITTED) on
                                                   # the rows marked ``fit`` and print them
    PYTHONPATH=. python bench/model_moe.py --hold moe_gemm_m_half=250   # the same with one held at a value
    PYTHONPATH=. python bench/model_moe.py --starts # the least cost of the refits from 19 starting points

Data: ``bench/data/published_moe.tsv``: Megatron-Bridge's performance summaries (docs/performance-summary-archive.md)
for DeepSeek-V3, GPT-OSS 120B, Qwen3 30B-A3B and 235B-A22B, containers 26.02, 26.02.01, 26.04 and 26.04.01 (one
software generation: 26.06 brought fused CuTe DSL expert MLPs and full-iteration CUDA graphs, which the model does
not price), each with its preset's recompute modules and CUDA graphs; the older 25.11 rows and 25.09's (DeepSeek-V3
on 1,024 H100, dropless, and 12 token-drop runs of Qwen3 and of DeepSeek-V3 on Blackwell; their presets and run
scripts at Megatron-Bridge v0.2.1 and v0.1.0rc4), held out; and NeMo 2's Mixtral 8x7B and 8x22B rows on B200
and GB200 (NeMo framework performance summary, containers 25.02 and 25.04), all held out; and the
DeepSeek-V3 and Qwen3 235B-A22B rows of NVIDIA's DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking: the
results tables and example outputs of its READMEs at tags v25.05 to v25.12, BF16, containers NeMo 25.04.01 and 25.07.01
and Megatron-Bridge 25.09 and 25.11.01, each with its tag's launch script and its pinned NeMo or Megatron-Bridge
commit's settings), held out. The 26.04 rows are fitted (``split`` = fit), every other row held out; a held-out row whose
layout is also a fitted row's (another container's measurement of it) is marked ``=fit`` and left out of one MAPE
figure, since it tests container drift rather than generalisation. NVIDIA force-balances the router in these
runs, or drops tokens at a capacity factor of 1.0 and pads every expert to it (the ``moe_token_drop`` column:
Megatron-Bridge 25.09's token-drop rows, NeMo 2's performance mode, the DGX Cloud recipes' DeepSeek-V3 runs on GB200
and in NeMo 25.04), so every expert sees the balanced count and ``Params.moe_imbalance`` stays 1. Tokens/s/GPU is
compared (convention-free).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dse.facts.containers import row_container  # noqa: E402
from dse.perfmodel import DEFAULT_PARAMS, predict  # noqa: E402
from dse.perfmodel.stack import published_stack_name  # noqa: E402
from dse.perfmodel.timing import MOE_FITTED, Params  # noqa: E402
from dse.perfmodel.trials import make_trial  # noqa: E402
from dse.recipes.models import RECIPES  # noqa: E402
from dse.rules.constraints import check  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "published_moe.tsv"
LAYOUT = ("model", "gpu", "num_gpus", "precision", "fp8_recipe", "gbs", "mbs", "tp", "pp", "vp", "ep")
# a distinct layout of the Spearman groups: the layout and what else the table varies (sequence, CP, ETP, token
# drop: the same layout with and without it is two configurations, not one measured twice)
GROUP_LAYOUT = (*LAYOUT, "seq_length", "cp", "etp", "moe_token_drop")
# priors of the fitted MoE parameters: (low, high)
BOUNDS = {
    "moe_gemm_m_half": (16.0, 2048.0),
    "moe_gemm_bf16_blackwell_ratio": (1.0, 16.0),
    "moe_a2a_eff": (0.2, 1.0),
    "moe_a2a_nic_eff": (0.5, 1.0),
    "moe_flex_speedup": (0.5, 3.0),
    "moe_a2a_overlap": (0.0, 0.95),
    "moe_layer_overhead_s": (0.0, 5e-3),
    "moe_host_fwd_s": (0.5e-3, 5e-3),
    "moe_host_grace_ratio": (1.0, 3.0),
}


def load_rows(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def row_trial(row: dict):
    """The trial of one published row: its layout, NVIDIA's MoE options, TE's loss, and its preset's recompute
    modules and CUDA graphs (the ``recompute``, ``recompute_modules``, ``cuda_graph`` and ``cuda_graph_scope``
    columns; the older ``cuda_graphs`` flag is no longer read)."""
    tp = int(row["tp"])
    knobs = dict(
        tp=tp,
        pp=int(row["pp"]),
        cp=int(row["cp"]),
        vp=int(row["vp"]),
        mbs=int(row["mbs"]),
        gbs=int(row["gbs"]),
        seq_length=int(row["seq_length"]),
        precision=row["precision"],
        tp_comm_overlap=tp > 1,
        ep=int(row["ep"]),
        etp=int(row["etp"]),
        # the row's container preset's dispatcher and overlap where one matches its layout, else the older columns
        moe_dispatcher=row.get("moe_dispatcher_preset") or row["moe_dispatcher"],
        moe_a2a_overlap=(row.get("moe_a2a_overlap_preset") or row["moe_a2a_overlap"]) == "1",
        moe_permute_fusion=True,
        moe_grouped_gemm=True,
        # NVIDIA's token drop (capacity factor 1.0, padded) where the row's scripts applied it
        moe_token_drop=row.get("moe_token_drop") == "1",
        pp_first_layers=int(row["pp_first_layers"]),
        pp_last_layers=int(row["pp_last_layers"]),
        recompute=row["recompute"],
        cuda_graph=row["cuda_graph"],
        cuda_graph_scope=row["cuda_graph_scope"],
    )
    if row["recompute_modules"]:
        knobs["recompute_modules"] = row["recompute_modules"]
    if row["fp8_recipe"]:
        knobs["fp8_recipe"] = row["fp8_recipe"]
    # every published MoE row reduced its gradients in bf16, bf16 runs too: Megatron-Bridge's performance scripts
    # (set_{deepseek,gpt_oss,qwen3}_common_configs: cfg.ddp.grad_reduce_in_fp32 = False, from v0.2.1) and NeMo 2's
    # Mixtral performance mode (recipe.trainer.plugins.grad_reduce_in_fp32 = False)
    payload = published_stack_name(row.get("cross_entropy") or "te", bf16_grads=True)
    # the container the row ran (from its id or its source), whose family the model prices, as for the dense rows
    knobs["container"] = row_container(row["id"], row.get("source", ""))
    trial = make_trial(RECIPES[row["model"]], row["gpu"], int(row["num_gpus"]), payload=payload, **knobs)
    broken = check(trial)
    if broken and broken.rule == "tp_comm_overlap_supported":
        # no userbuffer config ships for this (GPU, hidden, tp, precision): the script ran without TP overlap
        knobs["tp_comm_overlap"] = False
        trial = make_trial(RECIPES[row["model"]], row["gpu"], int(row["num_gpus"]), payload=payload, **knobs)
    return trial


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (SciPy's; tied figures share their mean rank). NaN where a side is constant."""
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic)


def group_spearman(
    groups: dict[tuple[str, str], dict[tuple, list[tuple[float, float]]]], held: list[tuple[float, float]]
) -> None:
    """The issue's ranking goal, measured: within each (model, GPU) group of 3 or more distinct layouts, over all
    rows (fitted and held out), Spearman of predicted vs published tokens/s/GPU. A layout measured in several
    containers is one point at the mean of its published and of its predicted figures (the model prices no
    container drift). Prints each group's n and rho, the share of groups at rho >= 0.8, and the held-out rows'
    rho (every held-out row one point)."""
    print("Spearman within (model, GPU) groups of 3+ distinct layouts (all rows; one point per layout, its mean):")
    rhos: list[float] = []
    for (model, gpu), layouts in sorted(groups.items()):
        if len(layouts) < 3:
            continue
        pub = [sum(p for p, _ in v) / len(v) for v in layouts.values()]
        pred = [sum(m for _, m in v) / len(v) for v in layouts.values()]
        rho = spearman(pred, pub)
        rhos.append(rho)
        rows = sum(map(len, layouts.values()))
        print(f"  {model:16s} {gpu:6s} n={len(pub):2d} ({rows:2d} rows)  rho={rho:+.2f}")
    sizes = sorted(len(v) for v in groups.values())
    small = sum(1 for n in sizes if n < 3)
    if rhos:
        good = sum(1 for r in rhos if r >= 0.8)  # NaN (a constant side) counts as missing the goal
        print(
            f"  {good} of {len(rhos)} groups at rho >= 0.8 ({100 * good / len(rhos):.0f}%); "
            f"{small} of {len(groups)} groups hold fewer than 3 layouts"
        )
    else:
        print(f"  none: the {len(groups)} (model, GPU) groups hold {min(sizes)}-{max(sizes)} distinct layouts")
    print(f"Spearman over all held-out rows: {spearman(*map(list, zip(*held))):+.2f} ({len(held)} rows)")


def fit(rows: list[dict], params: Params = DEFAULT_PARAMS, held: frozenset[str] = frozenset()) -> Params:
    """Least squares in log tokens/s over the ``fit`` rows, within :data:`BOUNDS` (SciPy); the parameters in
    ``held`` keep ``params``' values."""
    from scipy.optimize import least_squares

    trials = fit_trials(rows)
    names = [n for n in MOE_FITTED if n not in held]
    lo = [BOUNDS[n][0] for n in names]
    hi = [BOUNDS[n][1] for n in names]
    scale = [max(abs(getattr(params, n)), 1e-4) for n in names]

    def residuals(x):
        p = params.with_values(**{n: v * s for n, v, s in zip(names, x, scale)})
        return [math.log(predict(t, params=p).tokens_per_s_per_gpu / y) for t, y in trials]

    # the start clipped into the priors (a prior narrowed since the last fit)
    x0 = [min(max(getattr(params, n), a), b) / s for n, a, b, s in zip(names, lo, hi, scale)]
    res = least_squares(residuals, x0, bounds=([a / s for a, s in zip(lo, scale)], [b / s for b, s in zip(hi, scale)]))
    return params.with_values(**{n: v * s for n, v, s in zip(names, res.x, scale)})


def fit_trials(rows: list[dict]) -> list[tuple]:
    """The ``fit`` rows as (trial, published tokens/s/GPU)."""
    return [(row_trial(r), float(r["tokens_per_s_per_gpu"])) for r in rows if r["split"] == "fit"]


def fit_cost(rows: list[dict], params: Params) -> float:
    """What :func:`fit` minimises: the sum of squared log errors of tokens/s over the ``fit`` rows."""
    return sum(math.log(predict(t, params=params).tokens_per_s_per_gpu / y) ** 2 for t, y in fit_trials(rows))


# --starts: the fit's cost is flat along the host's launch time and its Grace ratio and has several basins, so the
# shipped values are the least cost over these starting points (and the shipped values themselves)
STARTS = tuple(
    {"moe_host_fwd_s": h, "moe_host_grace_ratio": g, "moe_gemm_bf16_blackwell_ratio": r}
    for h in (1.5e-3, 3e-3, 4.9e-3)
    for g in (1.0, 1.8, 2.8)
    for r in (2.0, 6.0)
)


def fit_from_starts(rows: list[dict], params: Params, held: frozenset[str] = frozenset()) -> Params:
    """:func:`fit` from ``params`` and from each of :data:`STARTS` (the held parameters kept); prints each start's
    cost and returns the least cost's parameters."""
    best: tuple[float, Params] | None = None
    for start in ({}, *STARTS):
        p = fit(rows, params.with_values(**{k: v for k, v in start.items() if k not in held}), held)
        cost = fit_cost(rows, p)
        print(f"start {start or 'the given values'}: cost {cost:.4f}", flush=True)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, p)
    return best[1]


# the held-out rows' sources, by their source_key's prefix
SOURCE_CLASSES = (
    ("bridge-", "Megatron-Bridge rows"),
    ("nemo-", "NeMo 2 Mixtral rows"),
    ("dgxc-", "DGX Cloud recipes' rows"),
)


def source_class(row: dict) -> str:
    """The label of the row's source in the held-out MAPE lines (:data:`SOURCE_CLASSES`)."""
    return next((label for prefix, label in SOURCE_CLASSES if row["source_key"].startswith(prefix)), "other rows")


def report(rows: list[dict], params: Params) -> None:
    fitted_layouts = {tuple(r[k] for k in LAYOUT) for r in rows if r["split"] == "fit"}
    errs: dict[str, list[float]] = defaultdict(list)
    groups: dict[tuple[str, str], dict[tuple, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    held: list[tuple[float, float]] = []
    print(f"{'row':58s} {'split':9s} {'published':>9s} {'model':>8s} {'error':>7s} {'peak GiB':>8s} fits")
    for r in rows:
        trial = row_trial(r)
        pred = predict(trial, params=params)
        pub = float(r["tokens_per_s_per_gpu"])
        err = pred.tokens_per_s_per_gpu / pub - 1.0
        same = r["split"] == "heldout" and tuple(r[k] for k in LAYOUT) in fitted_layouts
        split = r["split"] + ("=fit" if same else "")
        broken = check(trial)
        note = f"  rejected: {broken.reason}" if broken else ""
        print(
            f"{r['id']:58s} {split:9s} {pub:9.0f} {pred.tokens_per_s_per_gpu:8.0f} {100 * err:+6.1f}% "
            f"{pred.peak_memory_gib:8.1f} {'yes' if pred.fits else 'NO'}{note}"
        )
        errs[r["split"]].append(abs(err))
        if r["split"] == "heldout" and not same:
            errs["heldout, new layouts"].append(abs(err))
        if r["split"] == "heldout":
            errs[f"heldout, {source_class(r)}"].append(abs(err))
        errs["fits"].append(1.0 if pred.fits else 0.0)
        groups[(r["model"], r["gpu"])][tuple(r[k] for k in GROUP_LAYOUT)].append((pub, pred.tokens_per_s_per_gpu))
        if r["split"] == "heldout":
            held.append((pub, pred.tokens_per_s_per_gpu))
    print()
    for name in (
        "fit",
        "heldout",
        "heldout, new layouts",
        *(f"heldout, {label}" for _, label in SOURCE_CLASSES),
    ):
        e = errs[name]
        if e:
            print(f"MAPE {name}: {100 * sum(e) / len(e):.1f}% over {len(e)} rows (max {100 * max(e):.1f}%)")
    print(f"published layouts predicted to fit: {int(sum(errs['fits']))} of {len(errs['fits'])}")
    group_spearman(groups, held)
    print(consistency(rows))


def trial_key(row: dict) -> tuple:
    """Everything the model reads of a row: its architecture, GPU, payload and resolved knob values."""
    trial = row_trial(row)
    return (row["model"], row["gpu"], trial.payload, tuple(sorted(trial.values.items())))


def best_constant_error(figures: list[float]) -> float:
    """The least sum of ``|x / p - 1|`` over ``figures`` that one prediction ``x`` for all of them can reach: the
    sum is piecewise linear in ``x``, so its minimum sits at one of the figures."""
    return min(sum(abs(x / p - 1.0) for p in figures) for x in figures)


def consistency_figures(rows: list[dict], key) -> tuple[int, int, float, float, float]:
    """For the rows grouped by ``key`` (a function of a row) whose groups were measured in 2+ containers: the
    groups, their rows, the MAPE of an oracle that predicts each row by the mean of its group's other figures, the
    least MAPE one prediction per group reaches over them, and that least error over the held-out rows alone as a
    share of all held-out rows (a floor under the held-out MAPE)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    multi = [g for g in groups.values() if len({r["container"] for r in g}) > 1]
    oracle: list[float] = []
    for g in multi:
        for r in g:
            others = [float(o["tokens_per_s_per_gpu"]) for o in g if o is not r]
            oracle.append(abs(sum(others) / len(others) / float(r["tokens_per_s_per_gpu"]) - 1.0))
    floor = sum(best_constant_error([float(r["tokens_per_s_per_gpu"]) for r in g]) for g in multi)
    held = [[float(r["tokens_per_s_per_gpu"]) for r in g if r["split"] == "heldout"] for g in groups.values()]
    n_held = sum(1 for r in rows if r["split"] == "heldout")
    held_floor = sum(best_constant_error(h) for h in held if len(h) > 1) / max(n_held, 1)
    n = max(len(oracle), 1)
    return len(multi), len(oracle), sum(oracle) / n, floor / n, held_floor


def consistency(rows: list[dict]) -> str:
    """The share of the error no function of the columns can remove, as one line: configurations measured in
    several containers whose columns the model reads are the same (:func:`trial_key`: no function of them can tell
    the rows apart), and, in brackets, those whose layout columns alone (:data:`LAYOUT`) are the same, their
    presets' dispatcher, overlap, recompute or graphs aside."""
    g, n, oracle, floor, held = consistency_figures(rows, trial_key)
    lg, ln, lo, lf, lh = consistency_figures(rows, lambda r: tuple(r[k] for k in LAYOUT))
    return (
        f"consistency: {g} configurations in 2+ containers with the same columns ({n} rows): the other containers' "
        f"figure MAPE {100 * oracle:.1f}%, best one figure per configuration {100 * floor:.1f}%, floor under the "
        f"held-out MAPE {100 * held:.1f} points (same layout, any preset: {lg} configurations, {ln} rows, "
        f"{100 * lo:.1f}%, {100 * lf:.1f}%, {100 * lh:.1f} points)"
    )


def memory_report(rows: list[dict], params: Params) -> None:
    """Memory per GPU of the rows' distinct layouts against Megatron-Bridge's theoretical memory estimator, the one
    that shards the experts over expert parallelism (bench/moe_memory.py, which prints the same with the shipped
    spaces' defaults and ``--terms``). Megatron-LM's ``report_theoretical_memory`` divides nothing by expert
    parallelism (Megatron-LM issue 1784), so it is no reference for a MoE layout and is no longer printed here."""
    from bench.moe_memory import compare, layouts

    print("\nmemory per GPU: dse vs Megatron-Bridge's theoretical memory estimator (bench/moe_memory.py):")
    compare(layouts(rows, spaces=False), params)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the MoE parameters on the fit rows and print them")
    ap.add_argument(
        "--fit-on",
        metavar="CONTAINER",
        help="refit on the rows of these containers (e.g. 26.02 or 26.02,26.04) instead, every other row held out: "
        "a check that the forms do not depend on which container's rows were fitted",
    )
    ap.add_argument(
        "--hold",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="refit with this MoE parameter held at VALUE (repeatable), e.g. a measured figure in place of the "
        "fitted one: moe_gemm_m_half=250",
    )
    ap.add_argument(
        "--starts",
        action="store_true",
        help=f"refit from the shipped values and {len(STARTS)} other starting points, keep the least cost",
    )
    args = ap.parse_args(argv)
    held: dict[str, float] = {}
    for item in args.hold:
        name, _, value = item.partition("=")
        if name not in MOE_FITTED:
            ap.error(f"--hold {item!r}: the name must be one of {', '.join(MOE_FITTED)}")
        try:
            held[name] = float(value)
        except ValueError:
            ap.error(f"--hold {item!r}: the value must be a number")
    rows = load_rows()
    if args.fit_on:
        rows = [{**r, "split": "fit" if r["container"] in args.fit_on.split(",") else "heldout"} for r in rows]
        if not any(r["split"] == "fit" for r in rows):
            sys.exit(f"bench/model_moe.py: --fit-on: no row of container {args.fit_on!r}")
        args.fit = True
    params = DEFAULT_PARAMS.with_values(**held)
    if args.fit or held or args.starts:
        refit = fit_from_starts if args.starts else fit
        params = refit(rows, params, frozenset(held))
        for n in MOE_FITTED:
            print(f"{n} = {getattr(params, n):.4g}{'  (held)' if n in held else ''}")
        print(f"fit cost (sum of squared log errors over the fit rows): {fit_cost(rows, params):.4f}")
        print()
    report(rows, params)
    memory_report(rows, params)


if __name__ == "__main__":
    main()
