"""``dse compare`` is honest: every resolved knob that differs, studies of different models refused, where the
figures come from, and a page whose changed knobs are never cut or scrolled away."""

from __future__ import annotations

import json
import re

import pandas as pd

from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space

SETTINGS = "[settings]\nseq_length = 4096\n"


def _study(tmp_path, name, text=SMALL_SPACE, *args):
    space = write_space(tmp_path, text, name=f"{name}.toml")
    out = tmp_path / name
    r = dse("run", "--space", space, "--out", out, "--trials", "4", *args)
    assert r.exit_code == 0, r.output
    return out


def test_studies_of_different_recipes_are_refused_in_one_line(tmp_path):
    a = _study(tmp_path, "a")
    b = _study(tmp_path, "b", SMALL_SPACE.replace('"llama3_70b_16l"', '"llama3_8b"'))
    r = dse("compare", a, b, "--out", tmp_path / "c")
    line = one_line_error(r, "different recipes", "llama3_70b_16l", "llama3_8b", "--allow-different-recipes")
    assert str(a) in line and str(b) in line
    assert not (tmp_path / "c").exists()
    r = dse("compare", a, b, "--out", tmp_path / "c", "--allow-different-recipes")
    assert r.exit_code == 0, r.output
    assert "warning: small: recipe llama3_8b, not the baseline's llama3_70b_16l" in r.stderr
    df = pd.read_csv(tmp_path / "c" / "compare.csv", keep_default_na=False)
    assert list(df.recipe) == ["llama3_70b_16l", "llama3_8b"]
    assert df.warning[0] == "" and "a different model" in df.warning[1]
    assert "Warning:</strong> small: recipe llama3_8b" in (tmp_path / "c" / "compare.html").read_text()


def test_changed_knobs_are_every_resolved_knob_not_only_the_varied_ones(tmp_path):
    a = _study(tmp_path, "a")
    b = _study(tmp_path, "b", SMALL_SPACE.replace(SETTINGS, SETTINGS + "fsdp = true\ncpu_offload_layers = 2\n"))
    best = {d.name: json.loads((d / "best" / "best.json").read_text()) for d in (a, b)}
    r = dse("compare", a, b, "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    changed = pd.read_csv(tmp_path / "c" / "compare.csv").changed_knobs[1]
    assert "fsdp False->True" in changed and "cpu_offload_layers 0->2" in changed
    va, vb = best["a"]["varied"], best["b"]["varied"]
    assert changed.startswith(", ".join(f"{k} {va[k]}->{vb[k]}" for k in ("tp", "pp", "vp", "mbs") if va[k] != vb[k]))
    # without best/best.json the layout is resolved again from the space file: the same list
    for d in (a, b):
        (d / "best" / "best.json").unlink()
    assert dse("compare", a, b, "--out", tmp_path / "d").exit_code == 0
    assert pd.read_csv(tmp_path / "d" / "compare.csv").changed_knobs[1] == changed
    # and without the space file either, only the varied knobs are known
    for d in (a, b):
        (tmp_path / f"{d.name}.toml").unlink()
    assert dse("compare", a, b, "--out", tmp_path / "e").exit_code == 0
    assert "fsdp" not in pd.read_csv(tmp_path / "e" / "compare.csv").changed_knobs[1]


def test_compare_csv_says_where_each_studys_figures_come_from(tmp_path):
    a = _study(tmp_path, "a")
    b = _study(tmp_path, "b", SMALL_SPACE + '\n[backend]\ntruth = "twin"\ntwin_seed = 3\n')
    measured = _study(tmp_path, "m")
    meta = json.loads((measured / "dse.json").read_text())
    meta["backend"] = "slurm"  # as a study run through Slurm records it
    meta["provenance"] = {"backend": "slurm", "truth": None, "calibration": None}
    (measured / "dse.json").write_text(json.dumps(meta))
    bare = _study(tmp_path, "bare")
    meta = json.loads((bare / "dse.json").read_text())
    for key in ("backend", "space", "fingerprint", "provenance"):  # a dse.json from an older dse: nothing to say
        meta.pop(key, None)
    (bare / "dse.json").write_text(json.dumps(meta))
    assert dse("compare", a, b, measured, bare, "--out", tmp_path / "c").exit_code == 0
    df = pd.read_csv(tmp_path / "c" / "compare.csv", keep_default_na=False)
    assert list(df.backend) == ["sim", "sim", "slurm", "unknown"]
    assert list(df.truth) == ["exact", "twin (seed 3)", "", ""]
    assert list(df.calibration) == ["none", "none", "", ""]


def test_the_page_wraps_the_changed_knobs_whole(tmp_path):
    a = _study(tmp_path, "a")
    b = _study(tmp_path, "b", SMALL_SPACE.replace(SETTINGS, SETTINGS + "fsdp = true\ncpu_offload_layers = 2\n"))
    assert dse("compare", a, b, "--out", tmp_path / "c").exit_code == 0
    changed = pd.read_csv(tmp_path / "c" / "compare.csv").changed_knobs[1]
    page = (tmp_path / "c" / "compare.html").read_text()
    cell = '<td class="wrap">' + ", ".join(f"<span>{p.replace('>', '&gt;')}</span>" for p in changed.split(", "))
    assert cell + "</td>" in page and 'class="cut"' not in page
    assert "in every study: recipe llama3_70b_16l" in page  # said once, not a column


def test_the_pages_links_tell_studies_of_one_space_apart_and_its_axis_writes_no_exponent(tmp_path):
    """Studies of one space (dse run --systems' sub-studies share its name) get distinct link texts."""
    a, b = _study(tmp_path, "a"), _study(tmp_path, "b")
    assert dse("compare", a, b, "--out", tmp_path / "c").exit_code == 0
    page = (tmp_path / "c" / "compare.html").read_text()
    texts = re.findall(r'<li><a href="[^"]*">([^<]*)</a></li>', page)
    assert len(texts) == 2 and len(set(texts)) == 2, texts
    assert '"tickformat":",.4~r"' in page  # d3's rounded decimal notation: 250,000, never 2.500e+5


def test_the_page_shows_the_gain_over_each_baseline_short_with_its_sentence_below(tmp_path):
    """compare.csv's recipe_layout_gain is a sentence (which layout, where its figures come from): on the page the
    table shows the gain alone, as the sentence starts, and the sentence is below it, whole, once per study."""
    a, b = _study(tmp_path, "a"), _study(tmp_path, "b", SMALL_SPACE.replace(SETTINGS, SETTINGS + "fsdp = true\n"))
    assert dse("compare", a, b, "--out", tmp_path / "c").exit_code == 0
    lines = [s.lstrip("'") for s in pd.read_csv(tmp_path / "c" / "compare.csv").recipe_layout_gain]
    page = (tmp_path / "c" / "compare.html").read_text()
    table, below = page.split("</table>", 1)
    cells = re.findall(r"<td>([^<]*)</td></tr>", table)  # the row's last cell: the gain (nothing empty after it)
    assert len(cells) == len(lines) == 2, cells
    for line, cell in zip(lines, cells):
        gain = re.match(r"[+-]\d+\.\d%", line)
        predicted = "as the model predicts it" in line
        assert cell == (f"{gain.group(0)}{' vs predicted' if predicted else ''}" if gain else "see below"), cell
        assert line.replace("'", "&#39;") in below and line.replace("'", "&#39;") not in table
    assert cells[1] == "see below"  # fsdp on: the baseline is not in the space and has no prediction
