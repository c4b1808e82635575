"""The HTML report of a study, in one file: where its figures come from (predicted by the performance model,
or measured), summary, best configuration with its launch command, plots (best so far, statuses, metric by
knob, parallel coordinates, knob importance, memory), failures by class and the leaderboard.

The plots show the study's objective (``dse.json``, else its space file's ``[objective]``) in its direction:
a ``step_time_s`` study plots seconds, its best so far going down, never the reward (the metric signed so
that higher is better).

Plots are Plotly figures; the report embeds plotly.js once, so it opens on a machine without network
access (clusters often have none). Everything comes from the store (and ``best/best.json``), as the
leaderboard does. Numbers are shown to 4 significant digits; an empty cell is empty, never ``None``;
ordinal knobs are drawn in numeric order; the page fits 1400 px (long reasons are cut, the full text is
on hover). ``tests/test_report_browser.py`` renders it in headless Chromium.

Decisions: GPU-hours are the study's (``dse.study.leaderboard.gpu_hours``: GPUs x each run's wall time). Knob
importance is each knob's share of the ok trials' variance of the objective (eta squared; :func:`importances`
says why not Optuna's evaluators), so it ranks the knobs as the box plots show them. The Pareto front
the issue mentions needs a two-metric objective, which spaces cannot express yet, so it is not drawn.

The page is a Jinja2 template (``dse/templates/report.html.j2``, package data) with autoescaping on, rather
than HTML assembled from f-strings: a knob value, a failure's reason or a study name reaches the page escaped
unless the code marks it as HTML (Plotly's divs, whose JSON Plotly escapes itself; tables rendered from the
same templates), so a forgotten ``html.escape`` cannot open a script. ``dse compare`` uses the same templates.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import json
import math
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from dse.backends.base import InfrastructureFailure
from dse.errors import UserError
from dse.fsutil import write_text
from dse.rules.space import Objective, Space, load_space
from dse.study.leaderboard import UNKNOWN, Provenance, frame
from dse.study.store import TrialRecord

REASON_CHARS = 48  # reason cut in tables (full text in the cell's title)
PLOT_TRIALS = 5_000  # at most this many trials (every k-th one, plus the top rows) in the plots of a large study
REPORT_ROWS = 500  # leaderboard rows in the page (leaderboard.csv has every row)
MIN_IMPORTANCE_TRIALS = 4  # fewer ok trials than this: importance is not estimated (noise)


# each objective metric as an axis title: what it is and its unit
METRIC_TITLES = {
    "tflops_per_gpu": "TFLOP/s per GPU",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
    "step_time_s": "step time (s)",
    "peak_memory_gib": "peak memory (GiB)",
}


def metric_title(metric: str) -> str:
    """``metric`` as an axis title, with its unit (``step time (s)``); an unknown name as it is."""
    return METRIC_TITLES.get(metric, metric)


def _fingerprint_fields(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """The fields of ``dse.json``'s study fingerprint, when the study has one ({} otherwise)."""
    fp = meta.get("fingerprint")
    fields = fp.get("fields") if isinstance(fp, Mapping) else None
    return fields if isinstance(fields, Mapping) else {}


def study_space(meta: Mapping[str, Any]) -> Space | None:
    """The space file ``dse.json`` names, when it still reads as the same space (its name); None otherwise (moved,
    changed, or a study from elsewhere): what a study's ``dse.json`` lacks may come from it."""
    source, name = meta.get("space"), meta.get("space_name")
    if not isinstance(source, str) or not source:
        return None
    try:
        space = load_space(source)
    except (UserError, OSError):  # gone, changed, or not readable by this user (a study copied or shared)
        return None
    return space if space.name == name else None


def study_objective(meta: Mapping[str, Any], space: Space | None = None) -> Objective:
    """The study's objective: from ``dse.json`` (its ``objective`` or its fingerprint's), else from its space file,
    else the default (TFLOP/s per GPU, maximised), which is what a study without one ran under."""
    for raw in (meta.get("objective"), _fingerprint_fields(meta).get("objective")):
        if isinstance(raw, Mapping):
            try:
                return Objective.model_validate(dict(raw))
            except (UserError, ValueError):
                continue
    space = space or study_space(meta)
    return space.objective if space is not None else Objective()


