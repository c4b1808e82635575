"""What a study or a run left behind: ``dse leaderboard``, ``dse report``, ``dse compare`` and ``dse parse``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import typer

from dse.cli import render
from dse.errors import UserError


def leaderboard_cmd(
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="a dse run's output directory"),
    csv: Path | None = typer.Option(None, "--csv", metavar="PATH", help="also write the whole table to this CSV file"),
    top: int = typer.Option(20, min=1, metavar="N", help="rows to show"),
) -> None:
    """Show the trials of a study ranked by reward (failures last); optionally export CSV."""
    from dse.study.leaderboard import (
        Baseline,
        ProbeCost,
        Provenance,
        Summary,
        checked_output,
        frame,
        relative_run_dirs,
        write_csv,
    )
    from dse.study.loop import open_store
    from dse.study.store import READ_BATCH

    if csv is not None:
        checked_output(csv, "csv")  # a bad --csv is refused before the study is read
    store, meta = open_store(out_dir)
    knob_names = list(meta["knobs"])
    summary = Summary(top, Provenance.of_meta(meta), Baseline.of_meta(meta), ProbeCost.of_meta(meta))
    try:  # one pass over the study, in batches: the summary keeps the top rows, the CSV its compact table
        if csv is not None:
            rows = summary.feed(store.iter_records())
            table = frame(rows, knob_names, batch=READ_BATCH, provenance=summary.provenance)
            write_csv(relative_run_dirs(table, out_dir), csv)
        else:
            for r in store.iter_records():
                summary.add(r)
    finally:
        store.close()
    if csv is not None:
        render.console.print(f"wrote {summary.n} rows to {csv}")
    render.print_summary(summary, knob_names, top=top)


def report_cmd(
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="a dse run's output directory"),
    html_file: Path | None = typer.Option(
        None, "--html", metavar="PATH", help="where to write (default: DIR/report.html)"
    ),
) -> None:
    """Write the study's HTML report: best configuration, plots, leaderboard (self-contained)."""
    from dse.results import report
    from dse.study.leaderboard import checked_output
    from dse.study.loop import open_store

    path = html_file or Path(out_dir) / "report.html"
    store, meta = open_store(out_dir)
    try:
        checked_output(path, "html")  # a bad --html is refused before the study is read
        total = store.next_number()
        # one streamed pass; the page holds what it shows (report.render says what that is)
        path = report.write(store.iter_records(), meta, path, best=report.read_best(out_dir), total=total)
    finally:
        store.close()
    render.console.print(f"wrote {path} ({total} trials)")


def compare_cmd(
    dirs: list[Path] = typer.Argument(..., metavar="DIRS", help="study output directories; the first is the baseline"),
    out: Path | None = typer.Option(
        None, metavar="PATH", help="where compare.csv and compare.html go (default: the first directory's parent)"
    ),
    allow_different_recipes: bool = typer.Option(
        False,
        "--allow-different-recipes",
        help="compare studies of different recipes (models) too; their rows carry a warning",
    ),
) -> None:
    """Compare finished studies (one per GPU generation): best layouts, speed-up, GPU-hours, cost, changed knobs."""
    from dse.results import compare

    studies = compare.gather(dirs, allow_different_recipes=allow_different_recipes)
    render.comparison(*compare.write(studies, out or Path(dirs[0]).resolve().parent))


_PARSE_KEYS = (
    "status",
    "reason",
    "step_time_s",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "peak_memory_gib",
    "steps",
    "loss",
)


def parse_cmd(
    log: str = typer.Argument(
        ...,
        metavar="LOG",
        show_default=False,
        help="the training log to read (log.txt, log.txt.gz), a run directory, or a study directory (its best trial)",
    ),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead of lines"),
    gbs: int | None = typer.Option(None, "--gbs", metavar="N", help="global batch size (for tokens/s/GPU)"),
    seq_length: int | None = typer.Option(None, "--seq-length", metavar="N", help="sequence length (for tokens/s/GPU)"),
    num_gpus: int | None = typer.Option(None, "--num-gpus", metavar="N", help="GPUs of the run (for tokens/s/GPU)"),
    exit_code: int | None = typer.Option(None, "--exit-code", metavar="N", help="the run's exit code, when known"),
    scheduler_state: str | None = typer.Option(
        None, "--scheduler-state", metavar="TEXT", help="Slurm's final state (COMPLETED, TIMEOUT, ...)"
    ),
) -> None:
    """Read a training log: status, reason, steady-state step time, TFLOP/s/GPU, tokens/s/GPU, memory.

    A trial directory of a study takes its batch, sequence length and GPUs from the study's dse.json (the
    flags override them); without --exit-code or --scheduler-state the exit code is unknown and the verdict
    is what ended the log."""
    from dse.logs.parse import ParseContext, parse_log

    log, notes = _study_log(log)
    sizes, note = _study_sizes(log)
    given = {"gbs": gbs, "seq_length": seq_length, "num_gpus": num_gpus}
    context = {k: v if v is not None else sizes.get(k) for k, v in given.items()}
    if exit_code is None and scheduler_state is None:
        notes.append("exit code unknown (no --exit-code or --scheduler-state): judged by what ended the log")
    m = parse_log(
        _log_source(log), exit_code=exit_code, scheduler_state=scheduler_state, context=ParseContext(**context)
    )
    d = {k: _rounded(v) for k, v in m.to_dict().items()}
    shown = {k: d[k] for k in _PARSE_KEYS} | {k: v for k, v in d.items() if k not in _PARSE_KEYS}
    shown |= {"exit_code": exit_code, "scheduler_state": scheduler_state}
    notes += [note] if note and any(given[k] is None and sizes.get(k) is not None for k in given) else []
    if json_out:
        typer.echo(json.dumps(shown | {"notes": notes}))
        return
    keys = _PARSE_KEYS + ("partial", "step_time_mean_s", "step_time_p10_s", "step_time_p90_s", "log_format")
    for k in (*keys, "exit_code", "scheduler_state"):
        v = shown[k]
        text = json.dumps(v) if v is None or isinstance(v, bool) else f"{v:.6g}" if isinstance(v, float) else v
        typer.echo(f"{k}: {text}")
    for n in notes:
        typer.echo(f"note: {n}")


