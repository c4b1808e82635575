"""docs/limits.md states every cap and range as the code enforces it: its tables are rendered here from the code's
constants and models, and each must appear in the page verbatim. After changing a limit, print the tables with
``python -m tests.test_limits_doc`` and paste them into the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent.parent / "docs" / "limits.md"


def _num(v: float) -> str:
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e16):
        return f"{int(v):,}"
    return f"{v:g}"


def _bounds(metadata: list[Any]) -> str:
    """A pydantic field's bounds as the page writes them: ``1 to 100,000``, ``> 0 to 3,600``, ``>= 0``."""
    b = {type(m).__name__: m for m in metadata}
    if "MaxLen" in b:
        return f"at most {_num(b['MaxLen'].max_length)} entries"
    low = _num(b["Ge"].ge) if "Ge" in b else f"> {_num(b['Gt'].gt)}" if "Gt" in b else ""
    high = _num(b["Le"].le) if "Le" in b else f"< {_num(b['Lt'].lt)}" if "Lt" in b else ""
    if low and high:
        text = f"{low} to {high}"
    elif low:
        text = low if "Gt" in b else f">= {low}"
    else:
        text = high if "Lt" in b else f"<= {high}"
    return text + (", finite" if "AllowInfNan" in b else "")


def _kind(annotation: Any) -> str:
    text = str(annotation)
    if "float" in text:
        return "number" + (" or absent" if "None" in text else "")
    if "int" in text:
        return "integer" + (" or absent" if "None" in text else "")
    return "list of names" if "list" in text else text


def field_table(rows: list[tuple[str, Any]]) -> str:
    """``| field | type | range |`` for every bounded field of the given pydantic models."""
    lines = ["| field | type | allowed |", "| --- | --- | --- |"]
    for prefix, model in rows:
        for name, f in model.model_fields.items():
            if any(type(m).__name__ in ("Ge", "Gt", "Le", "Lt", "MaxLen") for m in f.metadata) and "str" not in str(
                f.annotation
            ):
                lines.append(f"| `{prefix}{name}` | {_kind(f.annotation)} | {_bounds(f.metadata)} |")
    return "\n".join(lines)


def space_fields() -> str:
    from dse.rules.space import BackendSettings, EarlyStopSettings, Objective, Search, Space, System

    return field_table(
        [
            ("", Space),
            ("system.", System),
            ("objective.", Objective),
            ("search.", Search),
            ("backend.", BackendSettings),
            ("backend.early_stop.", EarlyStopSettings),
        ]
    )


def guided_options() -> str:
    from dse.agents.guided import GuidedOptions

    return field_table([("search.options.", GuidedOptions)])


def random_options() -> str:
    from dse.agents.random import RandomOptions

    return field_table([("search.options.", RandomOptions)])


def model_fields() -> str:
    from dse.perfmodel.trials import _ModelFile

    table = field_table([("", _ModelFile)])
    b = {type(m).__name__: m for m in _ModelFile.model_fields["name"].metadata}
    return table.replace(
        "| field | type | allowed |\n| --- | --- | --- |",
        "| field | type | allowed |\n| --- | --- | --- |\n"
        f"| `name` | text | {b['MinLen'].min_length} to {b['MaxLen'].max_length} characters |",
    )


def caps() -> str:
    from dse.inputs import MAX_INPUT_BYTES
    from dse.rules import space

    rows = [
        (
            "an input file (space, system, model, calibration, CloudAI test or system)",
            f"{MAX_INPUT_BYTES // 2**20} MiB",
        ),
        ("knobs a space varies (`[knobs]` entries)", _num(space.MAX_KNOBS)),
        ("settings a space fixes (`[settings]` entries)", _num(space.MAX_SETTINGS)),
        ("values one knob lists", _num(space.MAX_VALUES_PER_KNOB)),
        ("values all knobs of a space list together", _num(space.MAX_VALUES_PER_SPACE)),
        ("trials of one study (`[search] trials`, `--trials`)", _num(space.MAX_TRIALS)),
        ("raw points any walk over a whole space visits (grid, `dse space`'s exact count)", _num(space.WALK_LIMIT)),
        ("GPUs per node (a system, `dse predict --gpus-per-node`)", _num(space.GPUS_PER_NODE_MAX)),
    ]
    return "\n".join(["| what | at most |", "| --- | --- |", *(f"| {w} | {v} |" for w, v in rows)])


def calibration() -> str:
    from dse.facts.calibration_file import PARAM_RANGES

    lines = ["| parameter | allowed | why |", "| --- | --- | --- |"]
    for name, r in sorted(PARAM_RANGES.items()):
        lines.append(f"| `{name}` | {_num(r.low)} to {_num(r.high)} | {r.why} |")
    return "\n".join(lines)


TABLES = {
    "caps": caps,
    "space and system fields": space_fields,
    "guided agent options": guided_options,
    "random agent options": random_options,
    "model file": model_fields,
    "calibration": calibration,
}


def test_every_table_of_limits_is_in_the_page():
    page = PAGE.read_text()
    for name, table in TABLES.items():
        assert table() in page, (
            f"docs/limits.md: the {name} table differs from the code; print it with python -m tests.test_limits_doc"
        )


def test_the_page_states_no_machine_path_or_issue_number():
    import re

    page = PAGE.read_text()
    assert not re.search(r"/(work|tmp|home)/|#\d+|issue \d+", page)


if __name__ == "__main__":
    for name, table in TABLES.items():
        print(f"<!-- {name} -->\n{table()}\n")