def study_provenance(meta: Mapping[str, Any], space: Space | None = None) -> Provenance:
    """Where a study's figures come from: what ``dse.json`` records (:meth:`Provenance.of_meta`); a study written
    before it did: its fingerprint's fields, then its space file (absent ones ``unknown``)."""
    if isinstance(meta.get("provenance"), Mapping):
        return Provenance.of_meta(meta)
    fields = _fingerprint_fields(meta)
    backend = meta.get("backend") or fields.get("backend")
    if space is None and (not {"payload", "truth", "calibration"} <= set(fields) or fields.get("calibration")):
        # dse.json lacks some of them (or keeps only the calibration's hash): the space file may say
        space = study_space(meta)
    payload = fields.get("payload") or (space.backend.payload if space is not None else None)
    if not (backend == "sim" or payload == "sim"):
        return Provenance(str(backend) if backend else UNKNOWN)
    truth, calibration = _truth(meta, fields, space), _calibration(meta, fields, space)
    return Provenance(str(backend), truth or UNKNOWN, calibration or UNKNOWN)


def _truth(meta: Mapping[str, Any], fields: Mapping[str, Any], space: Space | None) -> str | None:
    truth, seed = meta.get("truth") or fields.get("truth"), fields.get("twin_seed")
    if truth is None and space is not None:
        truth, seed = space.backend.truth, space.backend.twin_seed
    if truth == "twin" and seed is not None and "seed" not in str(meta.get("truth") or ""):
        return f"twin (seed {seed})"
    return None if truth is None else str(truth)


def _calibration(meta: Mapping[str, Any], fields: Mapping[str, Any], space: Space | None) -> str | None:
    if "calibration" in meta:  # dse.json's own field: a file (its name shown: no machine path), or none
        return Path(str(meta["calibration"])).name if meta["calibration"] else "none"
    if space is not None:
        return Path(space.backend.calibration).name if space.backend.calibration else "none"
    if "calibration" in fields:  # the fingerprint keeps the file's hash: the file's name is not known
        return str(fields["calibration"])[:19] if fields["calibration"] else "none"
    return None


def fmt(v: Any) -> str:
    """A value for people: 4 significant digits for floats, empty for missing, ints as ints."""
    if v is None or v is pd.NA:  # pd.NA: a blank of a nullable integer column
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if 1e4 <= abs(v) < 1e15:  # 4 significant digits without an exponent: 103,900 rather than 1.039e+05
            return f"{float(f'{v:.4g}'):,.0f}"
        if v.is_integer():
            return str(int(v))
        return f"{v:.4g}"
    if hasattr(v, "item"):  # numpy scalars
        return fmt(v.item())
    return str(v)


def ordered_values(values: Sequence[Any]) -> list[Any]:
    """A knob's values in numeric order when they are all numbers, else as the space lists them."""
    vals = list(values)
    if vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return sorted(vals)
    return vals