def _log_source(log: str) -> Path | Iterator[str]:
    """What ``dse parse LOG`` reads: a log file, a run directory's log, or a packed simulated trial's lines."""
    from dse.backends.scripts import run_log
    from dse.logs import logpack

    path = Path(log)
    if path.is_dir():  # a run directory: its log (a simulated trial's is log.txt.gz)
        found = run_log(path)
        if found is None:
            raise UserError("holds no log.txt or log.txt.gz (give a run directory or a training log)", file=log)
        return found
    if not path.exists() and (packed := logpack.lines(path)) is not None:
        return packed  # a simulated trial whose run directory was packed (trials/logs-*.tar.xz), streamed
    if not path.is_file():
        raise UserError("no such log file (give the path of a training log)", file=log)
    return path


SIGNIFICANT = 6  # digits of a figure in `dse parse` output, text and JSON alike


def _rounded(v):
    """A float to :data:`SIGNIFICANT` significant digits, the precision of the logged figures it comes from
    (a mean of logged step times prints 4.206, not 4.2059999999999995); anything else as it is."""
    return float(f"{v:.{SIGNIFICANT}g}") if isinstance(v, float) else v


def _study_log(log: str) -> tuple[str, list[str]]:
    """``log``, or for a study directory (it holds ``dse.json``) its best trial's run directory, with a note
    saying so; a study without a best is a one-line error."""
    from dse.study.best import BEST_DIR
    from dse.study.outdir import META

    study = Path(log)
    if not (study / META).is_file():
        return log, []
    best = study / BEST_DIR / "best.json"
    try:
        run_dir = json.loads(best.read_text()).get("run_dir")
    except (OSError, ValueError, AttributeError):
        run_dir = None
    if not isinstance(run_dir, str):
        raise UserError("is a study directory without a best trial; give one of its trials/NNNNN", file=log)
    return str(study / run_dir), [f"the study's best trial: {run_dir}"]


def _study_sizes(log: str) -> tuple[dict[str, int], str | None]:
    """The global batch size, sequence length and GPUs of a trial directory's run (``STUDY/trials/NNNNN``)
    from the study's ``dse.json`` and the trial's knobs in its store; ({}, None) for a log outside a study."""
    from dse.study.outdir import META, read_meta

    path = Path(log).absolute()
    study = path.parent.parent
    if not (path.name.isdigit() and path.parent.name == "trials" and (study / META).is_file()):
        return {}, None
    meta = read_meta(study)
    knobs = _trial_knobs(study, int(path.name))
    by_precision = meta.get("sizes") or {}
    precision = knobs.get("precision", next(iter(by_precision), None) if len(by_precision) == 1 else None)
    sizes = dict(by_precision.get(str(precision)) or {})
    sizes |= {k: knobs[k] for k in ("gbs", "seq_length") if k in knobs}
    if isinstance(meta.get("gpus_per_node"), int):
        sizes["num_gpus"] = int(knobs.get("num_nodes", meta.get("num_nodes", 1))) * meta["gpus_per_node"]
    return sizes, f"gbs, sequence length and GPUs from the study's dse.json (trial {int(path.name)})"


def _trial_knobs(study: Path, number: int) -> dict:
    """The varied knobs of trial ``number`` in the study's store (one streamed pass; {} when it is not there)."""
    from dse.study.loop import open_store

    try:
        store, _ = open_store(study)
    except UserError:  # a copied trial directory and dse.json without the store: the study's sizes only
        return {}
    try:
        return next((dict(r.knobs) for r in store.iter_records() if r.number == number), {})
    finally:
        store.close()
