"""Writing result files so that a reader sees the old file or the new one, never half of one; and retrying
a step that loses a race to another process.

:func:`atomic_write` is the one way dse writes a result file (leaderboard, report, comparison, ``best.json``,
calibration, imported spaces, log packs): a temporary file in the same directory (so the rename stays on one
file system), flushed and fsynced, then ``os.replace``; on any failure (a full disk included) the temporary
file is removed and the old file is left as it was. Hand-written: the library that did this (``atomicwrites``)
is archived, and the standard library has the parts.

:func:`retry` is the one bounded retry: a few attempts with exponential waits, for the exception types the
caller names and no other (a bug is never retried). tenacity would do it, but as one more dependency for a
dozen lines. Nothing here imports the rest of dse, so any layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, *, binary: bool = False, encoding: str = "utf-8", newline: str | None = None
) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; when the ``with`` block ends without an exception the
    file is fsynced and renamed over ``path``. Any exception (an ``OSError`` from a full disk, or one raised in
    the block) removes the temporary file, leaves ``path`` as it was, and propagates.

    The temporary file is ``.NAME.RANDOM.tmp`` (hidden, unique, so concurrent writers never share one), created
    with the permissions a plain ``open`` would give (0666 less the umask)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        mode = "wb" if binary else "w"
        with os.fdopen(fd, mode, encoding=None if binary else encoding, newline=None if binary else newline) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; best effort (some file systems refuse to open or sync a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`); ``path`` as a :class:`Path`."""
    with atomic_write(path, encoding=encoding) as fh:
        fh.write(text)
    return Path(path)


def retry(
    fn: Callable[[], T],
    *,
    on: type[BaseException] | tuple[type[BaseException], ...],
    attempts: int = 6,
    first_wait_s: float = 0.2,
    jitter: float = 0.0,
    sleep: Callable[[float], Any] = time.sleep,
) -> T:
    """``fn()``, called again after an exception of the types ``on``, at most ``attempts`` calls in all, waiting
    ``first_wait_s`` and then twice as long before each further call (0.2 s .. 3.2 s for the defaults: about
    6 s in all), each wait scaled by a random factor in ``1 ± jitter`` (processes racing on one database spread
    out instead of colliding again). The last attempt's exception propagates; any other exception propagates at
    once."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    for attempt in range(attempts - 1):
        try:
            return fn()
        except on:
            sleep(first_wait_s * 2**attempt * random.uniform(1.0 - jitter, 1.0 + jitter))
    return fn()
