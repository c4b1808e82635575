"""The generated pages of the documentation (docs/reference/, docs/examples/) are what docs/gen.py makes from the
code today: a help text, a knob, a rule, a GPU figure or a model constant changed without regenerating them
fails here. Regenerate with ``python docs/gen.py``."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from dse.logs import parse

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
assert _spec and _spec.loader
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def _diff(pages: dict[str, str]) -> list[str]:
    return [f"docs/{p} is stale: run `python docs/gen.py`" for p in gen.stale(pages, ROOT / "docs")]


def test_reference_pages_are_current():
    assert _diff(gen.generate("reference")) == []


# the examples run studies on the simulated backend (about half a minute on one core): a worker of their own
@pytest.mark.xdist_group("docs_examples")
def test_example_outputs_are_current():
    assert _diff(gen.generate("examples")) == []


def test_every_status_is_explained():
    assert tuple(gen.STATUS_MEANING) == parse.STATUSES


def test_stale_page_is_caught(tmp_path):
    """The check compares text: a page that differs in one character, or is missing, is stale."""
    pages = {"reference/x.md": "a\n", "reference/y.md": "b\n"}
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "x.md").write_text("a \n")
    assert gen.stale(pages, tmp_path) == ["reference/x.md", "reference/y.md"]
    (tmp_path / "reference" / "x.md").write_text("a\n")
    assert gen.stale(pages, tmp_path) == ["reference/y.md"]


def test_examples_name_no_machine_path():
    for page in (ROOT / "docs" / "examples").iterdir():
        text = page.read_text()
        assert "/tmp/" not in text and "/home/" not in text and "/root" not in text and "/work/" not in text, page


def test_readme_and_results_list_every_column_the_leaderboard_csv_has():
    """The columns of a study's leaderboard.csv as docs/gen.py's 2-node grid wrote them (knobs aside, which are the
    space's own): each is named in the README's paragraph on the CSV and in results.md, so neither goes stale."""
    header = (ROOT / "docs" / "examples" / "leaderboard-columns.txt").read_text().strip().split(", ")
    knob_columns = {"tp", "pp", "vp", "cp", "mbs", "recompute"}  # what conf/spaces/llama3_70b_2node_space varies
    fixed = [c for c in header if c not in knob_columns]
    assert {"backend", "truth", "calibration", "mfu", "num_gpus"} <= set(fixed)
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("**The leaderboard CSV.**") :].split("\n\n", 1)[0]
    results = (ROOT / "docs" / "results.md").read_text()
    for column in fixed:
        named = re.compile(rf"\b{column}\b")  # a whole name: gpu is not gpu_hours
        assert named.search(paragraph), f"README's CSV paragraph omits {column}"
        assert named.search(results), f"results.md omits {column}"
