"""One space over several GPU generations (``dse run --systems``) and ``dse compare``."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.errors import UserError
from dse.rules.space import load_space
from dse.study.generations import parse_systems, space_for
from tests.helpers import write_space

runner = CliRunner()


def test_every_generation_gets_the_same_gpu_count(tmp_path):
    space = load_space(write_space(tmp_path))  # 2 nodes of 8 H100
    gb = space_for(space, "gb200")
    assert (gb.system.gpu, gb.num_nodes, gb.system.gpus_per_node) == ("gb200", 4, 4)
    assert space_for(space, "b200").num_nodes == 2 and gb.knobs == space.knobs
    odd = tmp_path / "odd.toml"
    odd.write_text('name = "odd"\ngpu = "b200"\ngpus_per_node = 3\n')
    with pytest.raises(UserError, match="do not fill whole nodes"):
        space_for(space, str(odd))
    with pytest.raises(UserError, match="named twice"):
        parse_systems("h100,b200,h100")


def test_unknown_system_is_one_line_and_runs_nothing(tmp_path):
    out = tmp_path / "o"
    r = runner.invoke(app, ["run", "--space", str(write_space(tmp_path)), "--systems", "h100,b20", "--out", str(out)])
    assert r.exit_code == 2 and "b200" in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_run_systems_then_compare_and_resume(tmp_path):
    space = write_space(tmp_path)
    priced = tmp_path / "b200_priced.toml"
    priced.write_text(
        'name = "b200_priced"\ngpu = "b200"\nprice_per_gpu_hour = 5.0\n'
        '[slurm]\ncontainer_image = "nvcr.io#nvidia/nemo:25.09"\n'
    )
    out = tmp_path / "gen"
    args = [
        "run",
        "--space",
        str(space),
        "--systems",
        f"h100,{priced},gb200",
        "--out",
        str(out),
        "--agent",
        "random",
        "--seed",
        "1",
    ]
    r = runner.invoke(app, [*args, "--trials", "5"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "compare.csv")
    assert list(df.system) == ["h100", "b200_priced", "gb200"] and list(df.num_gpus) == [16, 16, 16]
    assert df.speedup[0] == pytest.approx(1.0)
    assert df.speedup[1] == pytest.approx(df.tokens_per_s[1] / df.tokens_per_s[0])
    assert df.tokens_per_s[2] == pytest.approx(df.tokens_per_s_per_gpu[2] * 16)
    assert df.cost_per_1b_tokens[1] == pytest.approx(df.gpu_hours_per_1b_tokens[1] * 5.0)
    assert df.cost_per_1b_tokens.isna()[[0, 2]].all()  # no price in those system files
    assert df.changed_knobs[0] == "(baseline)"
    board = {s: pd.read_csv(out / d / "leaderboard.csv") for s, d in [("h100", "h100"), ("gb200", "gb200")]}
    best = {s: b[b.status == "ok"].iloc[0] for s, b in board.items()}
    varied = [k for k in ("tp", "pp", "vp", "mbs") if best["h100"][k] != best["gb200"][k]]
    assert df.changed_knobs[2].startswith(", ".join(f"{k} {best['h100'][k]}->{best['gb200'][k]}" for k in varied))
    # every resolved knob that differs (recipe defaults applied), not only those the space varies
    layout = {s: json.loads((out / s / "best" / "best.json").read_text())["knobs"] for s in ("h100", "gb200")}
    rest = [k for k in layout["h100"] if k not in ("recipe", "gpu", "num_gpus", "tp", "pp", "vp", "mbs")]
    others = [f"{k} {layout['h100'][k]}->{layout['gb200'][k]}" for k in rest if layout["h100"][k] != layout["gb200"][k]]
    assert "num_nodes 2->4" in others  # 16 GPUs: 2 nodes of 8 H100, 4 of 4 GB200
    assert df.changed_knobs[2] == ", ".join([*(f"{k} {best['h100'][k]}->{best['gb200'][k]}" for k in varied), *others])
    assert list(df.backend) == ["sim"] * 3 and list(df.truth) == ["exact"] * 3 and list(df.calibration) == ["none"] * 3
    assert (out / "compare.html").exists() and (out / "h100" / "report.html").exists()
    # each sub-study resumes
    r = runner.invoke(app, [*args, "--trials", "7", "--resume"])
    assert r.exit_code == 0, r.output
    assert list(pd.read_csv(out / "compare.csv").trials) == [7, 7, 7]
    # dse compare over the same directories gives the same table
    r = runner.invoke(
        app, ["compare", str(out / "h100"), str(out / "b200_priced"), str(out / "gb200"), "--out", str(tmp_path / "c")]
    )
    assert r.exit_code == 0, r.output
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "c" / "compare.csv"), pd.read_csv(out / "compare.csv"))


def test_compare_of_a_directory_without_a_study_is_one_line(tmp_path):
    r = runner.invoke(app, ["compare", str(tmp_path)])
    assert r.exit_code == 2 and "not a dse output directory" in r.output


@pytest.mark.parametrize("agent", ["optuna", "random", "grid", "guided"])
def test_warm_start_runs_the_old_studys_best_valid_points_first(tmp_path, agent):
    from dse.rules import constraints
    from dse.rules.trial import resolve
    from dse.study.generations import warm_start_points

    space = write_space(tmp_path)
    old = tmp_path / "h100"
    assert (
        runner.invoke(
            app, ["run", "--space", str(space), "--out", str(old), "--agent", "random", "--trials", "12", "--seed", "2"]
        ).exit_code
        == 0
    )
    on_gb = space_for(load_space(space), "gb200")
    seeds = warm_start_points(on_gb, old, top=4)
    lb = pd.read_csv(old / "leaderboard.csv")
    ok = lb[lb.status == "ok"]
    expected = [{k: int(row[k]) for k in ("tp", "pp", "vp", "mbs")} for _, row in ok.iterrows()]
    expected = [p for p in expected if constraints.check(resolve(on_gb, p)) is None][:4]
    assert seeds == expected and len(seeds) == 4
    gb = tmp_path / "gen"
    args = [
        "run",
        "--space",
        str(space),
        "--systems",
        "gb200",
        "--out",
        str(gb),
        "--agent",
        agent,
        "--warm-start",
        str(old),
    ]
    r = runner.invoke(app, [*args, "--trials", "9"])
    assert r.exit_code == 0, r.output
    from dse.study.loop import open_store

    def knobs():  # launched trials in order (the budget counts launched runs)
        store, _ = open_store(gb / "gb200")
        recs = sorted(store.records(), key=lambda x: x.number)
        store.close()
        return [x.knobs for x in recs if x.status != "rejected"]

    first = knobs()
    all_seeds = warm_start_points(on_gb, old)
    assert len(all_seeds) >= 4 and first[: len(all_seeds)] == all_seeds  # the seeds ran first, best first
    assert len(first) == 9 and len({tuple(sorted(k.items())) for k in first}) == 9  # and no point twice
    r = runner.invoke(app, [*args, "--trials", "11", "--resume"])
    assert r.exit_code == 0, r.output
    again = knobs()
    assert again[:9] == first  # resumed: the seeds are not run again
    # two more runs, unless the guided agent stops by itself first (its stop line, per system, says so)
    assert len(again) == 11 or (agent == "guided" and 9 <= len(again) < 11 and "gb200: stopped:" in r.output), r.output


# DeepSeek-V3 as NVIDIA's H100 runs it, with DeepEP (moe_dispatcher = "flex") set once: the NeMo 2 payload's DeepEP
# does not run on GB300, so every point there breaks moe_dispatcher_supported; on B300 some points stay valid
DSV3 = """
name = "dsv3"
recipe = "deepseek_v3"
system = "h100"
num_nodes = 128

