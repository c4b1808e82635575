"""dse.fsutil: the atomic write (old file intact and no temporary file left on any failure) and the bounded retry."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from dse import fsutil


def _disk_full(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("old\n")
    assert fsutil.write_text(path, "new\n") == path
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_full_disk_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "leaderboard.csv"
    path.write_text("old\n")
    monkeypatch.setattr(os, "fsync", _disk_full)  # where a full disk shows on a buffered write
    with pytest.raises(OSError) as err:
        fsutil.write_text(path, "new\n" * 10_000)
    assert err.value.errno == errno.ENOSPC
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["leaderboard.csv"]


def test_a_full_disk_on_a_new_file_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(OSError):
        fsutil.write_text(tmp_path / "report.html", "<html>")
    assert list(tmp_path.iterdir()) == []


def test_an_exception_in_the_block_keeps_the_old_file(tmp_path):
    path = tmp_path / "best.json"
    path.write_text("{}")
    with pytest.raises(RuntimeError, match="half way"):
        with fsutil.atomic_write(path) as fh:
            fh.write('{"trial": ')
            raise RuntimeError("half way")
    assert path.read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["best.json"]


def test_binary_mode_and_plain_permissions(tmp_path):
    path = tmp_path / "pack.tar.xz"
    with fsutil.atomic_write(path, binary=True) as fh:
        fh.write(b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # as open() would create it, not mkstemp's 0600


def test_two_writers_of_one_file_use_different_temporaries(tmp_path):
    path = tmp_path / "leaderboard.csv"
    with fsutil.atomic_write(path) as a, fsutil.atomic_write(path) as b:
        assert len(list(tmp_path.glob(".leaderboard.csv.*.tmp"))) == 2
        a.write("a")
        b.write("b")
    assert path.read_text() == "a"  # the last to finish wins; neither sees the other half-written
    assert [p.name for p in tmp_path.iterdir()] == ["leaderboard.csv"]


def test_retry_retries_only_the_named_exception_and_waits_longer_each_time():
    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("lost the race")
        return "ok"

    assert fsutil.retry(flaky, on=ConnectionError, sleep=waits.append) == "ok"
    assert len(calls) == 3 and waits == [0.2, 0.4]


def test_retry_gives_up_after_the_bound_with_the_last_exception():
    calls, waits = [], []

    def always():
        calls.append(1)
        raise ConnectionError(f"attempt {len(calls)}")

    with pytest.raises(ConnectionError, match="attempt 4"):
        fsutil.retry(always, on=(TimeoutError, ConnectionError), attempts=4, first_wait_s=1.0, sleep=waits.append)
    assert len(calls) == 4 and waits == [1.0, 2.0, 4.0]


def test_retry_never_retries_another_exception():
    calls = []

    def bug():
        calls.append(1)
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        fsutil.retry(bug, on=ConnectionError, sleep=lambda s: None)
    assert len(calls) == 1
    with pytest.raises(ValueError, match="at least 1"):
        fsutil.retry(bug, on=ConnectionError, attempts=0)
