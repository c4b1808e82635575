"""What the ``dse`` command prints on a terminal: the consoles, the one-line errors, and every rich table and
summary line. The command modules compute; this module alone decides how a result looks, so a change of
layout (or a test of it) touches one file.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rich.progress import Progress

console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


# C0 and C1 control characters but tab: a terminal acts on them (ESC starts a colour or a cursor move, CSI too).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def plain(text: str) -> str:
    """``text`` from a user's file made inert for the terminal: control characters spelled ``\\xNN`` and rich's
    markup escaped (a model named ``"\\x1b[2J"`` or ``"[red]x"`` prints as those characters, it does nothing)."""
    return escape(_CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text))


def error(message: str, *, resume: bool = False) -> None:
    """One line on stderr: ``error: message`` (with ``resume``, how to continue the study it stopped)."""
    # escaped: messages quote TOML tables ("[search] trials"), which rich would take for markup
    tail = (
        " (dse run --resume continues the study; a trial in flight was not recorded and runs again)" if resume else ""
    )
    err_console.print(f"[bold red]error:[/] {plain(message)}{tail}", highlight=False, soft_wrap=True)


def note(line: str) -> None:
    """A line on stderr that is not the command's result (an import note, a warm start): printed as written."""
    err_console.print(line, highlight=False, soft_wrap=True)


def fmt(v: Any) -> str:
    """A table cell: empty for a missing value, 4 significant digits, integers above 10^4 without exponent."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"  # 12345.6 as 12346, not 1.235e+04
    return str(v)


# -- dse run / dse leaderboard: the top trials fitted to the terminal ----------------------------------------

# The summary's columns: (leaderboard column, short header used when the full names do not fit).
_SUMMARY_COLUMNS = {
    "trial": "#",
    "status": "status",
    "reward": "reward",
    "step_time_s": "step s",
    "tflops_per_gpu": "TFLOP/s",
    "mfu": "MFU",
    "tokens_per_s_per_gpu": "tok/s/GPU",
    "peak_memory_gib": "mem GiB",
    "gpu_hours": "GPU-h",
    "steps": "steps",
    "early_stopped": "early",
}
# Dropped first when even short headers do not fit (the space's objective metric is never dropped).
_DROP_ORDER = (
    "early_stopped",
    "steps",
    "gpu_hours",
    "mfu",
    "tokens_per_s_per_gpu",
    "peak_memory_gib",
    "step_time_s",
    "tflops_per_gpu",
)
_TAIL = ("gpu_hours", "steps", "early_stopped")  # metric columns shown after the knobs
_REASON_MIN = 16  # the reason column's narrowest useful width; the full reason is in leaderboard.csv


def short_reason(reason: str) -> str:
    """A rejection's rule name ("layers_divisible: pp*vp = ..." -> "layers_divisible"); else the reason."""
    head, sep, _ = reason.partition(": ")
    return head if sep and head.isidentifier() else reason


class _SummaryTable:
    """The summary's rows as text, and the table they make with a given set of columns and headers."""

    def __init__(self, rows: list[dict[str, str]], title: str):
        self.rows, self.title = rows, title
        self.reason = any(r.get("reason") for r in rows)

    def spare(self, cols: list[str], short: bool, width: int) -> int:
        """The width left for the reason column. rich squeezes a table that is too wide by cutting cells,
        whatever no_wrap says, so the natural width is computed here: each cell's text, one space of padding
        each side, one rule between columns and at both edges (the default box)."""
        from rich.cells import cell_len

        heads = [_SUMMARY_COLUMNS.get(c, c) if short else c for c in cols]
        widths = [max([cell_len(h)] + [cell_len(r[c]) for r in self.rows]) for h, c in zip(heads, cols)]
        return width - (sum(widths) + 3 * len(widths) + 1) - (3 if self.reason else 0)

    def build(self, cols: list[str], short: bool, reason_w: int) -> Table:
        table = Table(title=self.title, show_lines=False)
        for c in cols:
            table.add_column(
                _SUMMARY_COLUMNS.get(c, c) if short else c, no_wrap=True, justify="left" if c == "status" else "right"
            )
        if self.reason:
            table.add_column("reason", no_wrap=True, overflow="ellipsis", max_width=reason_w)
        for r in self.rows:
            table.add_row(*[r[c] for c in cols], *([r["reason"]] if self.reason else []))
        return table