def importances(records: Sequence[TrialRecord], knob_values: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """Each varied knob's share of the ok trials' variance of the objective that its values alone explain (one-way
    ANOVA's eta squared: the spread of the box plots' means, weighted by their trials, over the whole spread), the
    largest first; {} when there are too few trials or nothing varies.

    Why not Optuna's evaluators (decision): PED-ANOVA asks which knobs separate the top 10% of trials from the rest,
    which on a 70B study ranked cp first while the box plots beside it showed recompute and precision as the large
    effects; fANOVA needs scikit-learn, which is not a dependency. Eta squared is what the box plots show, as a
    number: a few lines of pandas, no model fitted."""
    ok = [r for r in records if r.ok and math.isfinite(r.reward)]
    if len(ok) < MIN_IMPORTANCE_TRIALS:
        return {}
    df = pd.DataFrame(
        {**{k: [json.dumps(r.knobs.get(k), default=str) for r in ok] for k in knob_values}, "y": [r.reward for r in ok]}
    )
    total = float(((df.y - df.y.mean()) ** 2).sum())
    if total <= 0:
        return {}
    shares = {}
    for k in knob_values:
        groups = df.groupby(k).y
        if groups.ngroups > 1:
            shares[k] = float((groups.count() * (groups.mean() - df.y.mean()) ** 2).sum()) / total
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def _int_ticks(n: int) -> dict:
    step = max(1, math.ceil(max(n, 1) / 12))
    return dict(tickmode="linear", tick0=0, dtick=step, tickformat="d")


def objective_values(rewards: pd.Series, objective: Objective) -> pd.Series:
    """Rewards back as the objective's values (a reward is the metric signed so that higher is better)."""
    return rewards if objective.sense == "maximize" else -rewards


def _figures(
    df: pd.DataFrame,
    records: Sequence[TrialRecord],
    knob_values: Mapping[str, Sequence[Any]],
    objective: Objective,
    *,
    counts: Mapping[str, int] | None = None,
    best_line: pd.Series | None = None,
    note: str = "",
) -> list:
    """The plots of ``df`` (every trial, or a sample of a large study: ``counts`` and ``best_line``, the
    best-so-far step line by trial in rewards, then come from the whole study, and ``note`` says what is shown).
    Every plot shows the objective's metric in its own direction, never the reward."""
    by_trial = df.sort_values("trial")
    figs = [
        _reward_figure(by_trial, objective, best_line, note),
        _status_figure(Counter(df.status) if counts is None else counts),
    ]
    ok = by_trial[by_trial.status == "ok"].copy()
    if ok.empty:
        return figs
    y = objective.metric
    if y not in ok or ok[y].isna().all():  # an ok trial's reward is its metric, signed
        ok[y] = objective_values(ok.reward, objective)
    minimize = objective.sense == "minimize"
    figs += [_knob_box(ok, knob, knob_values[knob], y, note) for knob in knob_values]
    if knob_values:
        figs.append(_parallel_coordinates(ok, knob_values, y, minimize))
    imp = importances(records, knob_values)
    if imp:
        figs.append(_importance_figure(imp, len(ok)))
    if "peak_memory_gib" in ok and ok.peak_memory_gib.notna().any():
        figs.append(_memory_figure(ok, list(knob_values), y, minimize))
    return figs


def _reward_figure(by_trial: pd.DataFrame, objective: Objective, best_line: pd.Series | None, note: str):
    """The objective by trial: ok trials, the best so far in the objective's direction as a step line over all
    trials, pruned trials at their bound (the most they could have scored), failures as marks beyond the worst
    value (below it when maximising, above it when minimising; one trace per status, the reason on hover)."""
    import plotly.graph_objects as go

    metric, minimize = objective.metric, objective.sense == "minimize"
    ok = by_trial[by_trial.status == "ok"]
    pruned = by_trial[by_trial.status == "pruned"]
    failed = by_trial[~by_trial.status.isin(("ok", "pruned"))]
    fig = go.Figure()
    best = by_trial.reward.where(by_trial.status == "ok").cummax().ffill() if best_line is None else best_line
    best = objective_values(best, objective)
    values = objective_values(ok.reward, objective)
    if not ok.empty:
        lo, hi = float(values.min()), float(values.max())
        pad = 0.06 * ((hi - lo) or abs(hi) or 1.0)
        mark = hi + pad if minimize else lo - pad
    else:
        mark = 0.0
    fig.add_trace(
        go.Scatter(
            x=ok.trial,
            y=values,
            mode="markers",
            name="ok",
            hovertemplate=f"trial %{{x}}<br>{metric} %{{y:.4g}}<extra></extra>",
        )
    )
    if best.notna().any():
        fig.add_trace(
            go.Scatter(
                x=by_trial.trial if best_line is None else best.index,
                y=best,
                mode="lines",
                name="best so far",
                line_shape="hv",
                connectgaps=False,
                hovertemplate=f"trial %{{x}}<br>best {metric} %{{y:.4g}}<extra></extra>",
            )
        )
    if not pruned.empty:
        fig.add_trace(
            go.Scatter(
                x=pruned.trial,
                y=objective_values(pruned.reward, objective),
                mode="markers",
                name="pruned (bound)",
                marker=dict(symbol="triangle-down", size=8),
                customdata=pruned.reason.fillna("").str.slice(0, 200),
                hovertemplate="trial %{x}: pruned<br>%{customdata}<extra></extra>",
            )
        )
    for status, grp in failed.groupby("status", sort=True):
        fig.add_trace(
            go.Scatter(
                x=grp.trial,
                y=[mark] * len(grp),
                mode="markers",
                name=str(status),
                marker=dict(symbol="x", size=8),
                customdata=grp.reason.fillna("").str.slice(0, 200),
                hovertemplate=f"trial %{{x}}: {html.escape(str(status))}<br>%{{customdata}}<extra></extra>",
            )
        )
    better = "lower" if minimize else "higher"
    fig.update_layout(
        title=f"{metric_title(metric)} by trial ({better} is better; failures marked at the "
        f"{'top' if minimize else 'bottom'})" + note,
        xaxis_title="trial",
        yaxis_title=metric_title(metric),
        yaxis_tickformat=".4~g",
        xaxis=_int_ticks(int(by_trial.trial.max()) if len(by_trial) else 1),
    )
    return fig


def _status_figure(counts: Mapping[str, int]):
    """Trials by status, a bar each."""
    import plotly.graph_objects as go

    return go.Figure(
        go.Bar(x=list(counts), y=list(counts.values()), hovertemplate="%{x}: %{y}<extra></extra>"),
        layout=dict(
            title="Trials by status",
            xaxis_title="status",
            yaxis_title="trials",
            yaxis=dict(tickformat="d", rangemode="tozero"),
        ),
    )


def _knob_box(ok: pd.DataFrame, knob: str, values: Sequence[Any], y: str, note: str):
    """``y`` of the ok trials by the value of ``knob``, its values in the space's order."""
    import plotly.graph_objects as go

    order = [str(v) for v in ordered_values(values)]
    fig = go.Figure(
        go.Box(
            x=ok[knob].astype(str),
            y=ok[y],
            boxpoints="all",
            name=knob,
            hovertemplate=f"{knob}=%{{x}}<br>{y} %{{y:.4g}}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"{metric_title(y)} by {knob} (ok trials{note})",
        xaxis_title=knob,
        yaxis_title=metric_title(y),
        yaxis_tickformat=".4~g",
        xaxis=dict(type="category", categoryorder="array", categoryarray=order),
        showlegend=False,
    )
    return fig


def _parallel_coordinates(ok: pd.DataFrame, knob_values: Mapping[str, Sequence[Any]], y: str, minimize: bool):
    """One axis per knob (its values coded by their place in the space's order), then ``y``; the lines coloured
    by ``y``, the best trials bright whatever the direction (the scale reversed when minimising)."""
    import plotly.graph_objects as go

    dims = []
    for knob in knob_values:
        order = ordered_values(knob_values[knob])
        index = {json.dumps(v, default=str): i for i, v in enumerate(order)}
        codes = [index.get(json.dumps(v, default=str), -1) for v in ok[knob]]
        dims.append(
            dict(
                label=knob,
                values=codes,
                tickvals=list(range(len(order))),
                ticktext=[fmt(v) for v in order],
                range=[0, max(len(order) - 1, 1)],
            )
        )
    dims.append(dict(label=metric_title(y), values=list(ok[y]), tickformat=".4~g"))
    line = dict(
        color=list(ok[y]),
        colorscale="Viridis",
        reversescale=minimize,
        showscale=True,
        colorbar=dict(title=dict(text=metric_title(y))),
    )
    return go.Figure(
        go.Parcoords(line=line, dimensions=dims),
        # the axes' labels are drawn above the plot area: the title sits at the page's top, above a margin for them
        layout=dict(
            title=dict(
                text=f"Parallel coordinates: knobs against {metric_title(y)} (ok trials)", y=0.98, yanchor="top"
            ),
            margin=dict(t=130),
        ),
    )


def _importance_figure(imp: Mapping[str, float], n_ok: int):
    """The knobs' importances as horizontal bars, the most important on top."""
    import plotly.graph_objects as go

    names = list(imp)[::-1]
    return go.Figure(
        go.Bar(x=[imp[k] for k in names], y=names, orientation="h", hovertemplate="%{y}: %{x:.3g}<extra></extra>"),
        layout=dict(
            title=f"Knob importance: share of the objective's variance each knob explains alone (eta squared, "
            f"{n_ok} ok trials)",
            xaxis_title="share of the variance (0-1)",
            xaxis_tickformat=".2~g",
        ),
    )


def _memory_figure(ok: pd.DataFrame, knob_names: list[str], y: str, minimize: bool):
    """``y`` against peak memory, one point per ok trial coloured by ``y`` (the best bright, as in the parallel
    coordinates), its knobs on hover."""
    import plotly.graph_objects as go

    text = (
        ok[knob_names].apply(lambda row: ", ".join(f"{k}={fmt(row[k])}" for k in knob_names), axis=1)
        if knob_names
        else None
    )
    return go.Figure(
        go.Scatter(
            x=ok.peak_memory_gib,
            y=ok[y],
            mode="markers",
            text=text,
            marker=dict(
                color=list(ok[y]),
                colorscale="Viridis",
                reversescale=minimize,
                showscale=True,
                colorbar=dict(title=dict(text=metric_title(y))),
            ),
            hovertemplate="%{text}<br>%{x:.4g} GiB<br>" + y + " %{y:.4g}<extra></extra>",
        ),
        layout=dict(
            title=f"{metric_title(y)} against peak memory (ok trials)",
            xaxis_title=metric_title("peak_memory_gib"),
            yaxis_title=metric_title(y),
            xaxis_tickformat=".4~g",
            yaxis_tickformat=".4~g",
        ),
    )


@functools.cache
def _templates() -> jinja2.Environment:
    """The page templates (package data under ``dse/templates``), autoescaped: every value is escaped unless
    the code marks it as HTML (:class:`markupsafe.Markup`: Plotly's own divs, tables rendered here)."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("dse", "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )


def page(name: str, **context: Any) -> str:
    """The page template ``name`` rendered with ``context``."""
    return _templates().get_template(name).render(**context)


def table(
    df: pd.DataFrame, *, cut: Mapping[str, int] | None = None, wrap: Iterable[str] = (), css: str = "tbl"
) -> Markup:
    """An HTML table of ``df`` with values as :func:`fmt` writes them; columns in ``cut`` are truncated, those in
    ``wrap`` break over lines (a long list the reader needs whole, which neither a cut nor a scroll may hide)."""
    cut, wrapped = dict(cut or {}), set(wrap)
    limits = [cut.get(c) for c in df.columns]
    rows = [[(fmt(v), limit) for v, limit in zip(row, limits)] for row in df.itertuples(index=False, name=None)]
    columns = [str(c) for c in df.columns]
    wraps = [c in wrapped for c in columns]
    texts = [c in wrapped or c in cut for c in columns]
    return Markup(page("table.html.j2", columns=columns, rows=rows, wraps=wraps, texts=texts, css=css))  # escaped there


#: the failures table's class for a trial that failed for infrastructure (dse.backends.base.InfrastructureFailure)
INFRASTRUCTURE_CLASS = "failed (infrastructure)"


class Failures:
    """Failures by class from a stream of trials: per status the count, the first trials and the reasons
    counted (distinct reasons only, never the trials). Pruned trials are not failures."""

    SHOWN = 12

    def __init__(self):
        self._by: dict[str, tuple[list[int], Counter]] = {}
        self._n: Counter = Counter()

    def add(self, number: int, status: str, reason: str | None) -> None:
        if status in ("ok", "pruned"):  # pruned trials ran and lost: no failures
            return
        if InfrastructureFailure.of(status, reason) is not None:  # pandas gives NaN for none: not one
            # the machinery around the trial failed (sbatch refused the job, a launcher that cannot start), not
            # its layout: a class of its own, so a refused submission is not read as the layout's failure
            status = INFRASTRUCTURE_CLASS
        trials, reasons = self._by.setdefault(status, ([], Counter()))
        self._n[status] += 1
        if len(trials) < self.SHOWN + 1:
            trials.append(int(number))
        elif number < trials[-1]:  # streams come in number order; this keeps the first ones whatever the order
            trials[-1] = int(number)
            trials.sort()
        if reason is not None and reason == reason:  # NaN from a frame is no reason
            reasons[reason] += 1

    def html(self) -> Markup:
        if not self._by:
            return Markup("<p>No failed trials.</p>")
        rows = []
        for status, (trials, reasons) in self._by.items():
            trials = sorted(trials)
            reason = reasons.most_common(1)[0][0] if reasons else ""
            shown = ", ".join(map(str, trials[: self.SHOWN])) + (", ..." if self._n[status] > self.SHOWN else "")
            rows.append({"status": status, "trials": self._n[status], "which": shown, "reason (most common)": reason})
        out = pd.DataFrame(rows).sort_values("trials", ascending=False, kind="stable")
        return table(out, cut={"reason (most common)": 110})


def failures_table(df: pd.DataFrame) -> Markup:
    """Failures grouped by class: count, trials and one short reason (the most common one). Pruned trials
    are no failures (they ran, and lost): the summary line counts them."""
    f = Failures()
    for number, status, reason in zip(df.trial, df.status, df.reason):
        f.add(number, status, reason)
    return f.html()


def launch_command(best: Mapping[str, Any]) -> str:
    """The best trial's trainer command, with its environment, as one shell line a user can paste."""
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted((best.get("env") or {}).items()))
    argv = shlex.join(str(a) for a in best.get("argv") or [])
    return f"env {env} {argv}" if env else argv


def _best_section(df: pd.DataFrame, knob_names: Sequence[str], best: Mapping[str, Any] | None) -> dict | None:
    """The best configuration for the page (None: no trial succeeded): its table row, run directory and, from
    ``best/best.json``, its launch command."""
    ok = df[df.status == "ok"]
    if ok.empty:
        return None
    row = ok.iloc[0]
    # no reward column: it is the objective's metric, signed (negative seconds for a step-time study)
    cols = ["trial", "step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib", *knob_names]
    return {
        "table": table(pd.DataFrame([{c: row[c] for c in cols}])),
        # relative to the study directory (trials/NNNNN): the page names no path of the machine it was made on
        "run_dir": str(Path(*Path(row.run_dir).parts[-2:])) if isinstance(row.run_dir, str) else None,
        "command": launch_command(best) if best and best.get("argv") else None,
    }


@dataclasses.dataclass
class _Pass:
    """What one pass over a study's trials keeps for the page: the summary (top rows, counts, GPU-hours), the
    failures, every ``stride``-th trial for the plots and the best-so-far line where it changes."""

    stride: int
    summary: Any
    failures: Failures = dataclasses.field(default_factory=Failures)
    sample: list[TrialRecord] = dataclasses.field(default_factory=list)
    best_x: list[int] = dataclasses.field(default_factory=list)
    best_y: list[float] = dataclasses.field(default_factory=list)

    @classmethod
    def over(
        cls,
        records: Iterable[TrialRecord],
        total: int,
        meta: Mapping[str, Any] | None = None,
        provenance: Provenance | None = None,
    ) -> _Pass:
        """One pass over ``records``; the summary knows the study's baseline when ``meta`` (``dse.json``) has one,
        and where its figures come from (``provenance``: its labels, measured or predicted)."""
        from dse.study.leaderboard import Baseline, ProbeCost, Summary

        summary = Summary(REPORT_ROWS, provenance, Baseline.of_meta(meta or {}), ProbeCost.of_meta(meta or {}))
        p = cls(max(1, math.ceil(total / PLOT_TRIALS)), summary)
        for r in records:
            p.summary.add(r)
            p.failures.add(r.number, r.status, r.reason)
            if r.number % p.stride == 0:
                p.sample.append(r)
            if r.ok and (not p.best_y or r.reward > p.best_y[-1]):
                p.best_x.append(r.number)
                p.best_y.append(r.reward)
        return p

    def best_line(self) -> pd.Series | None:
        """The best-so-far line of the whole study, at the trials where it changed (None: every trial is drawn)."""
        if self.stride == 1 or not self.best_x:
            return None
        last = max(self.summary._numbers) if self.summary.n else self.best_x[-1]
        return pd.Series(self.best_y + [self.best_y[-1]], index=self.best_x + [last])


def _headline(meta: Mapping[str, Any], summary: Any) -> tuple[str, str]:
    """The page's two summary sentences: what the study ran, and what its trials came to."""
    g = {k: fmt(meta.get(k)) or "?" for k in ("recipe", "num_nodes", "gpu", "system", "agent", "backend", "space")}
    g["space"] = Path(g["space"]).name  # the file's name: the page names no path of the machine it was made on
    what = (
        f"recipe {g['recipe']} on {g['num_nodes']} nodes of {g['gpu']} ({g['system']}); "
        f"agent {g['agent']}, backend {g['backend']}; space {g['space']}"
    )
    if not summary.n:
        return what, "no trials yet"
    stats = (
        f"{summary.n} trials: "
        + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items()))
        + "; "
        # the same sentence as the terminal's summary (dse run, dse leaderboard): one figure, one way of writing it
        + summary.runs_line()
    )
    if line := summary.baseline_line():
        stats += f". Baseline: {line}"
    if line := summary.model_line():
        stats += f". {line[0].upper()}{line[1:]}"
    return what, stats


