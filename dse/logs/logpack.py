"""Simulated trials' logs in packs: ``trials/logs-FIRST-LAST.tar.xz`` for every :data:`PACK_SIZE` finished
trials, instead of a run directory each.

Why: on ext4 a run directory costs 8 KiB on disk however small its log is (a block for the directory and one
for the file), so a simulated grid over ~185,000 points left 1.5 GB of directories holding 400-byte logs. A
pack compresses its logs together (the logs of one space share most of their lines): about 140 bytes a trial
on the big grid (``bench/big_grid.py`` prints the packs' size).

What is packed, and when (decisions):

- A run directory that holds exactly ``log.txt.gz``: what the simulated backend leaves when no early-stop
  monitor follows its log (``dse.backends.sim``). Anything else (a real run's script and outputs, a plain
  log an early stop followed) is never touched.
- Only trials already in the store (the study flushes the store first): a pack never holds a trial that a
  killed ``dse`` would run again. Interrupted trials are not packed (they run again in their directory).
- :data:`PACK_SIZE` trials at a time, and no pack for fewer: a study of fewer trials (the quick start) and
  the last few trials of a larger one keep their directories, to be read as any run directory.

Format: an xz-compressed tar, members ``NNNNN/log.txt``, the plain log. Standard tools read it: ``tar -xJf
trials/logs-00256-00511.tar.xz -C trials`` gives the directories back. A pack is written under a temporary
name and renamed into place (:func:`dse.fsutil.atomic_write`), so a reader finds a whole pack or none; only
then are the directories removed (a ``dse`` killed in between leaves both: readers prefer the directory).
``dse parse trials/00300`` reads a packed trial's log (:func:`read`). tarfile, not a format of our own, for
that reason; not zip, which compresses each member alone (what ``log.txt.gz`` already is: ~400 bytes for a
failed run's log, ~2 KB for a finished one); xz (preset 1), not gzip, whose 32 KiB window sees a few logs at a
time: 138 against 250 bytes a trial on the big grid's logs, at about the same speed (~0.2 ms a trial).
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from dse.errors import InfrastructureError, UserError, infrastructure
from dse.fsutil import atomic_write
from dse.recipes import contract

LOG_NAME = contract.LOG_NAME
COMPRESSED_LOG = LOG_NAME + ".gz"  # the simulated backend's log, gzip-compressed
PACK_SIZE = 256
MAX_LINE = 1 << 20  # characters of one packed log's line that are read (as dse.logs.parse.MAX_LINE)
_PACK = re.compile(r"logs-(\d+)-(\d+)(?:-\d+)?\.tar\.xz")
_BROKEN = (tarfile.TarError, EOFError, lzma.LZMAError, zlib.error, OSError)  # what a cut or damaged pack raises


def packable(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds exactly a simulated trial's compressed log (nothing else is ever packed)."""
    try:
        return os.listdir(run_dir) == [COMPRESSED_LOG]
    except OSError:
        return False


def pack(trials_dir: Path, numbers: Iterable[int]) -> Path | None:
    """Pack the logs of the trials ``numbers`` whose run directories are :func:`packable` into one pack in
    ``trials_dir`` and remove those directories; the pack (None when none was packable). An ``OSError``
    (disk full) leaves every directory as it was and raises :class:`InfrastructureError`."""
    trials_dir = Path(trials_dir)
    dirs = [d for d in (trials_dir / f"{n:05d}" for n in sorted(set(numbers))) if packable(d)]
    if not dirs:
        return None
    stem = f"logs-{dirs[0].name}-{dirs[-1].name}"
    path, k = trials_dir / f"{stem}.tar.xz", 0
    while path.exists():  # never over another pack (trial numbers are unique, so this is defence only)
        k += 1
        path = trials_dir / f"{stem}-{k}.tar.xz"
    try:
        with atomic_write(path, binary=True) as fh, tarfile.open(fileobj=fh, mode="w:xz", preset=1) as tar:
            for d in dirs:
                log = d / COMPRESSED_LOG
                data = gzip.decompress(log.read_bytes())
                info = tarfile.TarInfo(f"{d.name}/{LOG_NAME}")
                info.size, info.mtime, info.mode = len(data), int(log.stat().st_mtime), 0o644
                tar.addfile(info, io.BytesIO(data))
    except OSError as e:
        raise infrastructure(e, f"cannot pack logs in {trials_dir}") or InfrastructureError(
            f"cannot pack logs in {trials_dir}: {e}"
        ) from None
    for d in dirs:
        (d / COMPRESSED_LOG).unlink()
        d.rmdir()
    return path


