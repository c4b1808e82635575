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

    from dse.backends.dryrun import dry_run
    from dse.space import load_space

    sp = load_space(space)
    rows = dry_run(sp, backend, Path(out), limit)
    table = Table("trial", *sp.knob_names, "nodes x GPUs", "script", title=f"dse dry-run: {sp.name} ({backend})")
    for r in rows:
        if r.script:
            table.add_row(f"{r.index:05d}", *(str(r.knobs.get(k)) for k in sp.knob_names),
                          f"{sp.num_nodes} x {sp.system.gpus_per_node}", str(r.script))
    console.print(table)
    rejected: dict[str, int] = {}
    for r in rows:
        if r.script is None:
            rejected[r.reason or "?"] = rejected.get(r.reason or "?", 0) + 1
    for reason, count in sorted(rejected.items(), key=lambda kv: -kv[1]):
        console.print(f"[yellow]rejected[/] {count} x {reason}", highlight=False, soft_wrap=True)
    n = sum(1 for r in rows if r.script)
    console.print(f"{n} {backend} script(s) written under {out}; {len(rows) - n} rejected; nothing submitted.")


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
