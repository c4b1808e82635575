"""Everything a study will need is checked before its first trial: a value that would fail every launch, or
``best/`` at the study's end, is refused in one line (exit 2) and nothing runs or is written."""

from __future__ import annotations

import pytest

from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space

SYSTEM_LINE = 'system = "h100"'


@pytest.mark.parametrize(
    "system,field,needed",
    [
        # the README's inline system: best/'s Slurm script needs an image, which it does not give
        ('{gpu = "gb200", gpus_per_node = 4, nvlink_domain = 72}', "slurm.container_image", "best/"),
        ('{gpu = "h100", gpus_per_node = 8, container = "abc"}', "system.container", "every trial's launch"),
        ('{gpu = "h100", gpus_per_node = 8, container = "25.09\\n"}', "system.container", "every trial's launch"),
    ],
)
def test_a_study_that_would_fail_at_launch_or_at_its_end_does_not_start(tmp_path, system, field, needed):
    path = write_space(tmp_path, SMALL_SPACE.replace(SYSTEM_LINE, f"system = {system}"))
    out = tmp_path / "out"
    line = one_line_error(dse("run", "--space", path, "--out", out), field, needed, "before the first trial")
    assert "space.toml" in line
    assert not out.exists()  # nothing ran, nothing written


@pytest.mark.parametrize(
    "replace,field",
    [
        ((SYSTEM_LINE, 'system = {gpu = "gb200", gpus_per_node = 4, nvlink_domain = 72}'), "slurm.container_image"),
        ((SYSTEM_LINE, 'system = {gpu = "h100", gpus_per_node = 8, container = "abc"}'), "system.container"),
        (('agent = "grid"', 'agent = "optuna"\nsampler = "nosuch"'), "sampler"),
    ],
)
def test_validate_refuses_what_run_would_refuse_at_its_start(tmp_path, replace, field):
    """``dse validate`` runs ``dse run``'s checks before the first trial: a space it accepts starts."""
    text = SMALL_SPACE.replace(*replace)
    assert text != SMALL_SPACE
    line = one_line_error(dse("validate", write_space(tmp_path, text)), field)
    assert "Traceback" not in line


def test_a_system_without_a_container_passes_the_check(tmp_path):
    system = '{gpu = "gb200", gpus_per_node = 4, nvlink_domain = 72, slurm = {use_container = false}}'
    path = write_space(tmp_path, SMALL_SPACE.replace(SYSTEM_LINE, f"system = {system}"))
    r = dse("run", "--space", path, "--out", tmp_path / "out", "--agent", "random", "--trials", "2")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "best" / "launch.sbatch").exists()


def test_the_backends_own_script_is_checked_first(tmp_path):
    system = '{gpu = "gb200", gpus_per_node = 4, nvlink_domain = 72}'  # no image: every sbatch script fails
    text = SMALL_SPACE.replace(SYSTEM_LINE, f"system = {system}") + '\n[backend]\nkind = "slurm"\n'
    path = write_space(tmp_path, text)
    one_line_error(dse("run", "--space", path, "--out", tmp_path / "out"), "slurm.container_image", "every trial's")
    assert not (tmp_path / "out").exists()
