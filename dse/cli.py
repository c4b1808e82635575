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


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
