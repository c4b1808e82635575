"""pytest plugin: a session fixture that reuses the local Slurm cluster or starts it with .ci/slurm/up.sh.

Without Slurm installed the tests that need it are skipped, with the reason, on a developer machine; in CI
(``CI=true``) a missing or broken Slurm is a failure, never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UP = Path(__file__).resolve().parent.parent / ".ci" / "slurm" / "up.sh"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str):
    if _in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def _ready() -> bool:
    try:
        s = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
        a = subprocess.run(["sacct", "-n", "-X", "-S", "now-1minute"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return s.returncode == 0 and any(w in s.stdout for w in ("idle", "mixed", "allocated")) and a.returncode == 0


@pytest.fixture(scope="session")
def slurm_cluster():
    """The running local cluster (nodes as sinfo lists them). The payload's ``python`` is this interpreter."""
    if shutil.which("sbatch") is None:
        _unavailable("Slurm is not installed (no sbatch on PATH); start one with `sudo .ci/slurm/up.sh`")
    if not _ready():
        if os.geteuid() != 0:
            _unavailable("the local Slurm cluster is not running and starting it needs root (.ci/slurm/up.sh)")
        r = subprocess.run(["bash", str(UP)], capture_output=True, text=True, timeout=900)
        if r.returncode != 0 or not _ready():
            _unavailable(f"could not start the local Slurm cluster: {(r.stdout + r.stderr)[-2000:]}")
    # sbatch exports the submitting environment: put this interpreter first so the job's `python` is it
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{old_path}"
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    yield sorted(set(nodes))
    os.environ["PATH"] = old_path
