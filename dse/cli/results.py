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
        render.console.print(f"wrote {summary.n} rows to {csv}")
    render.print_summary(summary, knob_names, top=top)


def report_cmd(
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="a dse run's output directory"),
    html_file: Path | None = typer.Option(
        None, "--html", metavar="PATH", help="where to write (default: DIR/report.html)"
    ),
) -> None:
    """Write the study's HTML report: best configuration, plots, leaderboard (self-contained)."""
    from dse import report
    from dse.leaderboard import checked_output
    from dse.study import open_store

    path = html_file or Path(out_dir) / "report.html"
    store, meta = open_store(out_dir)
    try:
        checked_output(path, "--html")  # a bad --html is refused before the study is read
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
) -> None:
    """Compare finished studies (one per GPU generation): best layouts, speed-up, GPU-hours, cost, changed knobs."""
    from dse import compare

    render.comparison(*compare.write(compare.gather(dirs), out or Path(dirs[0]).resolve().parent))


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
        help="the training log to read (log.txt, log.txt.gz), or a run directory",
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
    """Read a training log: status, reason, steady-state step time, TFLOP/s/GPU, tokens/s/GPU, memory."""
    from dse.parse import ParseContext, parse_log

    m = parse_log(
        _log_source(log),
        exit_code=exit_code,
        scheduler_state=scheduler_state,
        context=ParseContext(gbs=gbs, seq_length=seq_length, num_gpus=num_gpus),
    )
    d = m.to_dict()
    shown = {k: d[k] for k in _PARSE_KEYS} | {k: v for k, v in d.items() if k not in _PARSE_KEYS}
    if json_out:
        typer.echo(json.dumps(shown))
        return
    for k in _PARSE_KEYS + ("partial", "step_time_mean_s", "step_time_p10_s", "step_time_p90_s", "log_format"):
        v = shown[k]
        text = json.dumps(v) if v is None or isinstance(v, bool) else f"{v:.6g}" if isinstance(v, float) else v
        typer.echo(f"{k}: {text}")


def _log_source(log: str) -> Path | Iterator[str]:
    """What ``dse parse LOG`` reads: a log file, a run directory's log, or a packed simulated trial's lines."""
    from dse import logpack
    from dse.backends.scripts import run_log

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
