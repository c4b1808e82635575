"""Compare finished studies, one per GPU generation: ``dse compare DIR...`` (and the end of ``dse run --systems``).

One row per study, in the order given (the first is the baseline): the system and GPU, its best layout's
metrics, the job's throughput (tokens/s over all its GPUs), the speed-up over the first, the GPU-hours (and,
with ``price_per_gpu_hour`` in the system file, the cost) of training 1B tokens with that layout, the
GPU-hours the search itself spent, the best's gain over the study's own baseline (``recipe_layout_gain``: the
recipe's default layout for its GPU, measured or predicted, as :class:`dse.study.leaderboard.Baseline` says it), where the figures come from (``backend``, and for simulated ones ``truth``
and ``calibration``, from each study's ``dse.json``), and every knob whose resolved value (recipe defaults
applied: FSDP, offloaded layers, TP overlap, FP8 recipe, ...) differs from the first study's best layout.

Studies of different recipes (models) are refused: a speed-up between two models measures the models, not the
hardware. ``--allow-different-recipes`` compares them anyway, and the ``warning`` column says so on each row.

Price: the system's ``price_per_gpu_hour`` as the study recorded it in ``dse.json``; for a study made before
that field existed, the shipped system file of the same name (if there is one). No price: cost is empty.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

from dse.errors import UserError
from dse.fsutil import write_text
from dse.results import report
from dse.rules.space import Space, load_system
from dse.rules.trial import resolve
from dse.study.leaderboard import Baseline, Summary, write_csv
from dse.study.loop import open_store
from dse.study.store import TrialRecord

COLUMNS = (
    "study",
    "recipe",
    "system",
    "gpu",
    "num_gpus",
    "best_trial",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "step_time_s",
    "tokens_per_s",
    "speedup",
    "gpu_hours_per_1b_tokens",
    "price_per_gpu_hour",
    "cost_per_1b_tokens",
    "search_gpu_hours",
    "search_cost",
    "trials",
    "ok",
    "recipe_layout_gain",
    "backend",
    "truth",
    "calibration",
    "changed_knobs",
    "warning",
)
INT_COLUMNS = ("num_gpus", "best_trial", "trials", "ok")
# best.json's keys that are columns of their own (or the recipe, which must match), not knobs
NOT_KNOBS = ("recipe", "gpu", "num_gpus")


def _price(meta: dict[str, Any]) -> float | None:
    if "price_per_gpu_hour" in meta:
        return meta["price_per_gpu_hour"]
    try:
        return load_system(str(meta.get("system"))).price_per_gpu_hour
    except UserError:
        return None


def gather(dirs: Sequence[str | Path], *, allow_different_recipes: bool = False) -> list[dict[str, Any]]:
    """What the comparison needs from each study directory: its meta, a :class:`dse.study.leaderboard.Summary` of its
    trials (best record, counts, GPU-hours), read as a stream (no study is held whole), where its figures come
    from and its best layout resolved. Studies of different recipes are refused unless
    ``allow_different_recipes``."""
    if not dirs:
        raise UserError("give one or more study directories", field="DIR")
    studies: list[dict[str, Any]] = []
    for d in dirs:
        store, meta = open_store(Path(d))
        space = report.study_space(meta)
        provenance = report.study_provenance(meta, space)
        try:  # the provenance labels the gain over the baseline: measured, or predicted
            summary = Summary(0, provenance, baseline=Baseline.of_meta(meta))
            for r in store.iter_records():
                summary.add(r)
        finally:
            store.close()
        studies.append(
            {
                "dir": Path(d),
                "meta": meta,
                "summary": summary,
                "best": summary.best,
                "provenance": provenance,
                "layout": resolved_layout(Path(d), meta, summary.best, space),
            }
        )
    recipes = {str(s["meta"].get("recipe")) for s in studies}
    if len(recipes) > 1 and not allow_different_recipes:
        named = ", ".join(f"{s['dir']} ({s['meta'].get('recipe')})" for s in studies)
        raise UserError(
            f"the studies are of different recipes: {named}; a speed-up between different models compares the "
            "models, not the systems (--allow-different-recipes compares them anyway)",
            field="DIRS",
        )
    return studies


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as ``best.json`` holds them (JSON), so that a layout read back and one resolved here compare."""
    return {k: v for k, v in json.loads(json.dumps(values, default=str)).items() if k not in NOT_KNOBS}


