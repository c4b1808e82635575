"""The test services' shell helpers (.ci/lib.sh): ports chosen free, and a stop that hits only what its own run
started (a PID recorded under another root, or reused by another program, is left alone)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parent.parent / ".ci" / "lib.sh"


def lib(script: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f". {LIB}; {script}"], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def sleeper(**env: str) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], env={**os.environ, **env})


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    ports = [int(p) for p in lib("free_ports 6").stdout.split()]
    assert len(ports) == len(set(ports)) == 6
    assert all(20000 <= p <= 32000 for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def test_stop_recorded_stops_only_what_its_root_started(tmp_path, procs):
    root, other = tmp_path / "root", tmp_path / "other"
    root.mkdir()
    ours = sleeper(DSE_TEST_ROOT=str(root / "slurm"))  # names this root in its environment, as the daemons do
    # recorded here too: a PID since reused by another program (another run's daemon)
    theirs = sleeper(DSE_TEST_ROOT=str(other / "slurm"))
    procs += [ours, theirs]
    (root / "pids").write_text(f"munged {ours.pid}\nslurmd-node1 {theirs.pid}\n")
    r = lib(f"stop_recorded {root}")
    assert r.returncode == 0, r.stderr
    assert ours.wait(timeout=20) is not None
    assert theirs.poll() is None  # still running
    assert not (root / "pids").exists()


def test_stop_recorded_with_a_prefix_keeps_the_other_records(tmp_path, procs):
    a, b = sleeper(R=str(tmp_path / "x")), sleeper(R=str(tmp_path / "x"))
    procs += [a, b]
    (tmp_path / "pids").write_text(f"slurmd-node1 {a.pid}\nslurmdbd {b.pid}\n")
    assert lib(f"stop_recorded {tmp_path} slurmd-").returncode == 0
    assert a.wait(timeout=20) is not None and b.poll() is None
    assert (tmp_path / "pids").read_text() == f"slurmdbd {b.pid}\n"
