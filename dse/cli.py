"""The ``dse`` command (Typer): run, dry-run, validate, space, predict, parse, leaderboard, report, recipes.

User errors (:class:`dse.errors.UserError`) print one line and exit with code 2; nothing is written.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from dse.errors import InfrastructureError, UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Design-space exploration for NeMo / Megatron training recipes.")
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


def user_errors(fn: Callable) -> Callable:
    """Turn a UserError into one line on stderr and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            # escaped: messages quote TOML tables ("[search] trials"), which rich would take for markup
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except InfrastructureError as e:  # dse could not write (disk full...): one line, exit 1
            err_console.print(f"[bold red]error:[/] {escape(str(e))} (dse run --resume continues the study; a trial in flight "
                              "was not recorded and runs again)", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


@app.command("recipes")
@user_errors
def recipes_cmd() -> None:
    """List the recipes dse knows, with their architectures."""
    from rich.table import Table

    from recipes.models import RECIPES

    table = Table("recipe", "layers", "hidden", "heads", "groups", "ffn", "vocab", "mlp", "seq", "NeMo 2 recipe")
    for r in RECIPES.values():
        a = r.arch
        table.add_row(r.name, str(a.num_layers), str(a.hidden_size), str(a.num_attention_heads),
                      str(a.num_query_groups), str(a.ffn_hidden_size), str(a.vocab_size),
                      "gated" if a.gated_mlp else "plain", str(r.seq_length),
                      r.nemo2_recipe + (f" (scaled from {r.scaled_from})" if r.scaled_from else ""))
    console.print(table)


@app.command("run")
@user_errors
def run_cmd(
    space_file: Path = typer.Option(..., "--space", help="the space file (TOML)"),
    agent: Optional[str] = typer.Option(None, help="grid | random | optuna | guided (default: the space's [search].agent)"),
    sampler: Optional[str] = typer.Option(None, help="Optuna sampler: tpe, random, qmc, nsga2, gp, cmaes"),
    trials: Optional[int] = typer.Option(None, min=1, help="trial budget (default: the space's; grid: every valid point)"),
    seed: Optional[int] = typer.Option(None, help="seed for the agent and the simulated jitter"),
    backend: Optional[str] = typer.Option(None, help="sim | local | slurm (default: the space's [backend].kind)"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: runs/<space name>)"),
    resume: bool = typer.Option(False, "--resume", help="continue the study already in --out"),
    storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: sqlite file in --out)"),
    twin_seed: Optional[int] = typer.Option(None, "--twin-seed", min=0,
                                            help="simulated backend: measure on the twin truth of this seed "
                                                 "(sets [backend] truth = \"twin\", twin_seed = N)"),
    rebuild: bool = typer.Option(False, "--rebuild", help="with --resume: start anew a study whose database "
                                 "is empty or gone (the old run directories are set aside)"),
    gpu: Optional[str] = typer.Option(None, help="GPU generation for --space cloudai:FILE (CloudAI's files lack it)"),
    systems: Optional[str] = typer.Option(None, help="comma-separated systems (h100,b200,gb200): one sub-study "
                                          "each in --out/<system>, same GPU count, then `dse compare`"),
    warm_start: Optional[Path] = typer.Option(None, "--warm-start", help="a finished study: its best points that "
                                              "are valid here run first and seed the agent"),
    parallel: Optional[int] = typer.Option(None, "--parallel", min=1, max=1024,
                                           help="trials in flight at once (default: the space's [search] parallel, 1)"),
    worker: bool = typer.Option(False, "--worker", help="one of several dse run processes on this study (same --out "
                                "or --storage): each point is claimed in the storage before it runs"),
) -> None:
    """Run a design-space exploration: one trial per step until the budget or the space is exhausted."""
    if systems is not None:
        if worker:
            raise UserError("--worker shares one study between processes; --systems runs one study per system",
                            field="--worker")
        return _run_systems(space_file, systems, gpu=gpu, agent=agent, sampler=sampler, trials=trials, seed=seed,
                            backend=backend, out=out, resume=resume, storage=storage, twin_seed=twin_seed,
                            rebuild=rebuild, warm_start=warm_start, parallel=parallel)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dse.study import run_study

    space = with_twin(_load_space_arg(space_file, gpu), twin_seed)
    out_dir = out or Path("runs") / space.name
    if seed is not None and not 0 <= seed < 2**32:
        raise UserError(f"{seed} is out of range; a seed is an integer from 0 to {2**32 - 1}", field="--seed")
    seeds = _warm_start_seeds(space, warm_start)
    best = {"reward": None}
    # The bar starts with the first trial, so that an error before the study starts is the only line printed.
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[best]}"), console=err_console, transient=False)
    task = progress.add_task(f"{space.name}", total=None, best="")

    def on_trial(rec, done, budget):
        if not progress.live.is_started:
            progress.start()
        if rec.ok and (best["reward"] is None or rec.reward > best["reward"]):
            best["reward"] = rec.reward
        progress.update(task, completed=done, total=budget,
                        best=f"best {space.objective.metric}: {abs(best['reward']):.4g}" if best["reward"] is not None else "")

    from dse.study import Interrupted

    try:
        result = run_study(space, out_dir=out_dir, agent=agent, sampler=sampler, trials=trials, seed=seed,
                           backend=backend, resume=resume, storage=storage, rebuild=rebuild, on_trial=on_trial,
                           seeds=seeds, default_out=out is None, parallel=parallel, worker=worker)
    except Interrupted as e:
        progress.stop()
        err_console.print(f"interrupted: {e.saved} trials saved in {e.out_dir} ({e.interrupted} interrupted, run "
                          f"again by --resume); continue with: {resume_command(out_dir)}", highlight=False,
                          soft_wrap=True, markup=False)
        raise typer.Exit(130) from None
    finally:
        progress.stop()
    _print_summary(result.summary, list(space.knobs), top=10, objective=space.objective.metric)
    if result.stop_reason:
        console.print(result.stop_reason, highlight=False)
    console.print(f"{result.new_trials} new trials, {result.summary.n} in the study; "
                  f"leaderboard: {result.leaderboard}")