def _plots(df: pd.DataFrame, p: _Pass, knob_values: Mapping[str, Sequence[Any]], objective: Objective) -> list[dict]:
    """The plots as Plotly divs (plotly.js embedded once, in the first). Marked as HTML: Plotly writes its data
    as JSON with ``<``, ``>`` and ``/`` escaped, so a value cannot close its script."""
    if not len(df):
        return []
    note = f"; every {p.stride}th of {p.summary.n:,} trials and the top {len(p.summary.rows)}" if p.stride > 1 else ""
    ok_sample = [r for r in p.sample if r.ok] if p.stride > 1 else p.sample
    figs = _figures(df, ok_sample, knob_values, objective, counts=p.summary.counts, best_line=p.best_line(), note=note)
    out = []
    for i, fig in enumerate(figs):
        top = max(60, fig.layout.margin.t or 0)  # a figure's own top margin stays (the parallel coordinates')
        fig.update_layout(height=420, margin=dict(l=60, r=30, t=top, b=50), template="plotly_white")
        div = fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"responsive": True})
        out.append({"div": Markup(div), "wide": fig.data[0].type == "parcoords" or i == 0})
    return out


def _reward_repeats_metric(lb: pd.DataFrame, objective: Objective) -> bool:
    """Whether the leaderboard's reward column says nothing its objective's metric column does not."""
    if "reward" not in lb or objective.metric not in lb:
        return False
    if objective.sense == "minimize":
        return True
    has = lb[objective.metric].notna()
    pruned = (lb.status == "pruned").any() if "status" in lb else True
    return not pruned and bool((lb.reward[has] == lb[objective.metric][has]).all())


