"""The one error type users see: one line naming the file, the field and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input from a user. The CLI prints ``str(err)`` on one line and exits with code 2."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file, self.field, self.message = file, field, message
        where = ": ".join(p for p in (file, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


def did_you_mean(value: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest candidate, or '' when nothing is close."""
    close = difflib.get_close_matches(str(value), list(candidates), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""