def resume_command(out_dir: Path) -> str:
    """The command line that continues this ``dse run``: as typed, with ``--out`` and ``--resume``."""
    import shlex

    args = list(sys.argv[1:])
    if "--out" not in args and not any(a.startswith("--out=") for a in args):
        args += ["--out", str(out_dir)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["dse", *args])


def with_twin(space, twin_seed: int | None):
    """``space`` with ``[backend] truth = "twin"`` and ``twin_seed`` set, when ``--twin-seed`` is given."""
    if twin_seed is None:
        return space
    return space.model_copy(update={"backend": space.backend.model_copy(update={"truth": "twin",
                                                                                "twin_seed": twin_seed})})


def _load_space_arg(space_file: Path, gpu: Optional[str]):
    """A space file, or ``cloudai:FILE.toml``: a CloudAI NeMoRun test imported on the fly (nothing written)."""
    from dse.space import load_space

    text = str(space_file)
    if text.startswith("cloudai:"):
        from dse.importers.cloudai import import_cloudai

        imported = import_cloudai(text.removeprefix("cloudai:"), gpu=gpu)
        for note in imported.not_imported:
            err_console.print(note.line(), highlight=False, soft_wrap=True)
        return imported.space
    if gpu is not None:
        raise UserError("--gpu is only for --space cloudai:FILE; a dse space names its system", field="--gpu")
    return load_space(space_file)


def _warm_start_seeds(space, study_dir: Optional[Path]) -> list:
    if study_dir is None:
        return []
    from dse.generations import warm_start_points

    seeds = warm_start_points(space, study_dir)
    err_console.print(f"warm start: {len(seeds)} points of {study_dir} are valid here and run first")
    return seeds


def _run_systems(space_file: Path, systems: str, *, gpu: Optional[str], out: Optional[Path], resume: bool,
                 storage: Optional[str], twin_seed: Optional[int], seed: Optional[int], **kwargs) -> None:
    """``dse run --systems``: one sub-study per system (dse.generations), then the comparison."""
    from dse.generations import parse_systems, run_generations

    if kwargs.get("rebuild") and not resume:
        raise UserError("--rebuild goes with --resume", field="--rebuild")
    if storage is not None:
        raise UserError("takes no --storage with --systems (each sub-study keeps its own SQLite file)", field="--storage")
    if seed is not None and not 0 <= seed < 2**32:
        raise UserError(f"{seed} is out of range; a seed is an integer from 0 to {2**32 - 1}", field="--seed")
    space = with_twin(_load_space_arg(space_file, gpu), twin_seed)
    names = parse_systems(systems)
    out_dir = out or Path("runs") / space.name

    def on_start(name, sub):
        err_console.print(f"[bold]{name}[/]: {sub.num_nodes} nodes x {sub.system.gpus_per_node} {sub.system.gpu} "
                          f"-> {out_dir / Path(name).stem}")

    results = run_generations(space, names, out_dir=out_dir, resume=resume, seed=seed, on_start=on_start, **kwargs)
    for name, r in zip(names, results):
        if r.stop_reason:  # an agent that stopped by itself says why, per system, as a single study does
            console.print(f"{Path(name).stem}: {r.stop_reason}", highlight=False)
    _print_comparison([r.out_dir for r in results], out_dir)


def _print_comparison(dirs, out_dir: Path) -> None:
    from rich.table import Table

    from dse import compare

    df, csv, page = compare.write(compare.gather(dirs), out_dir)
    cols = ["system", "gpu", "num_gpus", "tflops_per_gpu", "tokens_per_s", "speedup", "gpu_hours_per_1b_tokens",
            "cost_per_1b_tokens", "search_gpu_hours", "changed_knobs"]
    cols = [c for c in cols if df[c].notna().any()]  # no price in any system file: no cost column
    table = Table(title="best layout per generation")
    for c in cols:
        table.add_column(c, justify="left" if c in ("system", "gpu", "changed_knobs") else "right")
    for _, row in df.iterrows():
        table.add_row(*[_fmt(row[c]) for c in cols])
    console.print(table)
    console.print(f"comparison: {csv}, {page}")


@app.command("compare")
@user_errors
def compare_cmd(
    dirs: list[Path] = typer.Argument(..., help="study output directories; the first is the baseline"),
    out: Optional[Path] = typer.Option(None, help="where compare.csv and compare.html go (default: the first "
                                       "directory's parent)"),
) -> None:
    """Compare finished studies (one per GPU generation): best layouts, speed-up, GPU-hours, cost, changed knobs."""
    _print_comparison(dirs, out or Path(dirs[0]).resolve().parent)


