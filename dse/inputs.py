"""Reading a user's input file (space, system, model, calibration, CloudAI files): a regular file of bounded
size, checked before it is opened, read whole, and parsed with one-line errors.

Why a helper of our own: ``open`` on a FIFO blocks until a writer comes, ``/dev/zero`` reads until memory runs
out, a symlink loop is an ``OSError`` and a deeply nested TOML table a ``RecursionError``; no library gives
"read this small file or say why not in one line", so every reader goes through :func:`read_text`.
"""

from __future__ import annotations

import errno
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from dse.errors import UserError

# The largest input file read (space, system, model, calibration, CloudAI test or system). The biggest file dse
# ships is a few KiB and a space at dse.rules.space's caps (8,192 knob values) well under 100 KiB, so 1 MiB is far
# beyond any real input and small enough that reading and parsing it costs milliseconds.
MAX_INPUT_BYTES = 1024 * 1024


def _size_text(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n:,} bytes"


def check_regular(path: str | Path, *, cap: int = MAX_INPUT_BYTES) -> os.stat_result:
    """``path``'s status when it is a regular file (after symlinks) of at most ``cap`` bytes; else a one-line
    :class:`UserError`. Looks without opening, so a FIFO or a device never blocks or streams."""
    f = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError("no such file", file=f) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError("a symlink loop, not a file", file=f) from None
        raise UserError(f"cannot read: {e.strerror or e}", file=f) from None
    except ValueError as e:  # an embedded NUL byte in the path
        raise UserError(f"not a file name: {e}", file=f) from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError("is a directory; give a file", file=f)
    if not stat.S_ISREG(st.st_mode):
        raise UserError("not a regular file (a device, a FIFO or a socket); give a file", file=f)
    if st.st_size > cap:
        raise UserError(f"{st.st_size:,} bytes; an input file may hold at most {_size_text(cap)}", file=f)
    return st


def read_bytes(path: str | Path, *, cap: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes (:func:`check_regular`). Opened non-blocking and
    checked again on the open descriptor, so a file swapped for a FIFO in between never blocks; at most
    ``cap + 1`` bytes are read, so a file that grew meanwhile is refused, never read whole."""
    check_regular(path, cap=cap)
    f = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", file=f) from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise UserError("not a regular file (a device, a FIFO or a socket); give a file", file=f)
        try:
            data = fh.read(cap + 1)
        except OSError as e:
            raise UserError(f"cannot read: {e.strerror or e}", file=f) from None
    if len(data) > cap:
        raise UserError(f"more than {_size_text(cap)}; an input file may hold at most {_size_text(cap)}", file=f)
    return data


def read_text(path: str | Path, *, cap: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``cap`` bytes; a binary file is a one-line refusal."""
    data = read_bytes(path, cap=cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"not UTF-8 text (a binary file?): byte {e.start} is {data[e.start]:#04x}", file=str(path)
        ) from None


def parse_toml(text: str, *, file: str) -> dict[str, Any]:
    """TOML text as a dict; malformed TOML, nesting deeper than Python's recursion allows and integers of more
    digits than Python converts (4,300) are each one line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"malformed TOML: {e}", file=file) from None
    except RecursionError:
        raise UserError("malformed TOML: tables or arrays nested too deeply", file=file) from None
    except ValueError as e:  # int('9' * 5000): "Exceeds the limit (4300 digits) for integer string conversion"
        raise UserError(f"malformed TOML: a number too long to read ({str(e).split(';')[0]})", file=file) from None


def load_toml(path: str | Path, *, cap: int = MAX_INPUT_BYTES) -> dict[str, Any]:
    """A TOML input file (:func:`read_text`, :func:`parse_toml`) as a dict."""
    return parse_toml(read_text(path, cap=cap), file=str(path))


# -- CSV cells ---------------------------------------------------------------------------------------------------
# A spreadsheet reads a cell that starts with one of these as a formula (OWASP's CSV injection): a failure reason
# quoted from a log ("=HYPERLINK(...)") or an environment value could run one when a user opens leaderboard.csv.
# dse's CSV writers put a ' before such a text cell (spreadsheets show the text as it is) and dse's CSV readers take
# it off again, so a table read back holds the values written.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell: a text that a spreadsheet would read as a formula with a leading ``'``."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def from_csv_cell(value: Any) -> Any:
    """A cell as :func:`csv_cell` wrote it, back to its value."""
    if isinstance(value, str) and value.startswith("'") and value[1:].startswith(FORMULA_STARTS):
        return value[1:]
    return value


def csv_row(row: dict) -> dict:
    """A row of :class:`csv.DictReader` with each cell back to its value (:func:`from_csv_cell`)."""
    return {k: from_csv_cell(v) for k, v in row.items()}
