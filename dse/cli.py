"""The ``dse`` command (Typer): run, dry-run, validate, space, predict, parse, leaderboard, report, recipes.

User errors (:class:`dse.errors.UserError`) print one line and exit with code 2; nothing is written.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

import typer
from rich.console import Console

from dse.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Design-space exploration for NeMo / Megatron training recipes.")
console = Console()
err_console = Console(stderr=True)


def user_errors(fn: Callable) -> Callable:
    """Turn a UserError into one line on stderr and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

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


@app.command("parse")
@user_errors
def parse_cmd(
    log: str = typer.Argument(..., help="the training log to read", show_default=False),
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

    path = Path(log)
    if not path.is_file():
        raise UserError("no such log file (give the path of a training log)", file=log)
    m = parse_log(path, exit_code=exit_code, scheduler_state=scheduler_state,
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


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