# The summary's columns: (leaderboard column, short header used when the full names do not fit).
_SUMMARY_COLUMNS = {"trial": "#", "status": "status", "reward": "reward", "step_time_s": "step s",
                    "tflops_per_gpu": "TFLOP/s", "tokens_per_s_per_gpu": "tok/s/GPU", "peak_memory_gib": "mem GiB",
                    "gpu_hours": "GPU-h", "steps": "steps", "early_stopped": "early"}
# Dropped first when even short headers do not fit (the space's objective metric is never dropped).
_DROP_ORDER = ("early_stopped", "steps", "gpu_hours", "tokens_per_s_per_gpu", "peak_memory_gib", "step_time_s", "tflops_per_gpu")
_REASON_MIN = 16  # the reason column's narrowest useful width; the full reason is in leaderboard.csv


def _print_summary(records, knob_names, top: int, *, objective: str | None = None,
                   out: Console | None = None) -> None:
    """The top trials as a table fitted to the terminal's width, then the statuses counted.

    Values are never cut: when the table is too wide, headers are abbreviated first, then metric columns
    are dropped (early-stopped, steps, GPU-hours, tokens/s, memory, step time, TFLOP/s; never ``objective``), then knob columns from the
    last; a line names what is not shown. The reason column (why a trial failed) takes what width is
    left and is shortened with an ellipsis, the whole text being in ``leaderboard.csv``.
    """

    from rich.cells import cell_len
    from rich.table import Table

    from dse.leaderboard import frame

    from dse.leaderboard import Summary

    out = out or console
    summary = records if isinstance(records, Summary) else Summary.of(records, top)
    df = frame(summary.rows, knob_names).head(top)
    rows = [{c: _fmt(row[c]) for c in df.columns} for _, row in df.iterrows()]
    for r in rows:
        r["reason"] = _short_reason(r["reason"])
    shown_reason = any(r.get("reason") for r in rows)
    width = out.width

    def build(cols, short, reason_w):
        table = Table(title=f"top {len(df)} trials", show_lines=False)
        for c in cols:
            table.add_column(_SUMMARY_COLUMNS.get(c, c) if short else c, no_wrap=True,
                             justify="left" if c == "status" else "right")
        if shown_reason:
            table.add_column("reason", no_wrap=True, overflow="ellipsis", max_width=reason_w)
        for r in rows:
            table.add_row(*[r[c] for c in cols], *([r["reason"]] if shown_reason else []))
        return table

    def spare(cols, short):
        # rich squeezes a table that is too wide by cutting cells, whatever no_wrap says, so the
        # natural width is computed here: each cell's text, one space of padding each side, one rule
        # between columns and at both edges (the default box).
        heads = [_SUMMARY_COLUMNS.get(c, c) if short else c for c in cols]
        widths = [max([cell_len(h)] + [cell_len(r[c]) for r in rows]) for h, c in zip(heads, cols)]
        return width - (sum(widths) + 3 * len(widths) + 1) - (3 if shown_reason else 0)

    tail = ("gpu_hours", "steps", "early_stopped")
    cols = [*(c for c in _SUMMARY_COLUMNS if c not in tail), *knob_names, *tail]
    droppable = [c for c in _DROP_ORDER if c != objective and c in cols] + list(reversed(knob_names))
    dropped: list[str] = []
    short = False
    while spare(cols, short) < (_REASON_MIN if shown_reason else 0):
        if not short:
            short = True
        elif droppable:
            c = droppable.pop(0)
            cols.remove(c)
            dropped.append(c)
        else:
            break  # trial, status, reward and the objective: shown even when they overflow
    out.print(build(cols, short, max(spare(cols, short), _REASON_MIN)))
    if dropped:
        out.print(f"not shown: {', '.join(dropped)} (every column is in leaderboard.csv)", highlight=False)
    out.print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())))
    spent, to_best = summary.spent, summary.to_best
    out.print(f"launched runs: {summary.launched}; GPU-hours: {spent:,.1f} spent"
              + (f", {to_best:,.1f} to the best" if to_best is not None else "") + summary.savings_line(),
              highlight=False)


def _short_reason(reason: str) -> str:
    """A rejection's rule name ("layers_divisible: pp*vp = ..." -> "layers_divisible"); else the reason."""
    head, sep, _ = reason.partition(": ")
    return head if sep and head.isidentifier() else reason


def _fmt(v) -> str:
    import math

    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"  # 12345.6 as 12346, not 1.235e+04
    return str(v)


@app.command("leaderboard")
@user_errors
def leaderboard_cmd(
    out_dir: Path = typer.Argument(..., help="a dse run's output directory"),
    csv: Optional[Path] = typer.Option(None, "--csv", help="also write the whole table to this CSV file"),
    top: int = typer.Option(20, min=1, help="rows to show"),
) -> None:
    """Show the trials of a study ranked by reward (failures last); optionally export CSV."""
    from dse.leaderboard import Summary, checked_output, frame, write_csv
    from dse.store import READ_BATCH
    from dse.study import open_store

    if csv is not None:
        checked_output(csv, "--csv")  # a bad --csv is refused before the study is read
    store, meta = open_store(out_dir)
    knob_names = list(meta["knobs"])
    summary = Summary(top)
    try:  # one pass over the study, in batches: the summary keeps the top rows, the CSV its compact table
        if csv is not None:
            write_csv(frame(summary.feed(store.iter_records()), knob_names, batch=READ_BATCH), csv)
        else:
            for r in store.iter_records():
                summary.add(r)
    finally:
        store.close()
    if csv is not None:
        console.print(f"wrote {summary.n} rows to {csv}")
    _print_summary(summary, knob_names, top=top)