def resolved_layout(
    out_dir: Path, meta: dict[str, Any], best: TrialRecord | None, space: Space | None
) -> dict[str, Any] | None:
    """Every knob of the best trial's layout, recipe defaults applied (``best/best.json``'s ``knobs``, written for
    that trial); else resolved again from the study's space file (moved onto the study's system, as a
    ``--systems`` sub-study is); else only the knobs the space varied (None: no ok trial)."""
    if best is None:
        return None
    written = report.read_best(out_dir)
    if written and written.get("trial") == best.number and isinstance(written.get("knobs"), dict):
        return _plain(written["knobs"])
    if space is not None:
        try:
            if space.system.name != meta.get("system") or space.num_nodes != meta.get("num_nodes"):
                data = space.model_dump()
                data.update(system=load_system(str(meta.get("system"))).model_dump(), num_nodes=meta.get("num_nodes"))
                space = Space.model_validate(data)
            return _plain(resolve(space, best.knobs).as_dict())
        except (UserError, ValueError, KeyError):  # the system is no longer there, or the point does not resolve
            pass
    return _plain(best.knobs)


def _fmt_value(v: Any) -> str:
    return "unset" if v is None else report.fmt(v)


def _changed(base: dict[str, Any] | None, knobs: dict[str, Any] | None, order: Sequence[str] = ()) -> str:
    """The knobs whose values differ, the space's (``order``) first, then the catalogue's: ``tp 4->2, fsdp
    False->True``."""
    if base is None or knobs is None:
        return ""
    names = list(dict.fromkeys([*(k for k in order if k in base or k in knobs), *base, *knobs]))
    diffs = [f"{k} {_fmt_value(base.get(k))}->{_fmt_value(knobs.get(k))}" for k in names if base.get(k) != knobs.get(k)]
    return ", ".join(diffs) if diffs else "none"


