"""``--warm-start`` across spaces: a 2-node reproducer's runs carried into the full-scale space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.forecast import Screen
from dse.rules import constraints
from dse.rules.space import load_space
from dse.rules.trial import resolve
from dse.study.generations import carry_points
from dse.study.loop import open_store

runner = CliRunner()
SPACES = Path(__file__).resolve().parent.parent / "conf" / "spaces"


@pytest.fixture(scope="module")
def reproducer(tmp_path_factory) -> Path:
    """The 70B 2-node reproducer's grid on the simulated backend."""
    out = tmp_path_factory.mktemp("repro") / "study"
    space = SPACES / "llama3_70b_2node_space.toml"
    r = runner.invoke(app, ["run", "--space", str(space), "--agent", "grid", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _ok_points(study: Path) -> list[dict]:
    store, _ = open_store(study)
    try:
        return [r.knobs for r in store.iter_records() if r.ok]
    finally:
        store.close()


def test_reproducer_seeds_the_full_space(reproducer):
    full = load_space(SPACES / "llama3_70b_space.toml")
    carried = carry_points(full, reproducer)
    assert len(carried.points) == 8  # the best 8, where the old warm start carried 0
    ok = _ok_points(reproducer)
    default_precision = resolve(full, {}).values["precision"]
    for p in carried.points:
        assert set(p) == set(full.knobs) and constraints.check(resolve(full, p)) is None
        assert Screen(full).reason(resolve(full, p)) is None  # launched at full scale, not screened
        assert p["precision"] == default_precision  # the reproducer did not vary it: the target's value
        assert {k: v for k, v in p.items() if k != "precision"} in ok  # the rest is a point the reproducer ran ok
    c = carried
    assert c.screened > 0  # the reproducer's small layouts that would not fit at 8 nodes stayed behind
    assert c.trials == c.not_ok + c.unlisted + c.duplicates + c.invalid + c.screened + c.beyond + len(c.points)
    assert c.line(reproducer, "at 8 nodes").startswith(f"warm start: carried 8 of {c.trials} points from ")


def test_unlisted_values_and_layouts_invalid_at_the_target_scale_are_dropped(reproducer, tmp_path):
    text = (SPACES / "llama3_70b_space.toml").read_text()
    text = text.replace("num_nodes = 8", "num_nodes = 1").replace("tp = [1, 2, 4, 8]", "tp = [2, 4]")
    (tmp_path / "one_node.toml").write_text(text)
    small = load_space(tmp_path / "one_node.toml")
    carried = carry_points(small, reproducer, top=1000)
    ok = _ok_points(reproducer)
    assert carried.unlisted == sum(p["tp"] == 8 for p in ok) > 0
    assert carried.invalid > 0  # e.g. tp 4 x pp 4 needs 16 GPUs, one node has 8
    assert all(p["tp"] in (2, 4) and constraints.check(resolve(small, p)) is None for p in carried.points)
    line = carried.line(reproducer, "at 1 nodes of h100")
    assert (
        f"{carried.unlisted} with a value not listed here" in line and f"{carried.invalid} invalid at 1 nodes" in line
    )


def test_run_says_what_it_carried(reproducer, tmp_path):
    full = SPACES / "llama3_70b_space.toml"
    out = tmp_path / "full"
    args = ["run", "--space", str(full), "--warm-start", str(reproducer), "--agent", "random", "--trials", "8"]
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "warm start: carried 8 of 88 points from" in r.output
    seeds = carry_points(load_space(full), reproducer).points
    store, _ = open_store(out)
    try:
        ran = [x.knobs for x in sorted(store.iter_records(), key=lambda x: x.number)]
    finally:
        store.close()
    # the study's baseline (the recipe's layout) runs first, then the carried points, best first
    assert ran[0] == json.loads((out / "dse.json").read_text())["baseline"]["knobs"]
    carried = [p for p in seeds if p != ran[0]]  # a carried point that is the baseline ran once, as the baseline
    assert ran[1:] == carried[: len(ran) - 1]  # as many as the budget of 8 leaves