@app.command("validate")
@user_errors
def validate_cmd(files: list[Path] = typer.Argument(..., help="space files")) -> None:
    """Check space files: schema, knob names and values, recipe, system. Exit 2 on the first bad file."""
    from dse.space import load_space

    for f in files:
        s = load_space(f)
        console.print(f"[green]ok[/] {f}: {s.recipe} on {s.num_nodes} x {s.system.gpus_per_node} {s.system.gpu}, "
                      f"{len(s.knobs)} knobs, {s.size} points")


@app.command("space")
@user_errors
def space_cmd(
    space_file: Path = typer.Argument(..., help="a space file"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    twin_seed: Optional[int] = typer.Option(None, "--twin-seed", min=0,
                                            help="also print the twin truth of this seed: its step-time MAPE "
                                                 "against the model over the valid points"),
) -> None:
    """Count a space's raw and valid points, and the rejections by rule: exactly up to 100,000 raw points,
    estimated from 20,000 seeded uniform draws above (the output says which)."""
    import json

    from dse.counting import SAMPLES, count_valid
    from dse.space import WALK_LIMIT, load_space

    s = load_space(space_file)
    if twin_seed is not None and s.size > WALK_LIMIT:
        raise UserError(f"the twin is measured over every valid point; this space has {s.size:,} raw points "
                        f"(at most {WALK_LIMIT:,})", field="--twin-seed")
    if s.size > 10_000 and s.size <= WALK_LIMIT and not as_json:
        from rich.progress import Progress

        with Progress(console=err_console, transient=True) as bar:
            task = bar.add_task("counting valid points", total=s.size)
            count = count_valid(s, on_progress=lambda done, raw: bar.update(task, completed=done))
    else:
        if s.size > WALK_LIMIT and not as_json:
            err_console.print(f"{s.size:,} raw points (more than {WALK_LIMIT:,}): estimating the valid ones "
                              f"from {SAMPLES:,} seeded draws", highlight=False)
        count = count_valid(s)
    valid, by_rule = count.valid, count.by_rule
    data = {"space": s.name, "recipe": s.recipe, "gpu": s.system.gpu,
            "num_gpus": s.num_nodes * s.system.gpus_per_node, "knobs": {k: list(v) for k, v in s.knobs.items()},
            "raw": s.size, "valid": valid, "exact": count.exact, "rejected_by_rule": by_rule}
    if not count.exact:
        # JSON numbers are exact integers in Python's json; other readers may round them above 2^53
        data.update({"samples": count.samples, "valid_ci95": [count.valid_low, count.valid_high]})
    if twin_seed is not None:
        from dse.perfmodel import predict
        from dse.perfmodel.twin import make_twin, mape, valid_trials

        trials = valid_trials(s)
        twin = make_twin(s, twin_seed, trials=trials)
        fits = [t for t in trials if twin.predict(t).fits]
        data["twin"] = {"seed": twin_seed, "step_time_mape": mape(twin, trials), "layout_scale": twin.scale,
                        "memory_reserve_gib": twin.params.memory_reserve_gib,
                        "fit_on_twin": len(fits), "fit_in_model": sum(predict(t).fits for t in trials)}
    if as_json:
        print(json.dumps(data))
        return
    from rich.table import Table

    if count.exact:
        console.print(f"{s.name}: {s.recipe} on {data['num_gpus']} {s.system.gpu} GPUs; "
                      f"{s.size} raw points, [bold]{valid} valid[/]")
        table = Table("rule (first broken)", "rejected")
    else:
        console.print(f"{s.name}: {s.recipe} on {data['num_gpus']} {s.system.gpu} GPUs; {s.size:,} raw points, "
                      f"[bold]about {valid:,} valid[/] (estimated from {count.samples:,} seeded uniform draws; "
                      f"95% interval {count.valid_low:,} to {count.valid_high:,})", highlight=False)
        table = Table("rule (first broken)", f"rejected (of {count.samples:,} draws)")
    for rule, n in by_rule.items():
        table.add_row(rule, str(n))
    console.print(table)
    if "twin" in data:
        tw = data["twin"]
        console.print(f"twin seed {tw['seed']}: step-time MAPE {100 * tw['step_time_mape']:.1f}% against the model "
                      f"over the {valid} valid points; memory reserve {tw['memory_reserve_gib']:.1f} GiB; "
                      f"{tw['fit_on_twin']} points fit on the twin, {tw['fit_in_model']} in the model")


@app.command("report")
@user_errors
def report_cmd(
    out_dir: Path = typer.Argument(..., help="a dse run's output directory"),
    html_file: Optional[Path] = typer.Option(None, "--html", help="where to write (default: DIR/report.html)"),
) -> None:
    """Write the study's HTML report: best configuration, plots, leaderboard (self-contained)."""
    from dse import report
    from dse.study import open_store

    from dse.leaderboard import checked_output

    path = html_file or Path(out_dir) / "report.html"
    store, meta = open_store(out_dir)
    try:
        checked_output(path, "--html")  # a bad --html is refused before the study is read
        total = store.next_number()
        # one streamed pass; the page holds what it shows (report.render says what that is)
        path = report.write(store.iter_records(), meta, path, best=report.read_best(out_dir), total=total)
    finally:
        store.close()
    console.print(f"wrote {path} ({total} trials)")
@app.command("parse")
@user_errors
def parse_cmd(
    log: str = typer.Argument(..., help="the training log to read (log.txt, log.txt.gz), or a run directory",
                              show_default=False),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead of lines"),
    gbs: int | None = typer.Option(None, "--gbs", help="global batch size (for tokens/s/GPU)"),
    seq_length: int | None = typer.Option(None, "--seq-length", help="sequence length (for tokens/s/GPU)"),
    num_gpus: int | None = typer.Option(None, "--num-gpus", help="GPUs of the run (for tokens/s/GPU)"),
    exit_code: int | None = typer.Option(None, "--exit-code", help="the run's exit code, when known"),
    scheduler_state: str | None = typer.Option(None, "--scheduler-state",
                                                  help="Slurm's final state (COMPLETED, TIMEOUT, ...)"),
) -> None:
    """Read a training log: status, reason, steady-state step time, TFLOP/s/GPU, tokens/s/GPU, memory."""
    import json
    from pathlib import Path

    from dse.parse import ParseContext, parse_log

    from dse import logpack
    from dse.backends.scripts import run_log

    path = Path(log)
    source: Path | list[str] = path
    if path.is_dir():  # a run directory: its log (a simulated trial's is log.txt.gz)
        found = run_log(path)
        if found is None:
            raise UserError("holds no log.txt or log.txt.gz (give a run directory or a training log)", file=log)
        source = found
    elif not path.exists() and (packed := logpack.read(path)) is not None:
        source = packed.splitlines()  # a simulated trial whose run directory was packed (trials/logs-*.tar.xz)
    elif not path.is_file():
        raise UserError("no such log file (give the path of a training log)", file=log)
    m = parse_log(source, exit_code=exit_code, scheduler_state=scheduler_state,
                  context=ParseContext(gbs=gbs, seq_length=seq_length, num_gpus=num_gpus))
    d = m.to_dict()
    keys = ("status", "reason", "step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib",
            "steps", "loss")
    shown = {k: d[k] for k in keys} | {k: v for k, v in d.items() if k not in keys}
    if json_out:
        typer.echo(json.dumps(shown))
    else:
        for k in keys + ("partial", "step_time_mean_s", "step_time_p10_s", "step_time_p90_s", "log_format"):
            v = shown[k]
            text = json.dumps(v) if v is None or isinstance(v, bool) else f"{v:.6g}" if isinstance(v, float) else v
            typer.echo(f"{k}: {text}")


# Knobs that are not part of a layout's prediction (run length) or that a flag of their own covers.
_PREDICT_SKIP = ("num_nodes", "max_steps")


def _predict_options() -> list[inspect.Parameter]:
    """One option per catalogue knob (``--tp``, ``--fsdp/--no-fsdp``...), generated so that a new knob is a
    new flag with nothing else to write. Every default is None: unset knobs resolve as in a space."""
    from dse import knobs

    params = []
    for name, k in knobs.CATALOGUE.items():
        if name in _PREDICT_SKIP:
            continue
        flag = "--" + name.replace("_", "-")
        if k.kind == "bool":
            opt = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=k.help)
            ann: Any = Optional[bool]
        elif k.kind == "int":
            opt, ann = typer.Option(None, flag, help=k.help), Optional[int]
        else:
            allowed = f" ({', '.join(k.choices)})" if k.choices else ""
            opt, ann = typer.Option(None, flag, help=k.help + allowed), Optional[str]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
    return params


