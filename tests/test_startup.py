"""A command starts without nemo-run: only rendering a Slurm script or a local launch through nemo-run imports it
(seconds), and a refused study is refused before its cost is predicted."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

from dse.errors import UserError
from dse.rules.space import load_space
from dse.study import loop as study_mod
from tests.helpers import SMALL_SPACE, write_space

ROOT = Path(__file__).resolve().parent.parent


def _modules_after(code: str) -> set[str]:
    """The top-level modules imported after running ``code`` in a fresh interpreter."""
    probe = code + "\nimport sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(r.stdout.split())


def test_importing_the_cli_imports_no_nemo_run():
    assert "nemo_run" not in _modules_after("import dse.cli")


@pytest.mark.parametrize("backend", ["sim", "slurm"])
def test_validate_checks_the_launch_scripts_without_nemo_run(tmp_path, backend):
    """``dse validate`` checks every script a study writes (best/'s Slurm script included) with dse's own checks;
    nemo-run, which only renders them, is not imported."""
    path = write_space(tmp_path, SMALL_SPACE + f'\n[backend]\nkind = "{backend}"\n')
    code = f"from dse.cli import app\napp(['validate', {str(path)!r}], standalone_mode=False)\nprint('validated')"
    mods = _modules_after(code)
    assert "validated" in mods and "nemo_run" not in mods


def test_a_directory_in_use_is_refused_before_the_cost_is_predicted(tmp_path):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    predicted = []
    with open(out / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # another dse run holds the directory
        with pytest.raises(UserError, match="in use by another dse run"):
            study_mod.run_study(
                space, study_mod.Request(out_dir=out, trials=1, on_start=lambda cost: predicted.append(1))
            )
    assert predicted == []


def test_a_directory_holding_a_study_is_refused_before_the_cost_is_predicted(tmp_path):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    study_mod.run_study(space, study_mod.Request(out_dir=out, trials=1))
    predicted = []
    with pytest.raises(UserError, match="already holds a study"):
        study_mod.run_study(space, study_mod.Request(out_dir=out, trials=1, on_start=lambda cost: predicted.append(1)))
    assert predicted == []