def _fit(table: _SummaryTable, knob_names: list[str], objective: str | None, width: int):
    """The columns that fit ``width``: headers abbreviated first, then metric columns dropped in
    :data:`_DROP_ORDER` (never ``objective``), then knob columns from the last. Returns (columns, short, dropped)."""
    cols = [*(c for c in _SUMMARY_COLUMNS if c not in _TAIL), *knob_names, *_TAIL]
    droppable = [c for c in _DROP_ORDER if c != objective and c in cols] + list(reversed(knob_names))
    dropped: list[str] = []
    short = False
    while table.spare(cols, short, width) < (_REASON_MIN if table.reason else 0):
        if not short:
            short = True
        elif droppable:
            c = droppable.pop(0)
            cols.remove(c)
            dropped.append(c)
        else:
            break  # trial, status, reward and the objective: shown even when they overflow
    return cols, short, dropped


def print_summary(records, knob_names, top: int, *, objective: str | None = None, out: Console | None = None) -> None:
    """The top trials as a table fitted to the terminal's width, then the statuses counted.

    Values are never cut: when the table is too wide, headers are abbreviated first, then metric columns
    are dropped (early-stopped, steps, GPU-hours, tokens/s, memory, step time, TFLOP/s; never ``objective``),
    then knob columns from the last; a line names what is not shown. The reason column (why a trial failed)
    takes what width is left and is shortened with an ellipsis, the whole text being in ``leaderboard.csv``.
    A summary that knows its study's provenance ends with where the figures come from (simulated: the model's).
    """
    from dse.study.leaderboard import SIMULATED_NOTE, Summary, frame

    out = out or console
    summary = records if isinstance(records, Summary) else Summary.of(records, top)
    df = frame(summary.rows, knob_names).head(top)
    rows = [{c: fmt(row[c]) for c in df.columns} for _, row in df.iterrows()]
    for r in rows:
        r["reason"] = short_reason(r["reason"])
    table = _SummaryTable(rows, f"top {len(df)} trials")
    cols, short, dropped = _fit(table, list(knob_names), objective, out.width)
    out.print(table.build(cols, short, max(table.spare(cols, short, out.width), _REASON_MIN)))
    if dropped:
        out.print(f"not shown: {', '.join(dropped)} (every column is in leaderboard.csv)", highlight=False)
    out.print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())))
    out.print(summary.runs_line(), highlight=False)
    if line := summary.baseline_line():
        out.print(f"baseline: {line}", highlight=False)
    if line := summary.model_line():
        out.print(line, highlight=False)
    if (p := summary.provenance) is not None:
        out.print(f"{SIMULATED_NOTE} ({p.describe()})" if p.simulated else f"measured: {p.describe()}", highlight=False)


def trial_progress(name: str, objective: str) -> tuple[Progress, Callable]:
    """The progress bar of ``dse run`` on stderr, and the ``on_trial(record, done, budget, best)`` that moves it
    (``best``: the study's best value of the objective, resumed trials included, as the summary's cells show it).

    The bar starts with the first trial, so that an error before the study starts is the only line printed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[best]}"),
        console=err_console,
        transient=False,
    )
    task = progress.add_task(name, total=None, best="")

    def on_trial(rec, done, budget, best):
        if not progress.live.is_started:
            progress.start()
        progress.update(
            task,
            completed=done,
            total=budget,
            best=f"best {objective}: {fmt(best)}" if best is not None else "",
        )

    return progress, on_trial


def run_result(result, knob_names: list[str], objective: str) -> None:
    """After ``dse run``: the summary, why the agent stopped (when it did), the counts and the leaderboard."""
    print_summary(result.summary, knob_names, top=10, objective=objective)
    if result.stop_reason:
        console.print(result.stop_reason, highlight=False)
    console.print(f"{result.new_trials} new trials, {result.summary.n} in the study; leaderboard: {result.leaderboard}")


def interrupted(e, resume: str) -> None:
    """Ctrl-C during ``dse run``: what was saved and the command line that continues."""
    err_console.print(
        f"interrupted: {e.saved} trials saved in {e.out_dir} ({e.interrupted} interrupted, run "
        f"again by --resume); continue with: {resume}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )


def system_count(name: str, count) -> None:
    """``dse run --systems``, before any study: one system's raw and valid points and the first rules broken."""
    valid = f"{count.valid:,} valid" if count.exact else f"about {count.valid:,} valid ({count.samples:,} draws)"
    rules = f"; removed by {count.rules_line()}" if count.by_rule else ""
    err_console.print(f"{plain(name)}: {count.raw:,} raw points, {valid}{rules}", highlight=False, soft_wrap=True)


