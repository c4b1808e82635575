"""Extension points: registries of agents and backends, per-agent options, backend launch scripts."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from gymnasium import spaces
from typer.testing import CliRunner

from dse import registry as reg
from dse.agents.base import Agent, NoOptions, load_agents, make_agent
from dse.backends import Backend, load_backends
from dse.cli import app
from dse.errors import UserError
from tests.helpers import SMALL_SPACE, write_space

SPACE = spaces.Dict(OrderedDict(tp=spaces.Discrete(3), pp=spaces.Discrete(2)))


class DepthOptions(NoOptions):
    depth: int = 2


class Deep(Agent):
    name = "deep"
    Options = DepthOptions

    def __init__(self, action_space, *, depth: int = 2, **kw):
        super().__init__(action_space, **kw)
        self.depth = depth

    def propose(self):
        return None


def test_an_agent_declares_and_validates_its_own_options():
    registry = {**load_agents(), "deep": lambda: Deep}
    assert make_agent("deep", registry, SPACE, depth=5).depth == 5
    with pytest.raises(UserError, match="search.options.depth"):
        make_agent("deep", registry, SPACE, depth="many")
    with pytest.raises(UserError, match=r"has no option 'width'; its options: depth"):
        make_agent("deep", registry, SPACE, width=1)
    with pytest.raises(UserError, match="has no option 'depth'; its options: none"):
        make_agent("grid", registry, SPACE, depth=1)


def test_registry_entries_are_type_checked():
    with pytest.raises(UserError, match="not a dse.agents.base.Agent subclass"):
        make_agent("bad", {"bad": lambda: dict}, SPACE)
    with pytest.raises(UserError, match="unknown backend 'slrum'.*did you mean 'slurm'"):
        reg.get(load_backends(), "slrum", Backend, group=reg.BACKENDS, field="--backend")


def test_search_options_reach_the_optuna_sampler(tmp_path):
    path = write_space(
        tmp_path, SMALL_SPACE.replace('agent = "grid"', 'agent = "optuna"') + '\n[search.options]\nsampler = "random"\n'
    )
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "--space", str(path), "--out", str(out), "--trials", "3"])
    assert res.exit_code == 0, res.output
    import json

    meta = json.loads((out / "dse.json").read_text())
    assert meta["sampler"] == "random" and meta["options"] == {"sampler": "random"}


def test_a_bad_search_option_is_one_line_before_anything_is_written(tmp_path):
    path = write_space(tmp_path, SMALL_SPACE + "\n[search.options]\ndepth = 3\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "--space", str(path), "--out", str(out)])
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "search.options.depth" in errors[0]
    assert not out.exists()


def test_a_space_names_its_backend_from_the_registry(tmp_path):
    path = write_space(tmp_path, SMALL_SPACE + '\n[backend]\nkind = "slrum"\n')
    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 2 and "backend.kind" in res.output and "did you mean 'slurm'" in res.output


def test_only_backends_that_write_a_script_can_dry_run(tmp_path):
    path = write_space(tmp_path)
    res = CliRunner().invoke(app, ["dry-run", "--space", str(path), "--backend", "sim", "--out", str(tmp_path / "d")])
    assert res.exit_code == 2 and "writes no launch script" in res.output and "slurm" in res.output
