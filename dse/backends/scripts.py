"""What every script-writing backend shares: quoting checks, staging the payload code, the job's names.

Nothing a user writes reaches a shell unquoted: every value that goes into a script passes
:func:`check_env` / :func:`check_field` (a whitelist of characters) and is then ``shlex.quote``-d by the
writer. The check is belt and braces: quoting alone already keeps ``$(...)``, backticks and ``;`` inert.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from dse.errors import UserError
from dse.facts import allowlists
from dse.logs.logpack import COMPRESSED_LOG  # the simulated backend's log, gzip-compressed
from dse.recipes import contract

LOG_NAME = contract.LOG_NAME  # the trainer's output in every run directory (as the simulated backend writes it)


def run_log(run_dir: Path) -> Path | None:
    """The trainer's log in ``run_dir``: ``log.txt``, or the simulated backend's ``log.txt.gz``; None if neither."""
    for name in (LOG_NAME, COMPRESSED_LOG):
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


CODE_DIR = "code"  # the payload package, staged beside the script (the container's working directory)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # full match only ("FOO\n" is not a name)
# paths that a script names without quotes of its own (nemo-run leaves srun's --output unquoted); no '%',
# which Slurm expands in --output/--chdir (%j, %u...)
_SAFE_PATH = re.compile(r"[A-Za-z0-9_.,:/+@=\-]+")


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment names must be identifiers outside :data:`dse.facts.allowlists.ENV_NEVER`; values are strings (quoted
    by the writer, never checked for content here, so that a value reaches the process literally)."""
    out = {}
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise UserError(f"{name!r} is not an environment variable name (letters, digits, _)", field=f"env.{name}")
        if why := allowlists.env_never(name):  # belt and braces: a space file never gets one this far
            raise UserError(f"{name} is never set by a launch: {why}", field=f"env.{name}")
        if not isinstance(value, str) or "\0" in value:
            raise UserError(f"{value!r} is not a string value", field=f"env.{name}")
        out[name] = value
    return out


def check_field(value: str, pattern: str, *, field: str, file: str | None = None, what: str) -> str:
    """``value`` if it matches ``pattern`` in full, else a :class:`UserError` naming the field and what is allowed."""
    if not re.fullmatch(pattern, value):
        raise UserError(f"{value!r} is not allowed; {field} takes {what}", file=file, field=field)
    return value


def check_path(path: Path, *, field: str | None = "run directory", param: str | None = None) -> Path:
    """A path that goes into a script unquoted by a library: letters, digits and ``_.,:/+@%=-`` only (the error
    names ``param``, the caller's argument, where given, else ``field``)."""
    if not _SAFE_PATH.fullmatch(str(path)):
        raise UserError(
            f"{str(path)!r} has characters a job script cannot carry safely; use letters, digits and _.-/ in the path",
            field=None if param else field,
            param=param,
        )
    return path


# A script that must move with its folder (best/) is rendered for a stand-in directory under this root, then each
# mention of the stand-in becomes the variable DIR_VAR, which the script sets at its top (relocatable()).
RELOCATABLE_ROOT = "/DSE_RELOCATABLE"
DIR_VAR = "DSE_DIR"


def relocatable(text: str, stand_in: Path) -> str:
    """``text``, rendered for directory ``stand_in``, with every mention of it made relative: in comments and
    ``#SBATCH`` lines (which no shell expands) a path inside it loses the prefix (sbatch reads it relative to the
    submit directory); in commands it becomes ``"${DSE_DIR}"``. A mention left over is an error, not a script."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            line = line.replace(f"{stand_in}/", "")
        else:
            line = line.replace(str(stand_in), f'"${{{DIR_VAR}}}"')
        out.append(line)
    result = "\n".join(out) + "\n"
    if RELOCATABLE_ROOT in result:
        raise ValueError(f"a relocatable script still names {stand_in}")  # a writer's bug: it must not ship
    return result


def comment(text: str) -> str:
    """A ``#`` comment line of a script saying ``text``: anything but letters, digits, space and ``_.,:/+@=()-``
    becomes ``_`` (a newline in a comment would end it and start a command)."""
    return "# " + re.sub(r"[^A-Za-z0-9_.,:/+@=() \-]", "_", text)


def quoted_command(argv: Iterable[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def job_name(run_dir: Path) -> str:
    """Slurm job name of a trial: ``dse-`` and the run directory's name, made safe."""
    return "dse-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run_dir.name)


def stage_code(dest: Path) -> Path:
    """Copy the payload package (``dse.recipes``, the repository's ``recipes/``) into ``dest/code/recipes`` and
    return ``dest/code``.

    The job runs ``python -m recipes.<payload>`` from there (container or not): the payload's own imports are
    relative, so it runs there as the top-level package ``recipes`` without the controller installed, and a run
    directory holds the
    exact payload code that ran. nemo-run's packagers do this for a whole git repository through tar and an
    experiment; one pure-Python package needs only a copy.
    """
    from dse import recipes

    src = Path(recipes.__file__).resolve().parent
    code = dest / CODE_DIR
    target = code / "recipes"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return code


def import_nemo_run():
    """``nemo_run``, imported lazily (1-2 s) with its dependencies' DeprecationWarnings silenced.

    nemo-run 0.11.1 pulls in starlette's deprecated WSGI middleware (through leptonai) at import time; that
    warning is about their code, not ours, and must not fail runs that treat warnings as errors.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import nemo_run
        import nemo_run.core.execution.slurm  # noqa: F401  (SlurmBatchRequest, SlurmJobDetails)
    return nemo_run
