"""The house's size rules, checked on every change: no function of the controller (``dse/``, ``agents/``,
``envs/``) over 80 lines or over radon's cyclomatic complexity 20, unless the line above its ``def`` says why in a
comment starting ``# house:``."""

from __future__ import annotations

from pathlib import Path

import pytest
from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, MAX_COMPLEXITY = 80, 20
FILES = sorted(p for d in ("dse", "agents", "envs") for p in (ROOT / d).rglob("*.py"))


def _excused(lines: list[str], lineno: int) -> bool:
    above = lineno - 2  # the line above the def (or above its first decorator's line, as radon reports)
    return above >= 0 and lines[above].strip().startswith("# house:")


def _functions(blocks):
    for b in blocks:
        if hasattr(b, "methods"):  # a class: its methods (and their closures) count one by one
            yield from _functions(b.methods)
        else:
            yield b
            yield from _functions(getattr(b, "closures", []))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_is_too_long_or_too_branchy(path):
    text = path.read_text()
    lines = text.splitlines()
    over = [
        f"{f.name}: {f.endline - f.lineno + 1} lines, complexity {f.complexity}"
        for f in _functions(cc_visit(text))
        if (f.endline - f.lineno + 1 > MAX_LINES or f.complexity > MAX_COMPLEXITY) and not _excused(lines, f.lineno)
    ]
    assert over == [], f"split by responsibility, or say why in a '# house:' comment above the def: {over}"
