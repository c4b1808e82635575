"""``dse train-policy``'s inputs and output, checked before any training (no rl extra needed to refuse them): a
user's file is never replaced without ``--force``, a directory never, an unwritable place is one line, and the
numbers are bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import dse, one_line_error

SPACE = "conf/spaces/nemotron3_8b_space.toml"


def listing(d: Path) -> dict[str, bytes]:
    return {p.name: b"<link>" if p.is_symlink() else p.read_bytes() if p.is_file() else b"<dir>" for p in d.iterdir()}


def test_an_existing_file_is_never_replaced_without_force(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    before = listing(tmp_path)
    one_line_error(dse("train-policy", SPACE, "--out", notes, "--steps", "64"), "notes.txt", "--out", "--force")
    (tmp_path / "DIR").mkdir()
    one_line_error(dse("train-policy", SPACE, "--out", tmp_path / "DIR", "--force"), "not a regular file")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    one_line_error(dse("train-policy", SPACE, "--out", tmp_path / "link"), "--out")
    assert listing(tmp_path) == {**before, "DIR": b"<dir>", "link": b"<link>"}  # nothing written, nothing left behind
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("out", ["/proc/x.zip", "/nonexistent-dir/x.safetensors"])
def test_an_output_that_cannot_be_written_is_one_line_before_training(out):
    one_line_error(dse("train-policy", SPACE, "--out", out), out, "--out")


@pytest.mark.parametrize(
    "args, field",
    [
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**32)], "--seed"),
        (["--twins", "0"], "--twins"),
        (["--twins", "100000"], "--twins"),
        (["--steps", "63"], "--steps"),
        (["--steps", str(10**12)], "--steps"),
        (["--budget", "0"], "--budget"),
    ],
)
def test_out_of_range_numbers_are_one_line_naming_the_option(tmp_path, args, field):
    line = one_line_error(dse("train-policy", SPACE, "--out", tmp_path / "p.safetensors", *args), field, "from")
    assert "out of range" in line
    assert list(tmp_path.iterdir()) == []
