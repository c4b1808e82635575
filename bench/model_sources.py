"""Leave-one-source-out accuracy of the performance model; prints figures, asserts nothing.

    PYTHONPATH=. python bench/model_sources.py     # every source predicted by a fit that never saw it: MAPE per
                                                   # source and per class, Spearman per (model, GPU) group
    PYTHONPATH=. python bench/model_accuracy.py --by-source   # the same, after model_accuracy's own figures
    PYTHONPATH=. python bench/model_sources.py --terms llama3_405b:h100   # a group's rows under the shipped
                                                   # parameters with their time terms (no folds)

A *source* is one document that published throughput: a container's performance summary (Megatron-Bridge 25.09 to
26.06, NeMo 24.07 to 25.07), NeMo's long-sequence tables, a paper (Narayanan et al. 2021, the Llama 3 paper). Each
row of ``bench/data/published_*.tsv`` names its source in the ``source_key`` column. Rows of one source share its
container, its scripts and its authors' conventions, so a random split of rows tests the model on rows whose
siblings it was fitted to; holding out a whole source tests it as a user meets it, on a source it has never seen.

For each source S:

- dense rows: the dense parameters refitted (``model_accuracy.refit``, the shipped fit's rows less S's) where S has
  rows in the shipped dense fit (the calibration table, ``FIT_EXTRA`` and the Megatron-Bridge 26.02 / 26.04 rows);
  the shipped parameters where it has none, since that fit never saw S;
- mixture-of-experts rows: the MoE parameters (``model_moe.fit``, least squares over ``MOE_FITTED``) refitted on
  every MoE row of the other sources, on top of the dense parameters that never saw S.

Then every row of S is predicted with its fold's parameters. The figures: MAPE and mean signed error per source, per
class (dense / MoE, GPU architecture, precision, container family), Spearman of predicted vs published tokens/s/GPU
within each (model, GPU) group of 3+ distinct layouts (a layout measured in several sources is one point at its mean),
and the published layouts the folds call OOM. The sources no shipped fit sees at all are listed: they are the
model's standing held-out check. Refitting the dense parameters takes about a minute per fold.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import model_accuracy, model_heldout, model_moe  # noqa: E402
from dse.facts.containers import family_of  # noqa: E402
from dse.perfmodel import DEFAULT_PARAMS, HARDWARE, predict  # noqa: E402
from dse.perfmodel.timing import Params  # noqa: E402


def dense_rows() -> list[dict]:
    """Every dense published row, calibration and held-out, with ``kind``, its trial and its layout key."""
    out = []
    for r in model_accuracy.load_rows():
        out.append(dict(kind="dense", row=r, trial=model_accuracy.row_trial(r), layout=dense_layout(r)))
    for r in model_heldout.load_rows():
        out.append(dict(kind="dense", row=r, trial=model_heldout.row_trial(r), layout=dense_layout(r)))
    return out


def dense_layout(r: dict) -> tuple:
    fp8 = r.get("fp8_recipe", "") if r["precision"] == "fp8" else ""
    return tuple(r[k] for k in model_heldout.LAYOUT_KEYS) + ("mx" if fp8.startswith("mx") else "",)


def moe_rows() -> list[dict]:
    return [
        dict(kind="MoE", row=r, trial=model_moe.row_trial(r), layout=tuple(r[k] for k in model_moe.GROUP_LAYOUT))
        for r in model_moe.load_rows()
    ]


def dense_fit_ids() -> set[str]:
    """The ids of the rows the shipped dense fit sees: the calibration table and ``model_accuracy.fit_extra_ids``."""
    return {r["id"] for r in model_accuracy.load_rows()} | set(model_accuracy.fit_extra_ids())


def dense_fold(source: str, rows: list[dict]) -> Params:
    """The dense parameters of a fit that never saw ``source``: the shipped fit's rows less the source's, refitted;
    the shipped parameters where the source has no row in that fit."""
    fit_ids = dense_fit_ids()
    if not any(x["row"]["id"] in fit_ids and x["row"]["source_key"] == source for x in rows):
        return DEFAULT_PARAMS
    train = [
        (x["trial"], float(x["row"]["tokens_per_s_per_gpu"]))
        for x in rows
        if x["row"]["id"] in fit_ids and x["row"]["source_key"] != source
    ]
    return model_accuracy.refit(train)


def moe_fold(source: str, rows: list[dict], base: Params) -> Params:
    """The MoE parameters fitted on every MoE row of the other sources, on top of ``base``."""
    train = [{**x["row"], "split": "fit"} for x in rows if x["row"]["source_key"] != source]
    return model_moe.fit(train, base)


def run_folds(dense: list[dict], moe: list[dict], refit_dense: bool = True, only: tuple[str, ...] = ()) -> list[dict]:
    """Every row's leave-one-source-out prediction: adds ``pred`` (its fold's) and ``err`` to each row record.
    ``refit_dense`` False: the shipped dense parameters in every fold (a quick check of the MoE folds); ``only``: the
    folds of these sources alone (their rows are returned; every other source's rows still train each fold)."""
    sources = sorted({x["row"]["source_key"] for x in dense + moe})
    unknown = sorted(set(only) - set(sources))
    if unknown:
        raise SystemExit(
            f"--sources: no published row has source_key {', '.join(unknown)}; known: {', '.join(sources)}"
        )
    for s in [s for s in sources if not only or s in only]:
        t0 = time.perf_counter()
        d_rows = [x for x in dense if x["row"]["source_key"] == s]
        m_rows = [x for x in moe if x["row"]["source_key"] == s]
        params = dense_fold(s, dense) if refit_dense else DEFAULT_PARAMS
        refit = params is not DEFAULT_PARAMS
        for x in d_rows:
            x["pred"] = predict(x["trial"], params=params)
        if m_rows:
            params = moe_fold(s, moe, params)
            for x in m_rows:
                x["pred"] = predict(x["trial"], params=params)
        for x in d_rows + m_rows:
            x["err"] = x["pred"].tokens_per_s_per_gpu / float(x["row"]["tokens_per_s_per_gpu"]) - 1.0
        print(
            f"  fold {s:18s} dense {len(d_rows):3d} rows ({'refitted without it' if refit else 'shipped: never fitted'})"
            f", MoE {len(m_rows):3d} rows  ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return [x for x in dense + moe if not only or x["row"]["source_key"] in only]


def precision_class(r: dict) -> str:
    if r["precision"] != "fp8":
        return r["precision"]
    return "fp8/mx" if (r.get("fp8_recipe") or "").startswith("mx") else "fp8/per-tensor"


def classes(x: dict) -> dict[str, str]:
    r = x["row"]
    tag = model_accuracy.row_container_tag(r)
    return {
        "kind": x["kind"],
        "GPU architecture": HARDWARE[r["gpu"]].arch,
        "precision": precision_class(r),
        "container family": "none" if not tag else family_of(tag).name,
    }


def line(name: str, errs: list[float], width: int = 28) -> str:
    mape = 100 * sum(map(abs, errs)) / len(errs)
    signed = 100 * sum(errs) / len(errs)
    return f"  {name:{width}s} n={len(errs):3d}  MAPE {mape:5.1f}%  mean signed {signed:+5.1f}%"


def report(results: list[dict], rows: bool = False) -> None:
    fit_ids = dense_fit_ids()
    if rows:
        print("\n== every row (its source's fold): published and predicted tokens/s/GPU, error, fits")
        for x in sorted(results, key=lambda x: (x["row"]["source_key"], x["row"]["id"])):
            pub = float(x["row"]["tokens_per_s_per_gpu"])
            print(
                f"  {x['row']['source_key']:17s} {x['row']['id']:58s} {pub:9.1f} {x['pred'].tokens_per_s_per_gpu:9.1f} "
                f"{100 * x['err']:+6.1f}%  {'fits' if x['pred'].fits else 'OOM'}"
            )
    moe_fitted = {r["source_key"] for r in model_moe.load_rows() if r["split"] == "fit"}
    print("\n== leave-one-source-out, per source (tokens/s/GPU; each source predicted by a fit that never saw it)")
    by_source: dict[str, list[dict]] = defaultdict(list)
    for x in results:
        by_source[x["row"]["source_key"]].append(x)
    for s, xs in sorted(by_source.items()):
        for kind in ("dense", "MoE"):
            e = [x["err"] for x in xs if x["kind"] == kind]
            if e:
                print(line(f"{s} {kind}", e))
    for kind, goal in (("dense", 5), ("MoE", 10)):
        e = [x["err"] for x in results if x["kind"] == kind]
        if e:
            print(line(f"all {kind} (goal <= {goal}%)", e))
    for key in ("GPU architecture", "precision", "container family"):
        print(f"\nby {key}:")
        by: dict[tuple, list[float]] = defaultdict(list)
        for x in results:
            c = classes(x)
            by[(c["kind"], c[key])].append(x["err"])
        for (kind, c), e in sorted(by.items()):
            print(line(f"{kind} {c}", e))
    spearman_groups(results)
    oom = [x["row"]["id"] for x in results if not x["pred"].fits]
    print(
        f"\npublished layouts predicted not to fit: {len(oom)} of {len(results)}"
        + (f" ({', '.join(oom)})" if oom else "")
    )
    dense_unseen = sorted(
        {x["row"]["source_key"] for x in results if x["kind"] == "dense"}
        - {x["row"]["source_key"] for x in results if x["row"]["id"] in fit_ids}
    )
    moe_unseen = sorted({x["row"]["source_key"] for x in results if x["kind"] == "MoE"} - moe_fitted)
    print(f"sources the shipped dense fit never sees: {', '.join(dense_unseen)}")
    print(f"sources the shipped MoE fit never sees: {', '.join(moe_unseen)}")


def sources_rho(lays: dict[tuple, list[dict]]) -> float | None:
    """How well the published figures rank a group's layouts against themselves: Spearman between each layout's
    figure in its first source and in its last (by source key; a layout one source measured is the same figure
    in both). None where no layout has figures from two sources. Container drift between sources that is as large
    as the gaps between layouts keeps this below 1: the group's rho then says as much about which containers
    measured its layouts as about the model."""
    first, last = [], []
    for rows in lays.values():
        by_source: dict[str, list[float]] = defaultdict(list)
        for x in rows:
            by_source[x["row"]["source_key"]].append(float(x["row"]["tokens_per_s_per_gpu"]))
        keys = sorted(by_source)
        first.append(sum(by_source[keys[0]]) / len(by_source[keys[0]]))
        last.append(sum(by_source[keys[-1]]) / len(by_source[keys[-1]]))
    if first == last:
        return None
    return model_heldout.spearman(first, last)


def spearman_groups(results: list[dict], min_layouts: int = 3) -> None:
    """Spearman of the folds' predictions vs published tokens/s/GPU within each (model, GPU) group of
    ``min_layouts`` or more distinct layouts; one point per layout at the mean of its rows. Beside it, where a
    group's layouts were measured by several sources, the published figures' own agreement (:func:`sources_rho`)."""
    by: dict[tuple, dict[tuple, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for x in results:
        by[(x["kind"], x["row"]["model"], x["row"]["gpu"])][x["layout"]].append(x)
    print(f"\nSpearman within (model, GPU) groups of {min_layouts}+ layouts (goal >= 0.9 each):")
    rhos = []
    for (kind, model, gpu), lays in sorted(by.items()):
        if len(lays) < min_layouts:
            continue
        pub = [sum(float(x["row"]["tokens_per_s_per_gpu"]) for x in v) / len(v) for v in lays.values()]
        pred = [sum(x["pred"].tokens_per_s_per_gpu for x in v) / len(v) for v in lays.values()]
        rho = model_heldout.spearman(pred, pub)
        rhos.append(rho)
        own = sources_rho(lays)
        mine = "" if own is None else f"   the sources against each other (first vs last source) {own:+.3f}"
        print(f"  {kind:5s} {model:18s} {gpu:6s} layouts={len(lays):2d}  rho {rho:+.3f}{mine}")
    good = sum(1 for r in rhos if r >= 0.9)
    if rhos:
        print(f"  {good} of {len(rhos)} groups at rho >= 0.9; lowest {min(rhos):+.2f}")


def terms(dense: list[dict], moe: list[dict], groups: list[str]) -> None:
    """Every row of the (model, GPU) ``groups`` (``MODEL:GPU``, as the Spearman lines name them) under the shipped
    parameters: published and predicted tokens/s/GPU, and the prediction's time terms (seconds per step) that are not
    zero; what ranks a group's layouts in the model, printed without the folds (seconds, not minutes)."""
    want = {tuple(g.split(":", 1)) for g in groups}
    known = {(x["row"]["model"], x["row"]["gpu"]) for x in dense + moe}
    unknown = sorted(want - known)
    if unknown:
        raise SystemExit(
            f"no published row is in group {':'.join(unknown[0])}; known: "
            + ", ".join(f"{m}:{g}" for m, g in sorted(known))
        )
    print("== rows of the named groups, shipped parameters: published, predicted tokens/s/GPU, error; time terms (s)")
    for x in sorted(dense + moe, key=lambda x: (x["row"]["model"], x["row"]["gpu"], x["layout"], x["row"]["id"])):
        r = x["row"]
        if (r["model"], r["gpu"]) not in want:
            continue
        p = predict(x["trial"])
        pub = float(r["tokens_per_s_per_gpu"])
        lay = " ".join(f"{k} {r[k]}" for k in ("num_gpus", "precision", "gbs", "mbs", "tp", "pp", "cp", "vp"))
        print(
            f"  {r['source_key']:17s} {r['id']:52s} {lay}  published {pub:8.1f} predicted "
            f"{p.tokens_per_s_per_gpu:8.1f} {100 * (p.tokens_per_s_per_gpu / pub - 1):+6.1f}%"
        )
        shown = {
            k[len("time.") : -len("_s")]: v
            for k, v in p.breakdown.items()
            if k.startswith("time.") and k.endswith("_s") and k != "time.per_microbatch_s" and v >= 0.0005
        }
        print("      " + ", ".join(f"{k} {v:.3f}" for k, v in shown.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense-only", action="store_true", help="only the dense rows")
    ap.add_argument(
        "--shipped-dense",
        action="store_true",
        help="keep the shipped dense parameters in every fold (no dense refit: seconds, not minutes; the dense rows "
        "of the sources in the dense fit are then not held out)",
    )
    ap.add_argument("--rows", action="store_true", help="also print every row's error")
    ap.add_argument(
        "--sources",
        nargs="+",
        default=(),
        metavar="KEY",
        help="only the folds of these sources (source_key values; the figures are then over their rows alone)",
    )
    ap.add_argument(
        "--terms",
        nargs="+",
        default=(),
        metavar="MODEL:GPU",
        help="only print the rows of these (model, GPU) groups under the shipped parameters with their time terms "
        "(e.g. llama3_405b:h100); no folds",
    )
    args = ap.parse_args(argv)
    if args.terms:
        terms(dense_rows(), moe_rows(), list(args.terms))
        return
    print("== folds")
    results = run_folds(
        dense_rows(),
        [] if args.dense_only else moe_rows(),
        refit_dense=not args.shipped_dense,
        only=tuple(args.sources),
    )
    report(results, rows=args.rows)


if __name__ == "__main__":
    main()