def sub_study(name: str, sub, out: Path) -> None:
    """``dse run --systems``: the line that starts one system's sub-study."""
    err_console.print(f"[bold]{name}[/]: {sub.num_nodes} nodes x {sub.system.gpus_per_node} {sub.system.gpu} -> {out}")


def comparison(df, csv: Path, page: Path) -> None:
    """``dse compare`` (and the end of ``dse run --systems``): the best layout per generation."""
    cols = [
        "system",
        "gpu",
        "num_gpus",
        "tflops_per_gpu",
        "tokens_per_s",
        "speedup",
        "gpu_hours_per_1b_tokens",
        "cost_per_1b_tokens",
        "search_gpu_hours",
        "backend",
        "changed_knobs",
    ]
    cols = [c for c in cols if df[c].notna().any()]  # no price in any system file: no cost column
    table = Table(title="best layout per generation")
    for c in cols:
        table.add_column(c, justify="left" if c in ("system", "gpu", "changed_knobs") else "right")
    for _, row in df.iterrows():
        table.add_row(*[fmt(row[c]) for c in cols])
    console.print(table)
    line(f"figures: {figures_source(df)}")
    for system, gain in zip(df.system, df.get("recipe_layout_gain", [])):
        if isinstance(gain, str) and gain:
            line(f"baseline of {system}: {gain}")
    for study, warning in zip(df.study, df.warning):
        if isinstance(warning, str) and warning:
            note(f"warning: {study}: {warning}")
    console.print(f"comparison: {csv}, {page}")


def figures_source(df) -> str:
    """Where a comparison's figures come from, per study: measured, or predicted by the model (simulated)."""
    simulated = [isinstance(t, str) and bool(t) for t in df["truth"]]
    names = [str(s) for s in df.system]
    if not any(simulated):
        return "measured"
    if all(simulated):
        return "predicted (simulated by the model), not measured"
    sim = ", ".join(n for n, x in zip(names, simulated) if x)
    real = ", ".join(n for n, x in zip(names, simulated) if not x)
    return f"measured for {real}; predicted (simulated by the model) for {sim}"


def line(text: str, **kw: Any) -> None:
    """One line of a command's result on stdout, printed as written (no highlighting)."""
    console.print(text, highlight=False, **kw)


def probes(rows: list[dict], csv_path: Path) -> None:
    """``dse probe``'s result: one line per probed rank, measured (the probe) beside predicted (the model)."""
    table = Table(title="probes (measured: one rank under a fake process group; model: predicted, the worst rank)")
    for col in ("point", "rank", "stage", "why", "status", "peak GiB", "model GiB", "step s", "GPU-min"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["point"]),
            f"{r['rank']}/{r['world']}",
            str(r["stage"]),
            r["why"],
            r["status"],
            fmt(r["peak_memory_gib"]),
            fmt(r["model_peak_memory_gib"]),
            fmt(r["step_time_s"]),
            fmt(r["gpu_minutes"]),
        )
    console.print(table)
    total = sum(r["gpu_minutes"] for r in rows)
    line(f"{len(rows)} probes, {total:.2f} GPU-minutes (measured); {csv_path}")


# -- dse recipes / predict / calibrate ---------------------------------------------------------------------


def recipes(recipes_) -> None:
    """``dse recipes``: one row per recipe with its architecture."""
    table = Table("recipe", "layers", "hidden", "heads", "groups", "ffn", "vocab", "mlp", "seq", "NeMo 2 recipe")
    for r in recipes_:
        a = r.arch
        table.add_row(
            r.name,
            str(a.num_layers),
            str(a.hidden_size),
            str(a.num_attention_heads),
            str(a.num_query_groups),
            str(a.ffn_hidden_size),
            str(a.vocab_size),
            "gated" if a.gated_mlp else "plain",
            str(r.seq_length),
            r.nemo2_recipe + (f" (scaled from {r.scaled_from})" if r.scaled_from else ""),
        )
    console.print(table)