def _leaderboard(
    lb_df: pd.DataFrame, knob_names: Sequence[str], total: int, objective: Objective | None = None
) -> dict | None:
    """The leaderboard section: its table, and the columns with one value in every row (gpu, num_gpus,
    early_stopped when nothing stopped early, ...) said once above it, so the table fits the page; the CSV
    keeps every column. The reward column is left out where the objective's metric column says the same: always
    for a minimising study (the reward of a 2 s step is -2), and for a maximising one when every row with the
    metric has it as its reward and no trial was pruned (a pruned trial's reward is its bound, not its figure)."""
    if not len(lb_df):
        return None
    lb = lb_df.copy()
    if objective is not None and _reward_repeats_metric(lb, objective):
        lb = lb.drop(columns=["reward"])
    lb["run_dir"] = lb.run_dir.map(lambda p: Path(p).name if isinstance(p, str) else None)
    lb = lb.rename(columns={"run_dir": "run"})
    keep = {"trial", "status", "reward", "reason", *knob_names}
    same = [c for c in lb.columns if c not in keep and len(lb) > 1 and lb[c].astype(str).nunique() == 1]
    return {
        "shown": len(lb),
        "total": total,
        "same": ", ".join(f"{c} {fmt(lb[c].iloc[0]) or '(empty)'}" for c in same),
        "table": table(lb.drop(columns=same), cut={"reason": REASON_CHARS}),
    }


