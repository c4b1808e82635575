"""pytest plugin: the test services (a local Slurm cluster, a PostgreSQL server) that the tests reach.

``.ci/run`` starts both under one temporary root and exports where they are: ``DSE_TEST_SLURM_CONF`` (also
``SLURM_CONF``) and ``DSE_PG_URL``. Without them, a root user gets a private service of the session, started by
the same ``.ci/*/up.sh`` under a root of its own and stopped at the end; the tests never use a Slurm or a
PostgreSQL that merely answers (a login node's cluster, somebody's database). Where none can be had the tests
that need one are skipped, with the reason, on a developer machine; in CI (``CI=true``) that is a failure.

Tests marked ``slurm`` share the one cluster and measure what runs on it at once, so under pytest-xdist they
run on one worker (``xdist_group``, with ``--dist loadgroup``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

CI_DIR = Path(__file__).resolve().parent.parent / ".ci"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str):
    if _in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup`` a grouped test's id must carry its group, else xdist spreads the group over
    the workers without a word (pytest 9.2 with pytest-xdist 3.8: pytest-xdist issue 1386)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup lost the xdist_group of {len(lost)} tests ({lost[0]}): "
            "pytest-xdist cannot group under this pytest (see pyproject's test extra)"
        )


@contextmanager
def _private_service(kind: str, env_file: str) -> Iterator[dict[str, str] | None]:
    """Start ``.ci/<kind>/up.sh`` under a fresh root (as root only), yield the variables it exports, stop it."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix=f"dse-test-{kind}-"))
    try:
        r = subprocess.run(
            ["bash", str(CI_DIR / kind / "up.sh"), str(root)], capture_output=True, text=True, timeout=900
        )
        if r.returncode != 0:
            _unavailable(
                f"could not start a private {kind} ({CI_DIR / kind / 'up.sh'}): {(r.stdout + r.stderr)[-2000:]}"
            )
        lines = (root / kind / env_file).read_text().splitlines()
        yield dict(line.removeprefix("export ").split("=", 1) for line in lines if line.startswith("export "))
    finally:
        subprocess.run(["bash", str(CI_DIR / kind / "down.sh"), str(root)], capture_output=True, timeout=300)
        shutil.rmtree(root, ignore_errors=True)


def _service_env(stack: ExitStack, kind: str, var: str, how: str) -> str:
    """``var`` from the environment (.ci/run), else from a private service entered on ``stack``."""
    if var in os.environ:
        return os.environ[var]
    env = stack.enter_context(_private_service(kind, "env.sh"))
    if env is None:
        _unavailable(f"no {kind} for the tests ({var} unset) and starting one needs root: {how}")
    return env[var]


@pytest.fixture(scope="session")
def slurm_cluster():
    """The test cluster (node names as sinfo lists them). The payload's ``python`` is this interpreter."""
    if shutil.which("sbatch") is None:
        _unavailable("Slurm is not installed (no sbatch on PATH); .ci/run installs and starts one")
    with ExitStack() as stack:
        conf = _service_env(stack, "slurm", "DSE_TEST_SLURM_CONF", "bash .ci/slurm/up.sh ROOT; . ROOT/slurm/env.sh")
        old = {k: os.environ.get(k) for k in ("PATH", "SLURM_CONF")}
        os.environ["SLURM_CONF"] = conf  # sbatch, squeue, sacct, scancel and the jobs all read it
        # sbatch exports the submitting environment: put this interpreter first so the job's `python` is it
        os.environ["PATH"] = f"{Path(sys.executable).parent}:{old['PATH'] or ''}"
        try:
            nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
            if not nodes:
                _unavailable(f"the test cluster of {conf} lists no nodes (sinfo)")
            yield sorted(set(nodes))
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="session")
def pg_server():
    """The URL of the test PostgreSQL server (``DSE_PG_URL``, else a private one for the session)."""
    with ExitStack() as stack:
        yield _service_env(stack, "postgres", "DSE_PG_URL", "bash .ci/postgres/up.sh ROOT; . ROOT/postgres/env.sh")