def prediction(
    trial, system, pred, flops_convention: str, from_recipe: dict[str, Any], dropped: Sequence[str] = ()
) -> None:
    """``dse predict``: the layout in the title, the predicted quantities, the model's breakdown, and the recipe
    defaults dropped because they conflicted with the layout given."""
    t = trial
    k = t.layout
    table = Table(
        "quantity",
        "value",
        title=f"{plain(t.recipe.name)} on {t.num_gpus} x {system.gpu} ({k.precision}): "
        f"tp={k.tp} pp={k.pp} cp={k.cp} vp={k.vp} dp={t.dp} mbs={k.mbs} "
        f"gbs={k.gbs} seq={k.seq_length} sp={t.sequence_parallel} fsdp={k.fsdp} "
        f"recompute={k.recompute} tp_comm_overlap={k.tp_comm_overlap}",
    )
    table.add_row("step time", f"{pred.step_time_s:.3f} s")
    table.add_row("tokens/s/GPU", f"{pred.tokens_per_s_per_gpu:,.0f}")
    table.add_row(f"model TFLOP/s/GPU ({flops_convention})", f"{pred.tflops_per_gpu:.0f}")
    table.add_row(
        "peak memory",
        f"{pred.peak_memory_gib:.1f} of {pred.gpu_memory_gib:.0f} GiB" + ("" if pred.fits else "  [bold red]OOM[/]"),
    )
    for key, value in pred.breakdown.items():
        table.add_row(f"  {key}", f"{value:.4g}")
    console.print(table)
    if from_recipe:
        line("not passed, the recipe's default: " + ", ".join(f"{k} = {v}" for k, v in from_recipe.items()))
    for note in dropped:
        line(note)


def calibration(cal, report: list[dict], out: Path) -> None:
    """``dse calibrate``: each parameter shipped and refitted, the fit's error before, after and left out."""
    table = Table("parameter", "shipped", "calibrated", "moved", title=f"dse calibrate: {cal.runs} runs on {cal.gpu}")
    for r in report:
        table.add_row(
            r["name"],
            f"{r['old']:.4g}",
            f"{r['new']:.4g}",
            f"yes ({r['shift_sigma']:.1f} prior widths)" if r["moved"] else "no",
        )
    console.print(table)

    def pct(v):
        return "-" if v is None else f"{v:.1f}%"

    probes = cal.fit.get("probes") or []
    if probes:
        t = Table(
            "probe",
            "stage",
            "peak GiB measured",
            "model",
            "fitted",
            "step s measured",
            "model",
            "fitted",
            title="probes against the model's figure of their stage (predicted; step: the stage's compute alone)",
        )

        def num(v, fmt):
            return "-" if v is None else format(v, fmt)

        for r in probes:
            t.add_row(
                r["probe"],
                r["stage"],
                "oom" if r["oom"] else num(r["peak_memory_gib"], ".2f"),
                num(r["model_peak_memory_gib"], ".2f"),
                num(r["fitted_peak_memory_gib"], ".2f"),
                num(r["step_time_s"], ".3f"),
                num(r["model_step_time_s"], ".3f"),
                num(r["fitted_step_time_s"], ".3f"),
            )
        console.print(t)

    b, a, lo = cal.fit["before"], cal.fit["after"], cal.loo or {}
    line(
        f"step-time MAPE {pct(b['step_time_mape'])} shipped -> {pct(a['step_time_mape'])} fitted, "
        f"{pct(lo.get('step_time_mape'))} leave-one-out; peak memory {pct(b['memory_mape'])} -> "
        f"{pct(a['memory_mape'])}, {pct(lo.get('memory_mape'))} leave-one-out"
    )
    line(f"wrote {out}")


# -- dse validate / space / dry-run ------------------------------------------------------------------------