def _parse_set(items: list[str]) -> dict[str, Any]:
    """``--set knob=value`` pairs; values read as TOML literals (4, true, "x"), bare words as strings."""
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name:
            raise UserError(f"{item!r} is not knob=value", field="--set")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        out[name.strip()] = value
    return out


def predict_cmd(
    model: Optional[str] = None, model_file: Optional[str] = None, gpu: Optional[str] = None,
    system_ref: Optional[str] = None, gpus_per_node: Optional[int] = None, num_gpus: Optional[int] = None,
    set_: Optional[list[str]] = None, flops_convention: str = "causal", as_json: bool = False,
    calibration: Optional[str] = None, payload: str = "nemo2", **knob_flags: Any,
) -> None:
    """Predict step time, throughput and memory of one layout with the analytical performance model.

    Unset knobs resolve as in a space: catalogue defaults, then the recipe's layout for the GPU. ``--payload``
    is the space's ``[backend] payload``: what that payload's code does beyond the knobs (dse.perfmodel.stack).
    """
    # The layout resolves as a point of a one-point space does in `dse run`, is checked by the same rules and
    # predicted by the same call, so one layout has one prediction whichever command asks.
    import json

    from dse import knobs
    from dse.constraints import check
    from dse.errors import did_you_mean
    from dse.perfmodel import HARDWARE, predict
    from dse.perfmodel.trials import default_system, load_model_file
    from dse.space import Space, load_system
    from dse.trial import resolve
    from recipes.models import RECIPES, Recipe

    if (model is None) == (model_file is None):
        raise UserError("give exactly one of --model NAME and --model-file FILE", field="--model")
    if (gpu is None) == (system_ref is None):
        raise UserError("give exactly one of --gpu GEN and --system NAME|FILE", field="--gpu")
    if gpu is not None and gpu not in HARDWARE:
        raise UserError(f"{gpu!r} is not allowed{did_you_mean(gpu, HARDWARE)}; use one of {', '.join(HARDWARE)}",
                        field="--gpu")
    if flops_convention not in ("causal", "noncausal"):
        raise UserError(f"{flops_convention!r} is not allowed; use causal or noncausal", field="--flops-convention")
    from recipes.contract import PAYLOADS

    if payload not in PAYLOADS:
        raise UserError(f"{payload!r} is not allowed{did_you_mean(payload, PAYLOADS)}; use one of {', '.join(PAYLOADS)}",
                        field="--payload")
    system = default_system(gpu) if gpu is not None else load_system(system_ref)
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise UserError(f"{gpus_per_node} is out of range; give at least 1", field="--gpus-per-node")
        system = system.model_copy(update={"gpus_per_node": gpus_per_node})
    settings: dict[str, Any] = {}
    for name, value in knob_flags.items():
        if value is not None:
            flag = "--" + name.replace("_", "-")
            settings[name] = knobs.CATALOGUE[name].coerce(value, field=flag)
    for name, value in _parse_set(set_ or []).items():
        if name in _PREDICT_SKIP:
            raise UserError(f"{name} is not a layout knob here; use --num-gpus", field=f"--set {name}")
        settings[name] = knobs.get(name, field=f"--set {name}").coerce(value, field=f"--set {name}")
    if model is not None:
        recipe = RECIPES.get(model)
        if recipe is None:
            raise UserError(f"unknown recipe {model!r}{did_you_mean(model, RECIPES)}; see 'dse recipes'", field="--model")
    else:
        arch = load_model_file(model_file)
        if "seq_length" not in settings or num_gpus is None:
            raise UserError("--seq-length and --num-gpus are required with --model-file", field="--model-file")
        recipe = Recipe(arch.name, arch, "", None, settings["seq_length"], num_gpus)
    if num_gpus is not None and num_gpus < 1:
        raise UserError(f"{num_gpus} is out of range; give at least 1", field="--num-gpus")
    world = num_gpus if num_gpus is not None else recipe.num_gpus_default
    if world < 1 or world % system.gpus_per_node:
        raise UserError(f"{world} is not a multiple of the {system.gpus_per_node} GPUs per node of {system.name}",
                        field="--num-gpus")
    # A one-point space: the same resolve -> check -> predict as a study. A --model-file architecture is not
    # in the registry, so the space names a registered recipe and resolve() gets the architecture itself.
    space = Space.model_validate({"name": "predict", "recipe": recipe.name if model else next(iter(RECIPES)),
                                  "system": system, "num_nodes": world // system.gpus_per_node,
                                  "settings": settings, "source": "command line", "backend": {"payload": payload}})
    trial = resolve(space, {}, recipe=recipe)
    # Layout values the user did not pass but the recipe chose (vp = 8 for 405B on H100): named as such in
    # the output, and in an error whose reason mentions them, so a refusal points at the flag to pass.
    from_recipe = {k: trial.values[k] for k in knobs.recipe_layout_knobs()
                   if k not in settings and trial.values[k] != knobs.CATALOGUE[k].default}
    rejection = check(trial)
    if rejection is not None:
        named = [k for k in from_recipe if re.search(rf"\b{k}\b", rejection.reason)]
        hint = "".join(f"; {k} = {from_recipe[k]} (the recipe's default; pass --{k.replace('_', '-')})" for k in named)
        raise UserError(f"invalid layout ({rejection.rule}): {rejection.reason}{hint}")
    params = None
    if calibration is not None:
        from dse.calibrate import apply, load_calibration

        params = apply(load_calibration(calibration, gpu=system.gpu))
    pred = predict(trial, flops_convention=flops_convention, **({"params": params} if params else {}))
    if as_json:
        shown = {k: trial.values[k] for k in knobs.CATALOGUE if k not in _PREDICT_SKIP}
        out = {"model": recipe.name, "gpu": system.gpu, "system": system.name, "num_gpus": trial.num_gpus,
               "flops_convention": flops_convention, "calibration": calibration, "payload": payload, **shown, "sp": trial.sequence_parallel, "dp": trial.dp,
               "recipe_defaults": sorted(from_recipe), **pred.as_dict()}
        typer.echo(json.dumps(out, indent=2))
        return
    from rich.table import Table

    k = trial.layout
    table = Table("quantity", "value", title=f"{recipe.name} on {trial.num_gpus} x {system.gpu} ({k.precision}): "
                  f"tp={k.tp} pp={k.pp} cp={k.cp} vp={k.vp} dp={trial.dp} mbs={k.mbs} "
                  f"gbs={k.gbs} seq={k.seq_length} sp={trial.sequence_parallel} fsdp={k.fsdp} "
                  f"recompute={k.recompute} tp_comm_overlap={k.tp_comm_overlap}")
    table.add_row("step time", f"{pred.step_time_s:.3f} s")
    table.add_row("tokens/s/GPU", f"{pred.tokens_per_s_per_gpu:,.0f}")
    table.add_row(f"model TFLOP/s/GPU ({flops_convention})", f"{pred.tflops_per_gpu:.0f}")
    table.add_row("peak memory", f"{pred.peak_memory_gib:.1f} of {pred.gpu_memory_gib:.0f} GiB"
                  + ("" if pred.fits else "  [bold red]OOM[/]"))
    for key, value in pred.breakdown.items():
        table.add_row(f"  {key}", f"{value:.4g}")
    console.print(table)
    if from_recipe:
        console.print("not passed, the recipe's default: " + ", ".join(f"{k} = {v}" for k, v in from_recipe.items()),
                      highlight=False)


