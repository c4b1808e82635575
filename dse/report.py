"""The HTML report of a study: summary, best configuration, plots and the leaderboard, in one file.

Plots are Plotly figures; the report embeds plotly.js once, so it opens on a machine without network
access (clusters often have none). Everything comes from the store, as the leaderboard does.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dse.leaderboard import frame, gpu_hours, savings_line
from dse.store import TrialRecord


def _figures(df: pd.DataFrame, knob_names: Sequence[str], metric: str) -> list:
    import plotly.express as px
    import plotly.graph_objects as go

    figs = []
    by_trial = df.sort_values("trial")
    ok = by_trial[by_trial.status == "ok"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ok.trial, y=ok.reward, mode="markers", name="ok trials"))
    best = by_trial.assign(r=by_trial.reward.where(by_trial.status == "ok")).r.cummax()
    fig.add_trace(go.Scatter(x=by_trial.trial, y=best, mode="lines", name="best so far", line_shape="hv"))
    fig.update_layout(title="Reward by trial", xaxis_title="trial", yaxis_title="reward")
    figs.append(fig)
    counts = Counter(df.status)
    figs.append(px.bar(x=list(counts), y=list(counts.values()), labels={"x": "status", "y": "trials"},
                       title="Trials by status"))
    for knob in knob_names:
        if ok.empty:
            break
        fig = px.box(ok.astype({knob: str}), x=knob, y=metric if metric in ok else "reward", points="all",
                     title=f"{metric} by {knob} (ok trials)")
        figs.append(fig)
    if not ok.empty and "peak_memory_gib" in ok:
        figs.append(px.scatter(ok, x="peak_memory_gib", y=metric if metric in ok else "reward",
                               hover_data=list(knob_names), title=f"{metric} against peak memory"))
    return figs


def render(records: Sequence[TrialRecord], meta: dict, *, metric: str = "tflops_per_gpu") -> str:
    knob_names = list(meta.get("knobs", {}))
    df = frame(records, knob_names)
    parts = [f"<h1>dse study {html.escape(str(meta.get('study_name', '')))}</h1>",
             "<p>" + html.escape(f"recipe {meta.get('recipe')} on {meta.get('num_nodes')} nodes of "
                                 f"{meta.get('gpu')} ({meta.get('system')}); agent {meta.get('agent')}, "
                                 f"backend {meta.get('backend')}; {len(df)} trials; space {meta.get('space')}")
             + "</p>"]
    spent, to_best = gpu_hours(records)
    launched = sum(r.status != "rejected" for r in records)
    parts.append("<p>" + html.escape(f"{launched} launched runs; GPU-hours: {spent:,.1f} spent"
                                     + (f", {to_best:,.1f} to the best" if to_best is not None else "")
                                     + savings_line(records)) + "</p>")
    ok = df[df.status == "ok"]
    if not ok.empty:
        best = ok.iloc[0]
        cfg = ", ".join(f"{k}={best[k]}" for k in knob_names)
        parts.append(f"<h2>Best configuration</h2><p><b>{html.escape(cfg)}</b>: reward {best.reward:.4g}, "
                     f"step time {best.step_time_s:.4g} s, {best.tflops_per_gpu:.4g} TFLOP/s/GPU, "
                     f"{best.tokens_per_s_per_gpu:.4g} tokens/s/GPU (trial {int(best.trial)}, "
                     f"{html.escape(str(best.run_dir))})</p>")
    else:
        parts.append("<h2>Best configuration</h2><p>No trial succeeded.</p>")
    figs = _figures(df, knob_names, metric) if len(df) else []
    for i, fig in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("<h2>Leaderboard</h2>")
    parts.append(df.to_html(index=False, na_rep="", float_format=lambda x: f"{x:.4g}", border=0,
                            classes="leaderboard"))
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}"
             "table.leaderboard{border-collapse:collapse;font-size:13px}"
             "table.leaderboard td,table.leaderboard th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>dse {html.escape(str(meta.get('study_name')))}"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>")


def write(records: Sequence[TrialRecord], meta: dict, path: str | Path, *, metric: str = "tflops_per_gpu") -> Path:
    from dse.leaderboard import checked_output, output_error

    path = Path(path)
    tmp = checked_output(path, "--html")
    text = render(records, meta, metric=metric)
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise output_error(e, path, "--html") from None
    return path