def render(
    records: Iterable[TrialRecord],
    meta: dict,
    *,
    objective: Objective | None = None,
    best: Mapping[str, Any] | None = None,
    extra_html: str = "",
    total: int | None = None,
) -> str:
    """The report as one HTML string. ``objective``: what the plots show (default: the study's, from ``dse.json``
    or its space file: :func:`study_objective`); ``best`` is ``best/best.json`` (for the launch command) when
    there is one; ``extra_html`` is a section the caller built as HTML (inserted as it is).

    ``records`` is read once, as a stream (``Store.iter_records``); ``total``, the number of trials, when the
    stream cannot say (a list can). What is held is bounded by what the page shows: the top
    :data:`REPORT_ROWS` rows (the leaderboard table), at most :data:`PLOT_TRIALS` trials for the plots (every
    k-th trial of a larger study, plus the top rows; the titles say so), the best-so-far line where it
    changes, and the failures' distinct reasons. Counts and GPU-hours are over every trial."""
    knob_values = {k: list(v) for k, v in meta.get("knobs", {}).items()}
    knob_names = list(knob_values)
    if total is None:
        records = records if isinstance(records, Sequence) else list(records)
        total = len(records)
    space = study_space(meta)
    p = _Pass.over(records, total, meta, study_provenance(meta, space))
    top = p.summary.rows
    in_sample = {r.number for r in p.sample}
    df = frame(p.sample + [r for r in top if r.number not in in_sample], knob_names)
    what, stats = _headline(meta, p.summary)
    name = str(meta.get("study_name", ""))
    objective = objective or study_objective(meta, space)
    return page(
        "report.html.j2",
        title=f"dse {name}",
        study=name,
        summary_line=what,
        stats=stats,
        provenance=study_provenance(meta, space).sentence(),
        goal=f"Objective: {metric_title(objective.metric)}, {objective.sense}d ({objective.metric}).",
        best=_best_section(df, knob_names, best),
        plots=_plots(df, p, knob_values, objective),
        failures=p.failures.html() if len(df) else None,
        extra=Markup(extra_html),
        leaderboard=_leaderboard(frame(top, knob_names), knob_names, total, objective),
    )


def read_best(out_dir: str | Path) -> dict | None:
    """``DIR/best/best.json``, or None when the study has none (or it cannot be read)."""
    try:
        return json.loads((Path(out_dir) / "best" / "best.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write(
    records: Iterable[TrialRecord],
    meta: dict,
    path: str | Path,
    *,
    objective: Objective | None = None,
    best: Mapping[str, Any] | None = None,
    extra_html: str = "",
    total: int | None = None,
) -> Path:
    from dse.study.leaderboard import checked_output, output_error

    path = checked_output(Path(path), "html")
    text = render(records, meta, objective=objective, best=best, extra_html=extra_html, total=total)
    try:
        return write_text(path, text)
    except OSError as e:
        raise output_error(e, path, "html") from None