def _install_predict() -> None:
    """Register ``predict`` with its fixed options plus the generated knob flags (Typer reads the signature)."""
    from dse.hardware import GPU_NAMES
    fixed = [
        ("model", Optional[str], typer.Option(None, "--model", help="recipe name (see 'dse recipes')")),
        ("model_file", Optional[str], typer.Option(None, "--model-file", help="TOML architecture: name, num_layers, "
                                                   "hidden_size, num_attention_heads, num_query_groups, "
                                                   "ffn_hidden_size, vocab_size, gated_mlp [, activation: "
                                                   "fused | squared_relu] [, dropout: 0 <= p < 1]")),
        ("gpu", Optional[str], typer.Option(None, "--gpu", help="a GPU generation's default system: "
                                            + ", ".join(GPU_NAMES))),
        ("system_ref", Optional[str], typer.Option(None, "--system", help="a system as a space names it: a name "
                                                   "from conf/systems or a path to a system file")),
        ("gpus_per_node", Optional[int], typer.Option(None, "--gpus-per-node", help="override the system's GPUs per "
                                                      "node (e.g. 1 for a one-GPU run)")),
        ("num_gpus", Optional[int], typer.Option(None, "--num-gpus", help="world size (default: the recipe's)")),
        ("set_", Optional[list[str]], typer.Option(None, "--set", help="knob=value, any catalogue knob (repeatable)")),
        ("flops_convention", str, typer.Option("causal", "--flops-convention", help="causal or noncausal")),
        ("as_json", bool, typer.Option(False, "--json", help="print one JSON object")),
        ("calibration", Optional[str], typer.Option(None, "--calibration", help="a calibration file from "
                                                    "'dse calibrate' (parameters refitted to your runs)")),
        ("payload", str, typer.Option("nemo2", "--payload", help="the payload that would run it (a space's [backend] "
                                      "payload): nemo2, mbridge, mcore, sim; the model knows what its code does "
                                      "beyond the knobs (its loss, FP8 weights, gradient accumulation)")),
    ]
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a) for n, a, d in fixed]
    fn = user_errors(predict_cmd)
    fn.__signature__ = inspect.Signature(params + _predict_options())  # type: ignore[attr-defined]
    app.command("predict")(fn)


