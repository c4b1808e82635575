"""The ``dse`` command (Typer), built here from one module per command group:

- :mod:`dse.cli.studies`: ``run`` (one study, or one per system with ``--systems``);
- :mod:`dse.cli.results`: ``leaderboard``, ``report``, ``compare``, ``parse``: what studies and runs left;
- :mod:`dse.cli.spaces`: ``validate``, ``space``, ``dry-run``: a space before any run;
- :mod:`dse.cli.model`: ``recipes``, ``predict``, ``calibrate``: the performance model without a run;
- :mod:`dse.cli.importers`: ``import cloudai``;
- :mod:`dse.cli.exports`: ``export optuna``, ``export minari``;
- :mod:`dse.cli.learning`: ``train-policy`` (a learned search policy, experimental), ``bench-agents`` (the agent
  leaderboard);
- :mod:`dse.cli.render`: everything printed on the terminal (tables, summaries, error lines).

User errors (:class:`dse.errors.UserError`) print one line and exit with code 2; nothing is written. Every
command is registered through :func:`user_errors`, so none can forget it. Help is click's plain layout
(``rich_markup_mode=None``): help texts are printed as written, brackets included, and each option names its
value with a ``metavar`` (a flag none).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import typer
from typer.core import TyperGroup

from dse.cli import exports, importers, learning, model, render, results, spaces, studies
from dse.errors import InfrastructureError, UserError, named

# Typer vendors Click and exports, of its exceptions, only BadParameter: the usage error is its base class.
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _UsageLine(_UsageError):  # type: ignore[misc,valid-type]
    """A usage error (an unknown option, a value of the wrong type) shown as dse shows every bad input: one line on
    stderr, exit code 2, instead of click's usage block (the command's help is one ``--help`` away)."""

    def show(self, file=None) -> None:
        ctx = getattr(self, "ctx", None)
        where = ctx.command_path if ctx is not None else "dse"
        render.error(f"{self.format_message()} ({where} --help lists what it takes)")


class _Group(TyperGroup):
    """The ``dse`` group: click's usage errors, of the group or any command under it, become :class:`_UsageLine`.

    Written here rather than found in Typer, which formats them as a block (plain or rich) with no option for one line.
    """

    def make_context(self, info_name, args, parent=None, **extra):
        with _one_line():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Any) -> Any:  # Typer's vendored click.Context
        with _one_line(ctx):
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line(ctx: Any = None) -> Iterator[None]:
    """Re-raise a usage error as :class:`_UsageLine`; one without a context (a parser error, such as an option
    missing its value) takes the command being invoked under ``ctx``."""
    try:
        yield
    except _UsageLine:
        raise
    except _UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `dse` or `dse import` alone: the help, as asked
            raise
        where = e.ctx  # type: ignore[attr-defined]
        if where is None and ctx is not None and ctx.invoked_subcommand:
            where = ctx.command.get_command(ctx, ctx.invoked_subcommand)
            where = typer.Context(where, info_name=ctx.invoked_subcommand, parent=ctx) if where else ctx
        raise _UsageLine(e.format_message(), where) from None  # type: ignore[attr-defined]


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
    help="Design-space exploration for NeMo / Megatron training recipes.",
)


def _as_flag(e: UserError) -> UserError:
    """``e`` as the command line says it: the library's parameter (``out``, ``dataset_id``) named by the option
    that gives it (``--out``, ``--dataset-id``: each command's option is its parameter's name, spelled as Typer
    spells it)."""
    message = named(e.message, _flag)  # the other parameters the message names, as their flags
    if e.param is None or e.field is not None:
        return e if message == e.message else UserError(message, file=e.file, field=e.field)
    return UserError(message, file=e.file, field=_flag(e.param))


def _flag(param: str) -> str:
    return "--" + param.replace("_", "-")


def user_errors(fn: Callable) -> Callable:
    """Turn a UserError into one line on stderr and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            render.error(str(_as_flag(e)))
            raise typer.Exit(2) from None
        except InfrastructureError as e:  # dse could not write (disk full...): one line, exit 1
            render.error(str(e), resume=True)
            raise typer.Exit(1) from None
        except OSError as e:
            # A path longer than the file system allows is the user's input, whichever command and option it
            # reached (a space, a system name, --out, a log): one line here rather than a check at every open.
            if e.errno != errno.ENAMETOOLONG:
                raise
            name = str(e.filename)
            shown = name if len(name) <= 80 else name[:77] + "..."
            render.error(f"{shown}: a file name too long ({len(name):,} characters); give a shorter path")
            raise typer.Exit(2) from None

    return wrapper


# In the order `dse --help` lists them.
_COMMANDS: dict[str, Callable] = {
    "recipes": model.recipes_cmd,
    "run": studies.run_cmd,
    "probe": studies.probe_cmd,
    "compare": results.compare_cmd,
    "leaderboard": results.leaderboard_cmd,
    "validate": spaces.validate_cmd,
    "space": spaces.space_cmd,
    "report": results.report_cmd,
    "parse": results.parse_cmd,
    "predict": model.with_knob_flags(model.predict_cmd),
    "calibrate": model.calibrate_cmd,
    "dry-run": spaces.dry_run_cmd,
    "train-policy": learning.train_policy_cmd,
    "bench-agents": learning.bench_agents_cmd,
}
for _name, _fn in _COMMANDS.items():
    app.command(_name)(user_errors(_fn))

import_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Convert another tool's files into a dse space."
)
import_app.command("cloudai")(user_errors(importers.cloudai_cmd))
app.add_typer(import_app, name="import")

export_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Write a study into another tool's storage.")
export_app.command("optuna")(user_errors(exports.optuna_cmd))
export_app.command("minari")(user_errors(exports.minari_cmd))
export_app.command("minari-suite")(user_errors(exports.minari_suite_cmd))
app.add_typer(export_app, name="export")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"dse {version('dse')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print dse's version and exit"
    ),
) -> None:
    """Design-space exploration for NeMo / Megatron training recipes."""


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