def _row(s: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """One study's row; ``base`` is the first study's (None for the first itself)."""
    meta, best, summary, prov = s["meta"], s["best"], s["summary"], s["provenance"]
    m = best.metrics if best else {}
    num_gpus = best.num_gpus if best else None
    tps_gpu = m.get("tokens_per_s_per_gpu")
    tps = tps_gpu * num_gpus if tps_gpu and num_gpus else None
    base_tps = tps if base is None else base["tokens_per_s"]
    price = _price(meta)
    gph = (1e9 / tps) * num_gpus / 3600.0 if tps else None
    spent = summary.spent
    if base is None:
        changed, warning = ("(baseline)" if best else ""), ""
    else:
        changed = _changed(base["layout"], s["layout"], list(meta.get("knobs", {})))
        other = meta.get("recipe") != base["recipe"]
        warning = (
            f"recipe {meta.get('recipe')}, not the baseline's {base['recipe']}: a different model" if other else ""
        )
    return {
        "study": meta.get("study_name"),
        "recipe": meta.get("recipe"),
        "system": meta.get("system"),
        "gpu": meta.get("gpu"),
        "num_gpus": num_gpus,
        "best_trial": best.number if best else None,
        "tflops_per_gpu": m.get("tflops_per_gpu"),
        "tokens_per_s_per_gpu": tps_gpu,
        "step_time_s": m.get("step_time_s"),
        "tokens_per_s": tps,
        "speedup": tps / base_tps if tps and base_tps else None,
        "gpu_hours_per_1b_tokens": gph,
        "price_per_gpu_hour": price,
        "cost_per_1b_tokens": gph * price if gph is not None and price else None,
        "search_gpu_hours": spent,
        "search_cost": spent * price if price else None,
        "trials": summary.n,
        "ok": summary.counts["ok"],
        "recipe_layout_gain": summary.baseline_line(),
        "backend": prov.backend,
        "truth": prov.truth,
        "calibration": prov.calibration,
        "changed_knobs": changed,
        "warning": warning,
    }


def table(studies: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per study (:data:`COLUMNS`), the first the baseline of the speed-up and the changed knobs."""
    rows: list[dict[str, Any]] = []
    for s in studies:
        base = None if not rows else {**rows[0], "layout": studies[0].get("layout")}
        rows.append(_row(s, base))
    # counts stay integers where a row is blank (a study with no ok trial): pandas' nullable integers, which
    # compare.csv writes as 16 and an empty field, where a float column would write 16.0
    return pd.DataFrame(rows, columns=list(COLUMNS)).astype({c: "Int64" for c in INT_COLUMNS})


def page(df: pd.DataFrame, studies: Sequence[dict[str, Any]]) -> str:
    """``compare.html``: the table, the throughput of each generation's best layout and links to each study's
    report (the ``compare.html.j2`` template, autoescaped as the report is)."""
    import plotly.graph_objects as go

    ok = df[df.tokens_per_s.notna()]
    plot = None
    if not ok.empty:
        fig = go.Figure(
            go.Bar(
                x=ok.system.astype(str),
                y=ok.tokens_per_s,
                text=[f"{v:.3g}x" for v in ok.speedup],
                hovertemplate="%{x}: %{y:.4g} tokens/s<extra></extra>",
            )
        )
        fig.update_layout(
            title="Throughput of the best layout (tokens/s, whole job)",
            yaxis_tickformat=",.4~r",  # 250,000, not 2.500e+5 (d3's rounded decimal notation)
            height=380,
            template="plotly_white",
            xaxis=dict(type="category"),
        )
        plot = Markup(fig.to_html(full_html=False, include_plotlyjs=True))  # Plotly escapes its JSON's < > /
    links = [(str(Path(s["dir"]).resolve() / "report.html"), _link_text(s)) for s in studies]
    warnings = [f"{name}: {w}" for name, w in zip(df.study, df.warning) if isinstance(w, str) and w]
    # the gain's sentence says which layout the baseline is and where its figures come from, a paragraph per
    # study: below the table, which shows the gain alone (a 3,000 px column otherwise)
    gains = [(_link_text(s), line) for s, line in zip(studies, df.recipe_layout_gain) if isinstance(line, str) and line]
    shown, same = html_columns(
        df.assign(
            recipe_layout_gain=[_gain_cell(s.get("summary"), line) for s, line in zip(studies, df.recipe_layout_gain)]
        )
    )
    return report.page(
        "compare.html.j2",
        title="dse compare",
        table=report.table(shown, wrap=("changed_knobs", "warning")),
        gains=gains,
        same=same,
        plot=plot,
        links=links,
        warnings=warnings,
    )


def _gain_cell(summary: Summary | None, line: Any) -> str:
    """The page's short ``recipe_layout_gain`` (``line``, the CSV's sentence): the gain alone ("+3.4%"; "+9.2% vs
    predicted" over a baseline the model predicts, not measured), or "see below" where the sentence has none
    (a failed baseline, ...)."""
    if not isinstance(line, str) or not line:
        return ""
    gain = summary.baseline_gain() if summary is not None else None
    if gain is None:
        return "see below"
    return f"{gain[0]:+.1%}" + (" vs predicted" if gain[1] else "")


def _link_text(study: dict[str, Any]) -> str:
    """A study's link on the page: its system, name and folder (``--systems`` sub-studies share the space's name, so
    the name alone made identical links)."""
    meta = study["meta"]
    return f"{meta.get('system') or meta.get('gpu') or '?'}: {meta.get('study_name')} ({Path(study['dir']).name}/report.html)"


def html_columns(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The page's table and the line said above it. What tells the studies apart comes first (the changed knobs
    right after the system, so that no scroll hides them), the figures after; a column with one value in every
    row (the recipe, the backend) is said once in the line, and one empty in every row (no price, no warning) is
    left out (``compare.csv`` keeps every column)."""
    first = ["study", "recipe", "system", "gpu", "num_gpus", "changed_knobs", "warning", "backend", "truth"]
    keep = ("study", "system", "changed_knobs")
    cols = [*first, *(c for c in df.columns if c not in first)]
    text = df[cols].map(report.fmt)
    empty = [c for c in cols if c not in keep and (text[c] == "").all()]
    same = [c for c in cols if c not in keep and c not in empty and len(df) > 1 and text[c].nunique() == 1]
    line = ", ".join(f"{c} {text[c].iloc[0]}" for c in same)
    return df[[c for c in cols if c not in empty and c not in same]], line


def write(studies: Sequence[dict[str, Any]], out_dir: str | Path) -> tuple[pd.DataFrame, Path, Path]:
    """Write ``compare.csv`` and ``compare.html`` in ``out_dir`` and each study's ``report.html``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = table(studies)
    csv = write_csv(df, out / "compare.csv")
    for s in studies:  # each study's report from a second stream over its store
        store, _ = open_store(Path(s["dir"]))
        try:
            report.write(
                store.iter_records(),
                s["meta"],
                s["dir"] / "report.html",
                best=report.read_best(s["dir"]),
                total=s["summary"].n,
            )
        finally:
            store.close()
    return df, csv, write_text(out / "compare.html", page(df, studies))
