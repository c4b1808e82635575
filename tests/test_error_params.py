"""The library names what was bad by its own words (a file's field, or the argument of the call, ``param``); only
the command line names flags: the same error reads ``storage: ...`` from the library and ``--storage: ...`` from
``dse``."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dse.cli import _as_flag, app
from dse.errors import UserError
from dse.study.store import check_url


def test_the_library_names_its_parameter_and_no_flag():
    with pytest.raises(UserError) as e:
        check_url("not-a-url")
    assert e.value.param == "storage" and e.value.field is None
    assert str(e.value).startswith("storage: 'not-a-url' is not an SQL storage URL")


def test_the_command_line_names_the_flag(tmp_path):
    r = CliRunner().invoke(
        app, ["run", "--space", "llama3_70b_2node_space", "--storage", "not-a-url", "--out", str(tmp_path / "o")]
    )
    assert r.exit_code == 2
    assert "--storage: 'not-a-url' is not an SQL storage URL" in r.output


def test_a_parameter_becomes_its_option_and_a_field_stays():
    flagged = _as_flag(UserError("no such study", file="runs/x", param="dataset_id"))
    assert str(flagged) == "runs/x: --dataset-id: no such study"
    kept = UserError("not a number", file="space.toml", field="search.budget")
    assert _as_flag(kept) is kept


def test_another_parameter_a_message_names_is_a_name_here_and_a_flag_there(tmp_path):
    e = UserError("already holds a study; pass {param:resume} to continue it", file="runs/x", param="out")
    assert str(e) == "runs/x: out: already holds a study; pass `resume` to continue it"
    assert str(_as_flag(e)) == "runs/x: --out: already holds a study; pass --resume to continue it"
    fielded = UserError("goes with {param:lease_s}", file="s.toml", field="search.parallel")
    assert str(_as_flag(fielded)) == "s.toml: search.parallel: goes with --lease-s"