_install_predict()


@app.command("calibrate")
@user_errors
def calibrate_cmd(
    sources: list[str] = typer.Argument(..., help="study directories (dse.json + leaderboard.csv) or TSVs in the "
                                        "format of bench/data/h200_real_runs.tsv"),
    out: Path = typer.Option(..., "--out", help="calibration file to write (TOML)"),
    params: Optional[str] = typer.Option(None, "--params", help="comma-separated parameters to refit (default: "
                                         "the stack parameters the runs identify, and the memory offset)"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="the GPU the runs are on (required for a TSV without a "
                                      "gpu column; checked against the sources otherwise)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Refit the performance model to your own runs and write a calibration file for --calibration."""
    import json

    from dse.calibrate import calibrate, dumps
    from dse.perfmodel import HARDWARE

    if gpu is not None and gpu not in HARDWARE:
        raise UserError(f"{gpu!r} is not allowed; use one of {', '.join(HARDWARE)}", field="--gpu")
    names = [n.strip() for n in params.split(",") if n.strip()] if params else None
    cal, report = calibrate(sources, params=names, gpu=gpu)
    text = dumps(cal)
    tmp = out.with_name(out.name + ".tmp")  # never a half-written file
    tmp.write_text(text)
    tmp.replace(out)
    if as_json:
        typer.echo(json.dumps({"out": str(out), "gpu": cal.gpu, "runs": cal.runs, "sources": cal.sources,
                               "params": report, "fit": cal.fit, "leave_one_out": cal.loo}, indent=2))
        return
    from rich.table import Table

    table = Table("parameter", "shipped", "calibrated", "moved", title=f"dse calibrate: {cal.runs} runs on {cal.gpu}")
    for r in report:
        table.add_row(r["name"], f"{r['old']:.4g}", f"{r['new']:.4g}",
                      f"yes ({r['shift_sigma']:.1f} prior widths)" if r["moved"] else "no")
    console.print(table)

    def pct(v):
        return "-" if v is None else f"{v:.1f}%"
    b, a, lo = cal.fit["before"], cal.fit["after"], cal.loo or {}
    console.print(f"step-time MAPE {pct(b['step_time_mape'])} shipped -> {pct(a['step_time_mape'])} fitted, "
                  f"{pct(lo.get('step_time_mape'))} leave-one-out; peak memory {pct(b['memory_mape'])} -> "
                  f"{pct(a['memory_mape'])}, {pct(lo.get('memory_mape'))} leave-one-out", highlight=False)
    console.print(f"wrote {out}", highlight=False)


import_app = typer.Typer(no_args_is_help=True, help="Convert another tool's files into a dse space.")
app.add_typer(import_app, name="import")


@import_app.command("cloudai")
@user_errors
def import_cloudai_cmd(
    test_file: Path = typer.Argument(..., help="CloudAI NeMoRun test or test-scenario TOML"),
    system: Optional[Path] = typer.Option(None, "--system", help="CloudAI Slurm system TOML"),
    out: Path = typer.Option(..., "--out", help="the dse space to write (a system file goes beside it)"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU generation (CloudAI's files do not name it)"),
    test: Optional[str] = typer.Option(None, "--test", help="the [[Tests]] id to import from a scenario of several"),
) -> None:
    """Write a dse space (and with --system a dse system file) from CloudAI's NeMoRun test and Slurm system."""
    from dse.importers.cloudai import import_cloudai
    from dse.space import load_space

    imported = import_cloudai(test_file, system_path=system, gpu=gpu, out=out, test_id=test)
    # everything is built and validated before the first byte is written
    files = {out: imported.space_text}
    if imported.system_text is not None and imported.system_file:
        files[out.parent / imported.system_file] = imported.system_text
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.write_text(text)
    except OSError as e:
        raise UserError(f"cannot write: {e}", file=str(out)) from None
    try:
        space = load_space(out)  # the written file itself must load; if not, leave nothing behind
    except UserError:
        for path in files:
            path.unlink(missing_ok=True)
        raise
    for line in imported.defaults:
        console.print(f"CloudAI's default (the file leaves it out): {line}", highlight=False, soft_wrap=True)
    for note in imported.not_imported:
        console.print(note.line(), highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(map(str, files))}: {space.recipe} on {space.num_nodes} x "
                  f"{space.system.gpus_per_node} {space.system.gpu}, {len(space.knobs)} knobs, {space.size} points "
                  f"(CloudAI's list product: {imported.cloudai_points}); {len(imported.not_imported)} field(s) not imported")


@app.command("dry-run")
@user_errors
def dry_run_cmd(
    space: str = typer.Option(..., "--space", help="space file (TOML)"),
    backend: str = typer.Option("slurm", "--backend", help="slurm (sbatch scripts) or local (bash scripts)"),
    out: str = typer.Option(..., "--out", help="directory for the scripts (one folder per trial)"),
    limit: int | None = typer.Option(None, "--limit", help="write at most this many valid trials"),
) -> None:
    """Write each valid trial's launch script under --out and print a summary; nothing is submitted."""
    from pathlib import Path

    from rich.table import Table

    from dse.dryrun import dry_run
    from dse.space import load_space

    sp = load_space(space)
    result = dry_run(sp, backend, Path(out), limit)
    table = Table("trial", *sp.knob_names, "nodes x GPUs", "script", title=f"dse dry-run: {sp.name} ({backend})")
    for r in result.rows:
        table.add_row(f"{r.index:05d}", *(str(r.knobs.get(k)) for k in sp.knob_names),
                      f"{sp.num_nodes} x {sp.system.gpus_per_node}", str(r.script))
    console.print(table)
    for reason, count in result.rejected.most_common():
        console.print(f"[yellow]rejected[/] {count} x {reason}", highlight=False, soft_wrap=True)
    if result.stopped:
        console.print(result.stopped, highlight=False)
    n = len(result.rows)
    console.print(f"{n} {backend} script(s) written under {out}; {sum(result.rejected.values())} rejected; "
                  "nothing submitted.")


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"dse {version('dse')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print dse's version and exit"),
) -> None:
    """Design-space exploration for NeMo / Megatron training recipes."""


def _tidy_help() -> None:
    """Help that reads as written: Typer (0.29) shows ``<bool>`` for a flag and ``<list[Path]>`` for a list,
    and rich eats ``[search]`` in a help text as markup. Each option without a metavar gets one from its type
    (a flag none), each argument its name in capitals (Typer braces a required one in the usage line:
    ``{OUT_DIR}``), and brackets in help texts are escaped. Done once here over every command, so a new
    option gets it too."""
    import typing
    from pathlib import Path as _Path

    from rich.markup import escape
    from typer.models import ArgumentInfo, OptionInfo

    def name_of(ann) -> str:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if typing.get_origin(ann) in (list, tuple) and args:
            return name_of(args[0]) + "..."
        if args and typing.get_origin(ann) is not None:  # Optional[X], X | None
            return name_of(args[0])
        return {bool: "", int: "N", float: "X", _Path: "PATH", str: "TEXT"}.get(ann, "VALUE")

    # Typer's own --help and the app's --version are flags built outside the commands' signatures: a flag takes
    # no value, so its help shows no type (Typer 0.29 shows "<bool>"; this is display only, nothing is parsed
    # differently).
    from typer.core import TyperOption

    if not getattr(TyperOption.display_type_rich, "_dse_flag_aware", False):
        shown = TyperOption.display_type_rich

        def display_type_rich(self, ctx):
            return None if self.is_flag and self.metavar is None else shown(self, ctx)

        display_type_rich._dse_flag_aware = True
        TyperOption.display_type_rich = display_type_rich

    for cmd in app.registered_commands:
        try:
            hints = typing.get_type_hints(cmd.callback)
        except Exception:  # noqa: BLE001 - a signature Typer reads but get_type_hints cannot: leave it
            hints = {}
        for p in inspect.signature(cmd.callback).parameters.values():
            info = p.default
            if not isinstance(info, (OptionInfo, ArgumentInfo)):
                continue
            ann = hints.get(p.name, p.annotation)
            if info.metavar is None:
                if isinstance(info, ArgumentInfo):  # Typer adds "..." to a list and braces a required one
                    info.metavar = p.name.upper()
                else:
                    info.metavar = name_of(ann)
            if info.help:
                info.help = escape(info.help)


_tidy_help()
