"""DESIGN.md's layer section says what the import contracts of pyproject.toml say, claim by claim: the rooms and
their order, each room's own order, which siblings are independent, and each forbidden or independence contract
("Besides"). Every contract is stated there, and every statement there is a contract, so neither can change alone.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _section(text: str) -> str:
    return text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]


def _tables(section: str) -> list[list[tuple[str, str]]]:
    """Each markdown table of the section as its (first cell, second cell) rows, header and rule left out."""
    tables: list[list[tuple[str, str]]] = []
    rows: list[tuple[str, str]] = []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append((cells[0], cells[1]))
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def _layers(cell: str) -> list[tuple[frozenset[str], bool]]:
    """A cell's layers, top to bottom: `a`; then `b`, `c` (independent) -> [({a}, False), ({b, c}, True)]."""
    out = []
    for part in cell.split("; then "):
        names = frozenset(re.findall(r"`([\w.]+)`", part))
        assert names, f"a layer of no module in {cell!r}"
        out.append((names, "(independent)" in part))
    return out


def _contract_layers(contract: dict) -> list[tuple[frozenset[str], bool]]:
    out = []
    for layer in contract["layers"]:
        names = frozenset(n.strip() for n in re.split(r"[|:]", layer))
        out.append((names, "|" in layer))
    return out


def _design() -> str:
    return _section((ROOT / "DESIGN.md").read_text())


def test_the_rooms_and_their_order_are_the_main_contract():
    rooms, _ = _tables(_design())
    stated = [layer for _, cell in rooms for layer in _layers(cell) if "in their own order" not in cell]
    evaluation = [cell for _, cell in rooms if "in their own order" in cell]
    main = next(c for c in CONTRACTS if c["type"] == "layers" and c["name"].startswith("Rooms:"))
    contract = _contract_layers(main)
    # the evaluation row is one layer of siblings that import each other (ordered by the room's own contract)
    assert len(evaluation) == 1
    ev = frozenset(re.findall(r"`([\w.]+)`", evaluation[0]))
    assert (ev, False) in contract
    at = contract.index((ev, False))
    assert stated == contract[:at] + contract[at + 1 :]
    assert [r.split(":")[0] for r, _ in rooms] == [
        "interfaces",
        "study",
        "evaluation",
        "model",
        "rules",
        "facts",
        "base",
        "payloads",
    ]
    # the contract's name states the same design
    assert main["name"] == "Rooms: interfaces > study > evaluation > model > rules > facts > base > payloads"


def test_each_room_order_is_its_contract():
    _, inside = _tables(_design())
    layered = [c for c in CONTRACTS if c["type"] == "layers" and not c["name"].startswith("Rooms:")]
    stated = {room.strip("`"): _layers(cell) for room, cell in inside}  # a package's modules named relative to it
    found = {}
    for c in layered:
        key = c["containers"][0] if "containers" in c else "evaluation"
        assert key not in found, f"two contracts order {key}"
        found[key] = _contract_layers(c)
    assert stated == found


def test_every_besides_claim_is_a_contract_and_every_other_contract_a_claim():
    besides = _design().split("\nBesides:\n", 1)[1]
    claims = [" ".join(b.split()) for b in re.split(r"\n- ", "\n" + besides.strip()) if b.strip()]
    others = [c for c in CONTRACTS if c["type"] != "layers"]
    matched = []
    for claim in claims:
        if " never import" in claim:
            before, after = re.split(r" never imports? ", claim, maxsplit=1)
            source = set(re.findall(r"`([\w.]+)`", before))
            what = after.split(":", 1)[0]
            forbidden = set(re.findall(r"`([\w.]+)`", what.split(", but for ", 1)[0]))
            # "but for `a`, `b`": the modules whose imports of the forbidden ones the contract ignores
            but = set(re.findall(r"`([\w.]+)`", what.split(", but for ", 1)[1])) if ", but for " in what else set()
            hits = [
                c
                for c in others
                if c["type"] == "forbidden"
                and set(c["source_modules"]) == source
                and set(c["forbidden_modules"]) == forbidden
                and {i.split(" -> ")[0] for i in c.get("ignore_imports", []) if "dse.recipes" not in i} == but
            ]
        elif " are independent" in claim:
            modules = set(re.findall(r"`([\w.]+)`", claim.split(" are independent", 1)[0]))
            hits = [c for c in others if c["type"] == "independence" and set(c["modules"]) == modules]
        else:
            pytest.fail(f"a claim of DESIGN.md's layer section no test reads: {claim!r}")
        assert len(hits) == 1, f"no contract in pyproject.toml says: {claim!r}"
        matched.append(hits[0]["name"])
    assert sorted(matched) == sorted(c["name"] for c in others)


def test_a_changed_order_is_caught():
    """The comparison reads order and independence: a swapped layer or a lost "(independent)" differs."""
    cell = "`a`; then `b`, `c` (independent)"
    assert _layers(cell) == [(frozenset({"a"}), False), (frozenset({"b", "c"}), True)]
    assert _layers("`b`, `c` (independent); then `a`") != _layers(cell)
    assert _layers("`a`; then `b`, `c`") != _layers(cell)
    assert _contract_layers({"layers": ["a", "b | c"]}) == _layers(cell)
    assert _contract_layers({"layers": ["a", "b : c"]}) == _layers("`a`; then `b`, `c`")
