"""A study is one space: ``dse.json`` keeps a fingerprint of what defines it, and ``--resume`` with a
different one is refused in one line naming the fields that differ; what only steers the search may change."""

from __future__ import annotations

import json

import pytest

from dse.study.outdir import META, fingerprint_changes
from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space

SYSTEM = 'gpu = "h100"\ngpus_per_node = 8\nnvlink_domain = 8\n[slurm]\ncontainer_image = "nvcr.io#nvidia/nemo:25.09"\n'
BASE = SMALL_SPACE.replace('agent = "grid"', 'agent = "random"')


def _study(tmp_path, text: str = BASE):
    path = write_space(tmp_path, text)
    out = tmp_path / "out"
    r = dse("run", "--space", path, "--out", out, "--trials", "2")
    assert r.exit_code == 0, r.output
    return path, out


@pytest.mark.parametrize(
    "old,new,field",
    [
        ('system = "h100"', 'system = "h200"', "system.gpu"),
        ('recipe = "llama3_70b_16l"', 'recipe = "llama3_8b"', "recipe"),
        ("num_nodes = 2", "num_nodes = 4", "num_nodes"),
        ("gbs = 32", "gbs = 64", "settings.gbs"),
        ('metric = "tflops_per_gpu"', 'metric = "step_time_s"', "objective.metric"),
        ("[search]", '[backend]\ntruth = "twin"\n\n[search]', "truth"),
    ],
)
def test_resume_with_a_different_space_is_refused_naming_the_field(tmp_path, old, new, field):
    path, out = _study(tmp_path)
    write_space(tmp_path, BASE.replace(old, new))
    line = one_line_error(dse("run", "--space", path, "--out", out, "--resume"), field, "--resume")
    assert "fresh --out" in line
    assert json.loads((out / META).read_text())["fingerprint"]["fields"]["num_nodes"] == 2  # untouched


def test_resume_with_another_backend_is_refused(tmp_path):
    path, out = _study(tmp_path)
    one_line_error(dse("run", "--space", path, "--out", out, "--resume", "--backend", "local"), "backend")


def test_budget_parallelism_agent_and_seed_may_change_on_resume(tmp_path):
    path, out = _study(tmp_path)
    changed = BASE.replace('agent = "random"', 'agent = "optuna"').replace("seed = 0", "seed = 7")
    write_space(tmp_path, changed)
    r = dse("run", "--space", path, "--out", out, "--resume", "--trials", "4", "--parallel", "2")
    assert r.exit_code == 0, r.output


def test_the_system_is_its_content_not_its_file(tmp_path):
    sysfile = tmp_path / "mine.toml"
    sysfile.write_text(SYSTEM)
    path, out = _study(tmp_path, BASE.replace('system = "h100"', f'system = "{sysfile}"'))
    moved = tmp_path / "renamed.toml"
    sysfile.rename(moved)
    write_space(tmp_path, BASE.replace('system = "h100"', f'system = "{moved}"'))
    assert dse("run", "--space", path, "--out", out, "--resume", "--trials", "3").exit_code == 0
    moved.write_text(SYSTEM.replace("nvlink_domain = 8", "nvlink_domain = 8\nscaleout_gbps = 100"))
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "system.scaleout_gbps")


def test_an_old_study_without_a_fingerprint_is_accepted_and_given_one(tmp_path):
    path, out = _study(tmp_path)
    meta = json.loads((out / META).read_text())
    del meta["fingerprint"]
    (out / META).write_text(json.dumps(meta))
    r = dse("run", "--space", path, "--out", out, "--resume", "--trials", "3")
    assert r.exit_code == 0, r.output
    assert "no fingerprint" in r.stderr
    assert json.loads((out / META).read_text())["fingerprint"]["fields"]["recipe"] == "llama3_70b_16l"
    write_space(tmp_path, BASE.replace("gbs = 32", "gbs = 64"))  # now it is checked
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "settings.gbs")


def test_changes_are_named_by_dotted_path():
    old = {"a": 1, "system": {"gpu": "h100", "slurm": {"container_image": "x"}}, "gone": 1}
    new = {"a": 1, "system": {"gpu": "h200", "slurm": {"container_image": "y"}}, "added": 2}
    assert fingerprint_changes(old, new) == ["added", "gone", "system.gpu", "system.slurm.container_image"]


@pytest.mark.parametrize("edit", [lambda m: m.pop("knobs"), lambda m: m.update(knobs=[1]), lambda m: m.clear()])
def test_a_damaged_dse_json_is_one_line_naming_it(tmp_path, edit):
    path, out = _study(tmp_path)
    meta = json.loads((out / META).read_text())
    edit(meta)
    (out / META).write_text(json.dumps(meta))
    for args in (("run", "--space", path, "--out", out, "--resume"), ("leaderboard", out)):
        one_line_error(dse(*args), "dse.json")


def _forget_stored_fingerprint(out):
    """Make the study look as an older dse left it: no fingerprint in its store."""
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{out / 'study.db'}")
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE dse_fingerprints"))
    engine.dispose()


def _edit_meta(out, edit):
    meta = json.loads((out / META).read_text())
    edit(meta)
    (out / META).write_text(json.dumps(meta))


def test_a_dse_json_without_fingerprint_is_checked_against_the_store(tmp_path):
    path, out = _study(tmp_path)
    _edit_meta(out, lambda m: [m.pop("fingerprint"), m.pop("gpu")])
    write_space(tmp_path, BASE.replace('system = "h100"', 'system = "b200"'))
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "system.gpu", "--resume")


def test_an_older_study_is_checked_against_the_gpus_its_trials_ran_on(tmp_path):
    path, out = _study(tmp_path)
    _forget_stored_fingerprint(out)
    _edit_meta(out, lambda m: [m.pop("fingerprint"), m.pop("gpu")])
    write_space(tmp_path, BASE.replace('system = "h100"', 'system = "b200"'))
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "trials ran on h100", "b200")
    assert "fingerprint" not in json.loads((out / META).read_text())  # nothing recorded for a refused resume


def test_an_older_study_gains_a_stored_fingerprint_at_its_first_resume(tmp_path):
    path, out = _study(tmp_path)
    _forget_stored_fingerprint(out)
    assert dse("run", "--space", path, "--out", out, "--resume", "--trials", "3").exit_code == 0
    _edit_meta(out, lambda m: m.pop("fingerprint"))
    write_space(tmp_path, BASE.replace("gbs = 32", "gbs = 64"))
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "settings.gbs")


def test_an_edited_fingerprint_under_the_old_hash_is_refused(tmp_path):
    path, out = _study(tmp_path)
    _edit_meta(out, lambda m: m["fingerprint"]["fields"]["system"].update(gpu="b200"))
    _edit_meta(out, lambda m: m.update(gpu="b200"))
    write_space(tmp_path, BASE.replace('system = "h100"', 'system = "b200"'))
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "system.gpu")


def test_turning_early_stop_on_in_a_resume_is_refused(tmp_path):
    path, out = _study(tmp_path)
    write_space(tmp_path, BASE.replace("[search]", "[backend.early_stop]\nenabled = true\n\n[search]"))
    one_line_error(dse("run", "--space", path, "--out", out, "--resume"), "early_stop")