def set_aside(trials_dir: str | os.PathLike) -> list[Path]:
    """Rename every pack in ``trials_dir`` to ``logs-FIRST-LAST.orphanK.tar.xz`` (which no reader takes): for a
    study started anew over the old one's trial numbers (``--resume --rebuild``); the new names."""
    moved = []
    for _, _, p in _packs(Path(trials_dir)):
        stem = p.name[: -len(".tar.xz")]
        k = 0
        while (aside := p.with_name(f"{stem}.orphan{k}.tar.xz")).exists():
            k += 1
        p.rename(aside)
        moved.append(aside)
    return moved


def _packs(trials_dir: Path) -> list[tuple[int, int, Path]]:
    if not trials_dir.is_dir():
        return []
    found = []
    for p in trials_dir.iterdir():
        m = _PACK.fullmatch(p.name)
        if m:
            found.append((int(m[1]), int(m[2]), p))
    return sorted(found)


def read(run_dir: str | os.PathLike) -> str | None:
    """The log of the trial whose run directory ``run_dir`` was packed, whole (None when no pack holds it); a
    pack that cannot be read is a one-line :class:`UserError` naming it. For small logs; :func:`lines` streams."""
    found = lines(run_dir)
    return None if found is None else "".join(found)


def lines(run_dir: str | os.PathLike) -> Iterator[str] | None:
    """The lines of the packed log of ``run_dir``, read from the pack as they are consumed (None when no pack
    holds it): a small pack may decompress to a huge log, which is never held whole. Lines are split as the
    parser splits a file (universal newlines, at most :data:`MAX_LINE` characters read of each)."""
    run_dir = Path(run_dir)
    if not run_dir.name.isdigit():
        return None
    n, member = int(run_dir.name), f"{run_dir.name}/{LOG_NAME}"
    for first, last, p in _packs(run_dir.parent):
        if first <= n <= last and _holds(p, member):
            return _member_lines(p, member)
    return None


def _find(tar: tarfile.TarFile, member: str) -> tarfile.TarInfo | None:
    """``member`` of ``tar``, reached by reading forward (``getmember`` would read the whole pack first, and
    seeking within a huge compressed member costs memory in the standard library's xz reader: measured)."""
    return next((info for info in tar if info.name == member and info.isfile()), None)


def _holds(pack_path: Path, member: str) -> bool:
    try:
        with tarfile.open(pack_path, "r:xz") as tar:
            return _find(tar, member) is not None
    except _BROKEN as e:
        raise UserError(f"cannot read this pack of logs: {e}", file=str(pack_path)) from None


def _member_lines(pack_path: Path, member: str) -> Iterator[str]:
    try:
        with tarfile.open(pack_path, "r:xz") as tar:
            info = _find(tar, member)
            raw = tar.extractfile(info) if info is not None else None
            assert raw is not None  # _holds found it
            text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline=None)
            # dse.logs.parse reads a file the same way; not imported from there: the two modules are independent layers
            while line := text.readline(MAX_LINE):
                yield line
                if len(line) == MAX_LINE and not line.endswith("\n"):
                    while (rest := text.readline(MAX_LINE)) and not rest.endswith("\n"):
                        pass  # the tail of an overlong line (no progress record is that long)
    except _BROKEN as e:
        raise UserError(f"cannot read this pack of logs: {e}", file=str(pack_path)) from None


def count(trials_dir: str | os.PathLike) -> int:
    """Trials whose logs the packs in ``trials_dir`` hold (each pack read through: for messages, not loops)."""
    total = 0
    for _, _, p in _packs(Path(trials_dir)):
        try:
            with tarfile.open(p, "r:xz") as tar:
                total += sum(1 for m in tar if m.isfile())
        except _BROKEN:  # a damaged pack is left out of the count (a message, not a loop, uses it)
            continue
    return total


class Packer:
    """The finished trials of one study run, packed :data:`PACK_SIZE` at a time (see the module docstring).
    ``add`` each trial once it is recorded; when :attr:`ready`, flush the store, then :meth:`pack`."""

    def __init__(self, trials_dir: Path, size: int | None = None):
        self.trials_dir, self.size = Path(trials_dir), size or PACK_SIZE
        self.numbers: list[int] = []

    def add(self, number: int) -> None:
        self.numbers.append(number)

    @property
    def ready(self) -> bool:
        return len(self.numbers) >= self.size

    def pack(self) -> Path | None:
        numbers, self.numbers = self.numbers, []
        return pack(self.trials_dir, numbers)
