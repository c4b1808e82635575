"""Compare finished studies, one per GPU generation: ``dse compare DIR...`` (and the end of ``dse run --systems``).

One row per study, in the order given (the first is the baseline): the system and GPU, its best layout's
metrics, the job's throughput (tokens/s over all its GPUs), the speed-up over the first, the GPU-hours (and,
with ``price_per_gpu_hour`` in the system file, the cost) of training 1B tokens with that layout, the
GPU-hours the search itself spent, and the knobs whose values differ from the first study's best layout.

Price: the system's ``price_per_gpu_hour`` as the study recorded it in ``dse.json``; for a study made before
that field existed, the shipped system file of the same name (if there is one). No price: cost is empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

from dse import report
from dse.errors import UserError
from dse.fsutil import write_text
from dse.leaderboard import Summary, write_csv
from dse.study import open_store

COLUMNS = (
    "study",
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
    "changed_knobs",
)


def _price(meta: dict[str, Any]) -> float | None:
    if "price_per_gpu_hour" in meta:
        return meta["price_per_gpu_hour"]
    try:
        from dse.space import load_system

        return load_system(str(meta.get("system"))).price_per_gpu_hour
    except UserError:
        return None


def gather(dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """What the comparison needs from each study directory: its meta and a :class:`dse.leaderboard.Summary`
    of its trials (best record, counts, GPU-hours), read as a stream: no study is held whole."""
    if not dirs:
        raise UserError("give one or more study directories", field="DIR")
    studies = []
    for d in dirs:
        store, meta = open_store(Path(d))
        try:
            summary = Summary.of(store.iter_records(), top=0)
        finally:
            store.close()
        studies.append({"dir": Path(d), "meta": meta, "summary": summary, "best": summary.best})
    return studies


def _changed(base: dict[str, Any] | None, knobs: dict[str, Any] | None, order: Sequence[str] = ()) -> str:
    """The knobs whose values differ, in the space's order (``order``), as ``tp 4->2, cp 2->1``."""
    if base is None or knobs is None:
        return ""
    names = list(dict.fromkeys([*(k for k in order if k in base or k in knobs), *base, *knobs]))
    diffs = [f"{k} {report.fmt(base.get(k))}->{report.fmt(knobs.get(k))}" for k in names if base.get(k) != knobs.get(k)]
    return ", ".join(diffs) if diffs else "none"


def table(studies: Sequence[dict[str, Any]]) -> pd.DataFrame:
    rows, base_tps, base_knobs = [], None, None
    for i, s in enumerate(studies):
        meta, best, summary = s["meta"], s["best"], s["summary"]
        m = best.metrics if best else {}
        num_gpus = best.num_gpus if best else None
        tps_gpu = m.get("tokens_per_s_per_gpu")
        tps = tps_gpu * num_gpus if tps_gpu and num_gpus else None
        if i == 0:
            base_tps, base_knobs = tps, (best.knobs if best else None)
        price = _price(meta)
        gph = (1e9 / tps) * num_gpus / 3600.0 if tps else None
        spent = summary.spent
        rows.append(
            {
                "study": meta.get("study_name"),
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
                "changed_knobs": "(baseline)"
                if i == 0 and best
                else _changed(base_knobs, best.knobs if best else None, list(meta.get("knobs", {}))),
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


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
            yaxis_tickformat=".4g",
            height=380,
            template="plotly_white",
            xaxis=dict(type="category"),
        )
        plot = Markup(fig.to_html(full_html=False, include_plotlyjs=True))  # Plotly escapes its JSON's < > /
    links = [(str(Path(s["dir"]).resolve() / "report.html"), str(s["meta"].get("study_name"))) for s in studies]
    return report.page(
        "compare.html.j2",
        title="dse compare",
        table=report.table(df, cut={"changed_knobs": 80}),
        plot=plot,
        links=links,
    )


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
