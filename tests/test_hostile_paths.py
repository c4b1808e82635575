"""Paths longer than the file system allows (found by bench/hostile.py): every command refuses them in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space

LONG = "9" * 5000


@pytest.mark.parametrize(
    "args",
    [
        ["validate", LONG],
        ["run", "--space", LONG],
        ["run", "--space", "space.toml", "--out", LONG],
        ["run", "--space", "space.toml", "--out", "o", "--systems", LONG],
        ["run", "--space", "space.toml", "--out", "o", "--warm-start", LONG],
        ["dry-run", "--space", "space.toml", "--out", LONG, "--limit", "1"],
        ["parse", LONG],
        ["leaderboard", LONG],
        ["calibrate", LONG, "--gpu", "h100", "--out", "c.toml"],
        ["predict", "--model", "llama3_8b", "--system", LONG],
        ["predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", LONG],
    ],
    ids=lambda a: " ".join(x if x != LONG else "LONG" for x in a),
)
def test_a_file_name_too_long_is_one_line(tmp_path: Path, args: list[str]) -> None:
    write_space(tmp_path, SMALL_SPACE)
    line = one_line_error(dse(*args, cwd=tmp_path), "a file name too long", "5,0")
    assert len(line) < 200  # the name is shortened, not printed whole
