"""The README and the user guide read as documentation, not a lab notebook: the README stays short, its links
resolve in the repository, and no page carries an issue number, a date of work or a developer's machine path.
(`mkdocs build --strict`, run by .ci/run, checks the site's own links and anchors.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")), *(ROOT / "docs" / "examples").iterdir()]


def _check_links():
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "docs" / "check_links.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_link_checker_finds_broken_files_and_anchors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text('<a href="a/">A</a> <a href="a/#x">x</a> <a href="https://x.org/y">ext</a>')
    (tmp_path / "a" / "index.html").write_text(
        '<h2 id="x">x</h2><a href="../b/">B</a> <a href="/index.html#nope">n</a>'
    )
    assert _check_links().broken(tmp_path) == [
        "a/index.html: ../b/ (no such file)",
        "a/index.html: /index.html#nope (no such anchor)",
    ]


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == []


def test_every_guide_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    assert [p for p in pages if f": {p}\n" not in nav] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_lab_notebook(page):
    text = page.read_text()
    assert not re.search(r"\bissue \d", text, re.I), "an issue number"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a date"
    assert not re.search(r"/(?:work|root|home)/\w", text), "a machine path"
    assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", text), "a commit hash"
