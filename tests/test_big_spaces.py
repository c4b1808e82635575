"""Spaces of 10^12 to 2^71 raw points (issue 11, item 10): counted with Python integers, sampled without
enumerating, and refused with the count where a command would walk every point (dse.rules.space.WALK_LIMIT)."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import pytest
from gymnasium import spaces
from typer.testing import CliRunner

from dse.agents.grid import GridAgent
from dse.agents.optuna_agent import OptunaAgent
from dse.agents.random import MAX_INVALID_DRAWS, RandomAgent
from dse.cli import app
from dse.errors import UserError
from dse.rules.counting import count_valid
from dse.rules.space import WALK_LIMIT, load_space

# A small core whose validity varies (tp 3 and 6 divide neither 8 GPUs nor 32 heads; pp 4 with mbs 4...),
# times environment knobs that no rule looks at: the valid count of the big space is the core's times theirs.
CORE = {"tp": [1, 2, 3, 4, 6, 8], "pp": [1, 2, 4], "mbs": [1, 2, 4]}


def _toml_value(v) -> str:
    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()


def write_space(
    path, knobs: dict, *, env_knobs: int = 0, env_values: int = 0, settings: dict | None = None, name: str = "big"
):
    env = {f"env.NCCL_K{i}": list(range(env_values)) for i in range(env_knobs)}
    lines = [
        f'name = "{name}"',
        'recipe = "llama3_8b"',
        'system = "h100"',
        "num_nodes = 1",
        "",
        "[settings]",
        "gbs = 128",
        "max_steps = 5",
    ]
    lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in (settings or {}).items()]
    lines += ["", "[knobs]"] + [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in {**knobs, **env}.items()]
    lines += ["", "[backend]", 'kind = "sim"', 'payload = "sim"', ""]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.parametrize("hits,n", [(0, 20_000), (6_667, 20_000), (20_000, 20_000), (1, 3)])
def test_wilson_interval_is_the_score_interval(hits, n):
    """dse.rules.counting.wilson is Wilson's score interval at 95% (z = 1.96): centre (p + z²/2n) / (1 + z²/n), half-width
    z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n), within [0, 1]."""
    from dse.rules.counting import wilson

    z, p = 1.959963984540054, hits / n
    denom = 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / denom, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo, hi = wilson(hits, n)
    assert (lo, hi) == pytest.approx((max(0.0, centre - half), min(1.0, centre + half)), rel=1e-12, abs=1e-15)
    assert 0.0 <= lo <= p <= hi <= 1.0


def test_space_of_a_trillion_points_is_estimated_by_sampling_and_says_so(runner, tmp_path):
    core = count_valid(load_space(write_space(tmp_path / "core.toml", CORE)))
    assert core.exact and 0 < core.valid < core.raw
    f = write_space(tmp_path / "big.toml", CORE, env_knobs=11, env_values=10)
    r = runner.invoke(app, ["space", str(f), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["raw"] == core.raw * 10**11 and data["exact"] is False and data["samples"] > 0
    lo, hi = data["valid_ci95"]
    truth, p, n = core.valid * 10**11, core.valid / core.raw, data["samples"]
    se = math.sqrt(p * (1 - p) / n) * data["raw"]  # the estimate's standard error
    assert abs(data["valid"] - truth) < 4 * se and lo < data["valid"] < hi
    assert 3 * se < hi - lo < 5 * se  # a 95% interval is +-1.96 standard errors
    assert set(data["rejected_by_rule"]) <= set(core.by_rule) and data["rejected_by_rule"]
    text = runner.invoke(app, ["space", str(f)])
    assert text.exit_code == 0 and "estimated from 20,000 seeded uniform draws" in text.stdout.replace("\n", " ")
    again = json.loads(runner.invoke(app, ["space", str(f), "--json"]).stdout)
    assert again == data  # seeded: the same estimate every time


def test_space_beyond_2_63_points_counts_exactly_in_python_integers(runner, tmp_path):
    f = write_space(tmp_path / "huge.toml", {"tp": [1, 2]}, env_knobs=7, env_values=1024)
    data = json.loads(runner.invoke(app, ["space", str(f), "--json"]).stdout)
    assert data["raw"] == 2 * 1024**7 > 2**63 and data["valid"] > 0
    r = runner.invoke(app, ["validate", str(f)])
    assert r.exit_code == 0 and f"{2 * 1024**7} points" in r.stdout


def test_twin_of_a_space_too_large_to_walk_is_refused(runner, tmp_path):
    f = write_space(tmp_path / "big.toml", CORE, env_knobs=11, env_values=10)
    r = runner.invoke(app, ["space", str(f), "--twin-seed", "1"])
    assert r.exit_code == 2 and f"{54 * 10**11:,} raw points" in r.output and "Traceback" not in r.output


def test_grid_refuses_a_space_above_the_walk_limit_with_the_count(runner, tmp_path):
    f = write_space(tmp_path / "big.toml", CORE, env_knobs=11, env_values=10)
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", "--space", str(f), "--agent", "grid", "--out", str(out)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{54 * 10**11:,} raw points" in r.output and not out.exists()
    assert 'use agent "random" or "optuna" with [search] trials' in r.output  # the table name survives rich


def test_grid_on_an_all_invalid_space_is_refused_with_one_line(runner, tmp_path):
    # tp 3, 5, 6, 7 divide neither the 8 GPUs nor the 32 heads: no point is valid, and a study of it would launch
    # nothing: refused before anything is written, naming the rule
    f = write_space(tmp_path / "bad.toml", {"tp": [3, 5, 6, 7]}, env_knobs=3, env_values=20)
    r = runner.invoke(app, ["run", "--space", str(f), "--agent", "grid", "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "no valid point: each of the 32,000 raw points breaks a rule" in r.output.replace("\n", "")
    assert "world_divisible" in r.output and not (tmp_path / "out").exists()


def test_random_runs_its_trials_in_a_space_beyond_2_63_points(runner, tmp_path):
    f = write_space(tmp_path / "huge.toml", {"tp": [1, 2, 4]}, env_knobs=7, env_values=1024)
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", "--space", str(f), "--agent", "random", "--trials", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "3 new trials, 3 in the study" in r.stdout


def test_random_on_a_huge_all_invalid_space_stops_with_one_line(runner, tmp_path):
    f = write_space(tmp_path / "bad.toml", {"tp": [3, 5, 6, 7]}, env_knobs=12, env_values=10)
    r = runner.invoke(
        app, ["run", "--space", str(f), "--agent", "random", "--trials", "5", "--out", str(tmp_path / "out")]
    )
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert f"{MAX_INVALID_DRAWS:,} draws in a row found no new valid point among {4 * 10**12:,}" in out
    assert "0 new trials" in out


def _dict_space(sizes):
    return spaces.Dict(OrderedDict((f"k{i}", spaces.Discrete(n)) for i, n in enumerate(sizes)))


def test_random_samples_without_remembering_invalid_draws():
    agent = RandomAgent(_dict_space([1000] * 8), seed=3, action_mask=lambda a: False, max_invalid_draws=5000)
    assert agent.propose() is None and "5,000 draws in a row" in agent.stop_reason
    assert not agent._tried  # memory follows the proposals, not the draws


def test_random_sampling_is_seeded_distinct_and_uniform():
    sizes = [1024] * 7 + [3]  # 2^70 * 3 points
    a = RandomAgent(_dict_space(sizes), seed=1, action_mask=lambda act: True)
    got = [a.propose() for _ in range(3000)]
    b = RandomAgent(_dict_space(sizes), seed=1, action_mask=lambda act: True)
    assert [b.propose() for _ in range(50)] == got[:50]
    assert len({tuple(g.values()) for g in got}) == len(got)
    last = [g["k7"] for g in got]  # each knob is drawn uniformly: about 1,000 of each of its 3 values
    assert all(abs(last.count(v) - 1000) < 150 for v in range(3))
    top = [g["k0"] for g in got]
    assert sum(t < 512 for t in top) == pytest.approx(1500, abs=150)


def test_optuna_model_warm_start_refuses_a_space_it_cannot_rank():
    with pytest.raises(UserError, match=f"{1000**5:,} raw points"):
        OptunaAgent(_dict_space([1000] * 5), warm_start="model")


def test_grid_agent_accepts_the_walk_limit_and_refuses_one_more():
    GridAgent(_dict_space([10, WALK_LIMIT // 10]))
    with pytest.raises(UserError, match="a grid walks every point"):
        GridAgent(_dict_space([10, WALK_LIMIT // 10 + 1]))


def test_dry_run_refuses_a_huge_space_without_a_limit(runner, tmp_path):
    f = write_space(tmp_path / "big.toml", CORE, env_knobs=11, env_values=10)
    r = runner.invoke(app, ["dry-run", "--space", str(f), "--backend", "local", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--limit" in r.output and f"{54 * 10**11:,} raw points" in r.output


def test_dry_run_with_limit_walks_a_huge_space_lazily(runner, tmp_path):
    f = write_space(tmp_path / "big.toml", CORE, env_knobs=11, env_values=10)
    out = tmp_path / "o"
    r = runner.invoke(app, ["dry-run", "--space", str(f), "--backend", "local", "--out", str(out), "--limit", "2"])
    assert r.exit_code == 0, r.output
    assert len(list(out.glob("*/launch.sh"))) == 2 and "2 local script(s) written" in r.stdout


def test_dry_run_limit_on_a_space_invalid_for_its_first_points_stops_at_the_walk_limit(runner, tmp_path):
    # grid order: every tp = 3 point (the first half of 2 * 10^12) comes before any valid one
    f = write_space(tmp_path / "big.toml", {"tp": [3, 1]}, env_knobs=12, env_values=10)
    out = tmp_path / "o"
    r = runner.invoke(app, ["dry-run", "--space", str(f), "--backend", "local", "--out", str(out), "--limit", "1"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert f"stopped after the first {WALK_LIMIT:,} of {2 * 10**12:,} raw points" in text
    assert f"0 local script(s) written under {out}; {WALK_LIMIT} rejected" in text
    assert not list(out.glob("*/launch.sh"))


def test_twin_truth_of_a_trillion_point_space_is_calibrated_on_a_sample(runner, tmp_path):
    f = write_space(tmp_path / "big.toml", CORE, env_knobs=11, env_values=10)
    r = runner.invoke(
        app,
        [
            "run",
            "--space",
            str(f),
            "--agent",
            "random",
            "--trials",
            "2",
            "--twin-seed",
            "3",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "2 new trials" in r.stdout