[settings]
seq_length = 4096
gbs = 8192
max_steps = 50
moe_dispatcher = "flex"

[knobs]
tp = [1, 2]
pp = [8, 16]
ep = [32, 64]
pp_first_layers = [4, 7]
pp_last_layers = [1, 6]

[search]
agent = "guided"
trials = 4
"""


def test_each_system_says_its_valid_points_and_the_rules_that_removed_the_rest(tmp_path):
    out = tmp_path / "gen"
    r = runner.invoke(
        app, ["run", "--space", str(write_space(tmp_path, DSV3)), "--systems", "h100,b300", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    from dse.rules.counting import count_valid

    for name in ("h100", "b300"):
        count = count_valid(space_for(load_space(write_space(tmp_path, DSV3)), name))
        assert 0 < count.valid < count.raw
        line = next(ln for ln in r.stderr.splitlines() if ln.startswith(f"{name}: {count.raw:,} raw points"))
        assert f"{count.valid:,} valid" in line and next(iter(count.by_rule)) in line, line


def test_a_system_with_no_valid_point_is_an_error_naming_it_and_the_rule_before_any_study(tmp_path):
    out = tmp_path / "gen"
    r = runner.invoke(
        app, ["run", "--space", str(write_space(tmp_path, DSV3)), "--systems", "h100,b300,gb300", "--out", str(out)]
    )
    assert r.exit_code == 2, r.output
    line = r.stderr.strip().splitlines()[-1]
    assert "gb300" in line and "no valid point" in line and "moe_dispatcher_supported" in line, line
    assert "moe_dispatcher=flex (the space's [settings])" in line
    assert not out.exists()  # checked before the first study: nothing ran


def test_compare_csv_keeps_integers_when_a_system_has_no_ok_trial(tmp_path):
    """A study with no ok trial has a blank row: its neighbours' integer columns stay integers in compare.csv."""
    from dse.results import compare

    out = tmp_path / "gen"
    r = runner.invoke(
        app,
        ["run", "--space", str(write_space(tmp_path)), "--systems", "h100,b200", "--out", str(out), "--trials", "3"],
    )
    assert r.exit_code == 0, r.output
    studies = compare.gather([out / "h100", out / "b200"])
    studies[1] = {**studies[1], "best": None}  # as a system whose every run failed
    compare.write(studies, tmp_path / "c")
    import csv

    rows = list(csv.DictReader((tmp_path / "c" / "compare.csv").read_text().splitlines()))
    assert rows[0]["num_gpus"] == "16" and rows[0]["best_trial"].isdigit() and rows[0]["trials"] == "3"
    assert rows[1]["num_gpus"] == "" and rows[1]["best_trial"] == "" and rows[1]["trials"] == "3"
    assert "<NA>" not in (tmp_path / "c" / "compare.html").read_text()