def validated(path: Path, s) -> None:
    """``dse validate``: one ``ok`` line per good file."""
    console.print(
        f"[green]ok[/] {path}: {s.recipe} on {s.num_nodes} x {s.system.gpus_per_node} {s.system.gpu}, "
        f"{len(s.knobs)} knobs, {s.size} points"
    )


def space_count(s, data: dict, count, cost=None) -> None:
    """``dse space``: raw and valid points (exact or estimated), the rejections by rule, the twin's error."""
    valid = data["valid"]
    if count.exact:
        console.print(
            f"{s.name}: {s.recipe} on {data['num_gpus']} {s.system.gpu} GPUs; "
            f"{s.size} raw points, [bold]{valid} valid[/]"
        )
        table = Table("rule (first broken)", "rejected")
    else:
        console.print(
            f"{s.name}: {s.recipe} on {data['num_gpus']} {s.system.gpu} GPUs; {s.size:,} raw points, "
            f"[bold]about {valid:,} valid[/] (estimated from {count.samples:,} seeded uniform draws; "
            f"95% interval {count.valid_low:,} to {count.valid_high:,})",
            highlight=False,
        )
        table = Table("rule (first broken)", f"rejected (of {count.samples:,} draws)")
    for rule, n in data["rejected_by_rule"].items():
        table.add_row(rule, str(n))
    console.print(table)
    if count.exact and not valid:  # dse validate and dse run refuse it with this line
        note(plain(count.empty_reason()))
    if "twin" in data:
        tw = data["twin"]
        console.print(
            f"twin seed {tw['seed']}: step-time MAPE {100 * tw['step_time_mape']:.1f}% against the model "
            f"over the {valid} valid points; memory reserve {tw['memory_reserve_gib']:.1f} GiB; "
            f"{tw['fit_on_twin']} points fit on the twin, {tw['fit_in_model']} in the model"
        )
    if cost is not None:
        study_cost(s, cost)


def study_cost(s, cost) -> None:
    """The forecast cost of a study (a :class:`dse.forecast.StudyCost`; ``dse space``, the first lines of
    ``dse run``): GPU-hours, launched runs, the points the memory screen removes."""
    about = "" if cost.exact else "about "
    if s.search.screen == "none":
        screen = "memory screen off"
    elif s.search.screen == "probe":
        screen = (
            f"probe screen: each point probed on one GPU before its launch (the model predicts {about}"
            f"{cost.screened:,} of {about}{cost.points:,} valid points beyond the GPU's memory)"
        )
    else:
        screen = (
            f"memory screen: {about}{cost.screened:,} of {about}{cost.points:,} valid points predicted "
            f"beyond the GPU's memory + {100 * s.search.screen_margin:.0f}%, never launched"
        )
    runs = (
        f"budget {cost.runs:,} runs x {cost.median_run:,.1f} GPU-hours (median predicted run, start-up included)"
        if cost.budget is not None
        else f"{about}{cost.runs:,} runs (every valid point the screen keeps)"
    )
    console.print(
        f"predicted cost: {about}{cost.gpu_hours:,.0f} GPU-hours, {runs}; {screen}", highlight=False, soft_wrap=True
    )


def counting_progress(total: int):
    """A transient bar on stderr while ``dse space`` walks a large space: (context manager, on_progress)."""
    from rich.progress import Progress

    bar = Progress(console=err_console, transient=True)
    task = bar.add_task("counting valid points", total=total)
    return bar, (lambda done, raw: bar.update(task, completed=done))


