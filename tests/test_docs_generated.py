"""The generated pages of the documentation (docs/reference/, docs/examples/) are what docs/gen.py makes from the
code today: a help text, a knob, a rule, a GPU figure or a model constant changed without regenerating them
fails here. Regenerate with ``python docs/gen.py``."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from dse.logs import parse

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
assert _spec and _spec.loader
gen = importlib.util.module_from_spec(_spec)
sys.modules["docs_gen"] = gen  # its dataclasses look their module up there
_spec.loader.exec_module(gen)


def _diff(pages: dict) -> list[str]:
    return [f"{gen.shown(p)} is stale: run `python docs/gen.py`" for p in gen.stale(pages, ROOT / "docs")]


def test_reference_pages_are_current():
    assert _diff(gen.generate("reference")) == []


# the examples run studies on the simulated backend (about half a minute on one core): a worker of their own
@pytest.mark.xdist_group("docs_examples")
def test_example_outputs_are_current():
    assert _diff(gen.generate("examples")) == []


def test_every_status_is_explained():
    assert tuple(gen.STATUS_MEANING) == tuple(s.value for s in parse.Status)


def test_stale_page_is_caught(tmp_path):
    """The check compares text: a page that differs in one character, or is missing, is stale."""
    pages = {"reference/x.md": "a\n", "reference/y.md": "b\n"}
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "x.md").write_text("a \n")
    assert gen.stale(pages, tmp_path) == ["reference/x.md", "reference/y.md"]
    (tmp_path / "reference" / "x.md").write_text("a\n")
    assert gen.stale(pages, tmp_path) == ["reference/y.md"]


def _png(width: int = 1, height: int = 1) -> bytes:
    """A tiny valid PNG (one grey pixel row per line) without any text chunk."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return gen.PNG + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_stale_picture_is_caught(tmp_path):
    """A picture is current only when it carries the stamp of the page it shows and the commands that made it: an
    unstamped screenshot (as docs/report.png was: an old study under another study's caption), one of another
    page or of other commands is stale; Plotly's random plot ids do not make it stale."""
    page = '<div id="0b7e6a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b">854.2 TFLOP/s</div>'
    picture = gen.Picture(page, ("dse run --space s.toml", "dse report runs/s"))
    png = tmp_path / "report.png"
    png.write_bytes(_png())
    assert gen.stale({"report.png": picture}, tmp_path) == ["report.png"]
    png.write_bytes(gen.png_with_text(_png(), gen.STAMP_KEY, picture.stamp))
    assert gen.stale({"report.png": picture}, tmp_path) == []
    assert gen.png_texts(png.read_bytes()) == {gen.STAMP_KEY: picture.stamp}
    same_page_new_ids = gen.Picture(page.replace("0b7e6a52", "9f00aa11"), picture.commands)
    assert gen.stale({"report.png": same_page_new_ids}, tmp_path) == []
    other_figure = gen.Picture(page.replace("854.2", "833.1"), picture.commands)
    other_study = gen.Picture(page, ("dse run --space s.toml", "dse report runs/other"))
    for changed in (other_figure, other_study):
        assert gen.stale({"report.png": changed}, tmp_path) == ["report.png"]


def test_stale_region_is_caught(tmp_path):
    """A region is the lines between its markers; the author's lines around it are kept, and text between the
    markers other than the generated text is stale."""
    region = gen.Region("# runs: 54\n", "# begin", "# end")
    f = tmp_path / "space.toml"
    f.write_text('name = "x"\n# begin (generated)\n# runs: 50\n# end\n[search]\n')
    assert gen.stale({"space.toml": region}, tmp_path) == ["space.toml"]
    f.write_text(region.splice(f.read_text(), "space.toml"))
    assert f.read_text() == 'name = "x"\n# begin (generated)\n# runs: 54\n# end\n[search]\n'
    assert gen.stale({"space.toml": region}, tmp_path) == []
    with pytest.raises(SystemExit, match="expected one line starting with '# begin'"):
        region.splice("# runs: 54\n", "space.toml")


def test_the_report_picture_shows_the_study_its_captions_name():
    """docs/report.png is stamped with the quick start's command and the report command; the README shows that
    report command right above the picture, and results.md names both commands beside it."""
    stamp = gen.png_texts((ROOT / "docs" / "report.png").read_bytes()).get(gen.STAMP_KEY, "")
    assert stamp.startswith(f"{gen.QUICKSTART}; {gen.REPORT}; page sha256 "), stamp
    readme = (ROOT / "README.md").read_text()
    before = readme[: readme.index("](docs/report.png)")]
    assert before.rsplit("```bash\n", 1)[1].split("\n", 1)[0] == gen.REPORT
    assert "quick-start study" in before.rsplit("\n", 2)[-1]
    results = (ROOT / "docs" / "results.md").read_text()
    near = " ".join(" ".join(results[: results.index("](report.png)")].rsplit("\n\n", 2)[-2:]).split())
    assert f"`{gen.QUICKSTART}`" in near and f"`{gen.REPORT}`" in near, near


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
