"""The one error type users see: one line naming the file, the field and what is allowed."""

from __future__ import annotations

import difflib
import errno
import re
from collections.abc import Callable, Iterable

# Another parameter of the call, named in an error's message: ``{param:resume}``.
_PARAM = re.compile(r"\{param:(\w+)\}")


def named(message: str, spell: Callable[[str], str] = lambda name: f"`{name}`") -> str:
    """``message`` with each parameter it names (``{param:NAME}``) spelled by ``spell``: by the library as the
    parameter's name in backquotes, by the command line as its flag (``dse.cli``)."""
    return _PARAM.sub(lambda m: spell(m.group(1)), message)


class UserError(Exception):
    """Bad input from a user. The CLI prints ``str(err)`` on one line and exits with code 2.

    ``field`` names what was bad in ``file`` (a field of a space file); ``param`` names the argument of a library
    call that was bad (``out``, ``storage``), by its name: the command line shows it as the flag that gives it
    (``dse.cli``), so the library names no flag. The message names another parameter of the call as
    ``{param:NAME}`` (:func:`named`: ``resume`` here, ``--resume`` on the command line)."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None, param: str | None = None):
        self.file, self.field, self.param, self.message = file, field, param, message
        where = ": ".join(p for p in (file, field or param) if p)
        super().__init__(f"{where}: {named(message)}" if where else named(message))


class InfrastructureError(Exception):
    """dse's own machinery failed (writing a run directory, a log, the store: a full disk, a read-only file
    system), not the trial. It is never recorded as a trial outcome: the study stops with one line, nothing
    is recorded for the trial in flight, and ``--resume`` runs that trial again. Backends and the trial
    executor raise it (or let :func:`infrastructure` classify an ``OSError``); the environment re-raises it."""

    def __init__(self, message: str):
        super().__init__(message)


class Cancelled(Exception):
    """A run stopped through the study's cancel event (a Ctrl-C under ``--parallel``, seen by the backend's
    stop check): no outcome of the trial. Its row stays interrupted, and ``--resume`` runs it again."""


# errno values that mean "the machine cannot write", whatever the trial: disk full, quota, read-only, I/O.
_INFRA_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def infrastructure(e: OSError, what: str) -> InfrastructureError | None:
    """An :class:`InfrastructureError` for ``e`` when its errno says the machine cannot write; else None."""
    if e.errno in _INFRA_ERRNOS:
        return InfrastructureError(
            f"{what}: {e.strerror or e} ({errno.errorcode.get(e.errno, e.errno)}"
            f"{', ' + str(e.filename) if e.filename else ''})"
        )
    return None


def did_you_mean(value: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest candidate, or '' when nothing is close."""
    close = difflib.get_close_matches(str(value), list(candidates), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""