def calibrate_progress():
    """A transient bar on stderr while ``dse calibrate`` fits and refits leaving each run out, quiet when stderr is
    not a terminal: (context manager, on_progress(done, total))."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    )
    task = bar.add_task("fitting", total=None)

    def on_progress(done: int, total: int) -> None:
        what = "fitting" if done < 1 else "leave-one-out refits"
        bar.update(task, description=what, completed=done, total=total)

    return bar, on_progress


DRY_RUN_SHOWN = 50  # rows of the dry run's table on the terminal; index.csv lists every folder


def dry_run(sp, backend: str, out: str, result) -> None:
    """``dse dry-run``: one row per script written with the model's forecast (peak memory against the GPU's,
    fit, step time), the rejections counted, what was not written."""
    table = Table(
        "trial",
        *sp.knob_names,
        "nodes x GPUs",
        "peak / GPU GiB",
        "fits",
        "step s",
        "script",
        title=f"dse dry-run: {sp.name} ({backend})",
    )
    for r in result.rows[:DRY_RUN_SHOWN]:
        f = r.forecast
        table.add_row(
            f"{r.index:05d}",
            *(str(r.knobs.get(k)) for k in sp.knob_names),
            f"{sp.num_nodes} x {sp.system.gpus_per_node}",
            f"{f.peak_memory_gib:.1f} / {f.memory_gib:.0f}" if f else "",
            ("screened" if f.screened else "yes" if f.fits else "no") if f else "",
            f"{f.step_time_s:.2f}" if f else "",
            str(r.script),
        )
    console.print(table)
    if len(result.rows) > DRY_RUN_SHOWN:
        line(f"... and {len(result.rows) - DRY_RUN_SHOWN:,} more folders, every one in {result.index}")
    for reason, count in result.rejected.most_common():
        console.print(f"[yellow]rejected[/] {count} x {reason}", highlight=False, soft_wrap=True)
    if result.stopped:
        line(result.stopped)
    if result.not_fitting:
        line(f"{result.not_fitting} valid point(s) predicted beyond the GPU's memory left out (--only-fitting)")
    console.print(
        f"{len(result.rows)} {backend} script(s) written under {out}; {sum(result.rejected.values())} "
        "rejected; nothing submitted."
    )
    line(
        f"each folder runs as written (its payload in code/); index of the folders (knob values, predicted memory "
        f"and step time): {result.index}",
        soft_wrap=True,
    )
    if result.screened:
        console.print(
            f"{result.screened} of the points written are predicted beyond the GPU's memory by more than the "
            f"{100 * sp.search.screen_margin:.0f}% margin: a study screens them (launches none of them)",
            highlight=False,
        )


def imported(files, space, imp) -> None:
    """``dse import cloudai``: CloudAI's defaults the file left out, what was not imported, what was written."""
    for default in imp.defaults:
        line(f"CloudAI's default (the file leaves it out): {default}", soft_wrap=True)
    for n in imp.not_imported:
        line(n.line(), soft_wrap=True)
    console.print(
        f"wrote {', '.join(map(str, files))}: {space.recipe} on {space.num_nodes} x "
        f"{space.system.gpus_per_node} {space.system.gpu}, {len(space.knobs)} knobs, {space.size} points "
        f"(CloudAI's list product: {imp.cloudai_points}); {len(imp.not_imported)} field(s) not imported"
    )


def episode_progress(total: int) -> tuple[Progress, Callable]:
    """The progress bar of ``dse bench-agents`` on stderr, and the ``on_episode(episode)`` that moves it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]episodes"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[now]}"),
        console=err_console,
        transient=False,
    )
    task = progress.add_task("episodes", total=total, now="")
    progress.start()

    def on_episode(ep) -> None:
        progress.update(task, advance=1, now=plain(f"{ep.benchmark} {ep.agent}"))

    return progress, on_episode


def leaderboard_page(table: str, command: str, seconds: float) -> str:
    """The agent leaderboard as a Markdown page: what it measures, the table, and the command that wrote it, with
    the Optuna release that ran TPE (its draws for a seed change between releases, so the TPE rows reproduce only
    with the same one; every other agent's episodes depend on dse alone)."""
    from importlib.metadata import version

    return (
        "<!-- generated by dse bench-agents: do not edit; run the command below -->\n"
        "# The agent leaderboard\n\n"
        "Every agent searches each benchmark's twins through the environment (`dse/Recipe-v0`): each proposal is one "
        "step, a refused proposal launches nothing but counts against the episode's proposals, a launched run costs "
        "its GPU-hours. Runs (and GPU-hours) until the best found first reaches 99% of the twin's true best; an "
        "episode that never does counts as more than the budget (`>B`). Brackets: 95% percentile-bootstrap "
        "intervals over the episodes (twins and seeds). Every figure is measured: on simulated twins, or, for a replay "
        "benchmark, on the recorded outcomes of real runs (its target the best measured).\n\n"
        f"{table}\n"
        f"Written by `{command}` ({seconds:.0f} s; TPE: Optuna {version('optuna')}).\n"
    )
