"""DESIGN.md's claims outside its layer section (tests/test_design_layers.py reads that one), each held to the code:
the names it writes exist, its tables name every module and every folder as the packaging maps it, and each rule of
the house is checked here or names the test that checks it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "DESIGN.md").read_text()


def _section(title: str) -> str:
    return DESIGN.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _first_cells(section: str) -> list[str]:
    """The backticked names of each table row's first cell."""
    names: list[str] = []
    for line in section.splitlines():
        if line.startswith("| `"):
            names += re.findall(r"`([^`]+)`", line.split(" | ")[0])
    return names


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "templates" not in p.parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute import of a file: (module, line), functions' imports included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node.lineno))
    return out


def _name(path: Path) -> str:
    """A file's module as installed (agents/x.py is dse.agents.x)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] != "dse":
        parts.insert(0, "dse")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolves(dotted: str) -> bool:
    if importlib.util.find_spec(dotted.rsplit(".", 1)[0]) is not None and dotted.endswith("__main__"):
        return importlib.util.find_spec(dotted) is not None  # a module that runs when imported: found, not run
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dse_name_design_writes_exists():
    names = {n for n in re.findall(r"\bdse(?:\.[A-Za-z_]\w*)+", DESIGN) if n != "dse.json"}  # dse.json: a file
    assert len(names) > 40  # the reading finds the names (the diagram's, the tables', the rules')
    assert sorted(n for n in names if not _resolves(n)) == []


def test_where_things_live_names_existing_paths_and_every_module():
    paths = [p for p in _first_cells(_section("Where things live")) if "/" in p]
    assert [p for p in paths if not (ROOT / p).exists()] == []
    folders = [p for p in paths if p.endswith("/")]
    unnamed = [
        str(m.relative_to(ROOT))
        for m in _modules("dse")
        if m.name != "__init__.py"
        and str(m.relative_to(ROOT)) not in paths
        and not any(str(m.relative_to(ROOT)).startswith(f) for f in folders)
    ]
    assert unnamed == [], "a module of dse/ that DESIGN.md's table of where things live does not name"


def test_where_each_fact_lives_names_existing_paths():
    section = _section("Where each kind of fact lives")
    paths = {p for p in re.findall(r"`([\w./<>-]+\.(?:py|toml))`", section) if "<" not in p}
    assert paths and sorted(p for p in paths if not (ROOT / p).exists()) == []


def test_the_folders_install_as_the_table_says():
    rows = [
        re.findall(r"`([^`]+)`", line)[:2]
        for line in _section("One distribution, one import name").splitlines()
        if line.startswith("| `")
    ]
    stated = {folder.rstrip("/"): name for folder, name in rows if folder != "dse/"}
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert stated == {folder: name for name, folder in package_dir.items()}


def _rules() -> list[str]:
    bullets = re.split(r"\n- ", _section("Rules of the house"))[1:]  # what precedes the first bullet is no rule
    return [" ".join(r.split()) for r in bullets]


def test_each_rule_is_checked_by_a_named_test_or_a_contract():
    for rule in _rules():
        tests = re.findall(r"`(tests/[\w/]+\.py)`", rule)
        assert tests or "a contract" in rule, f"a rule of the house that names no check: {rule!r}"
        assert [t for t in tests if not (ROOT / t).is_file()] == []


def test_the_payloads_import_nothing_of_the_controller():
    found = [
        (str(p.relative_to(ROOT)), n) for p in _modules("recipes") for m, n in _imports(p) if m.split(".")[0] == "dse"
    ]
    assert found == []


def test_the_statuses_of_a_trial_are_the_parsers():
    from dse.logs.parse import STATUSES, UNLAUNCHED_STATUSES, Status

    rule = next(r for r in _rules() if r.startswith("A trial that did not run well is data"))
    named = re.findall(r"`(\w+)`", rule.split(" with a reason", 1)[0])
    assert sorted(named) == sorted(s for s in STATUSES if s != "ok")
    unlaunched = re.findall(r"`(\w+)`", rule.split("never launched", 1)[0].rsplit(";", 1)[-1])
    assert sorted(unlaunched) == sorted(UNLAUNCHED_STATUSES)
    after = re.findall(r"`(\w+)`", rule.split(" with a reason", 1)[1].split("(each a member", 1)[0])
    assert sorted({*named, *after}) == sorted(s.value for s in Status if s != "ok")


def test_no_private_module_of_another_package_is_imported():
    private = [
        (_name(p), m)
        for folder in ("dse", "agents", "envs")
        for p in _modules(folder)
        for m, _ in _imports(p)
        if m.split(".")[0] not in ("dse", "__future__") and any(part.startswith("_") for part in m.split("."))
    ]
    assert private == []


def test_classes_are_found_by_name_only_where_design_says():
    """A class told by its ``__name__`` (a private class a dependency does not export): only the CLI's usage
    error of Typer's vendored Click, as the rule says."""
    where = set()
    for folder in ("dse", "agents", "envs"):
        for p in _modules(folder):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Compare) and any(
                    isinstance(x, ast.Attribute) and x.attr == "__name__" for x in [node.left, *node.comparators]
                ):
                    where.add(_name(p))
    where.discard("dse.__main__")  # `if __name__ == "__main__"` is a module's own name, not a class's
    rule = next(r for r in _rules() if r.startswith("Public APIs of dependencies only"))
    assert where == set(re.findall(r"by name \(`([\w.]+)`", rule))


def test_nemo_run_is_imported_only_where_design_says():
    found = {_name(p) for p in _modules("dse") for m, _ in _imports(p) if m.split(".")[0] == "nemo_run"}
    rule = next(r for r in _rules() if r.startswith("Public APIs of dependencies only"))
    stated = set(re.findall(r"`(dse\.backends\.\w+)`", rule.split("nemo-run", 1)[1].split(";", 1)[0]))
    assert found == stated


def _flag(node: ast.AST) -> bool:
    """A literal that starts with a flag's name (``"--out"``, ``f"--point {name}"``, ``"--rebuild goes with..."``);
    a flag with its value (``"--mpi=pmix"``) is another program's command line, not a name of the dse command's."""
    text = node.value if isinstance(node, ast.Constant) else None
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        text = node.values[0].value
    return isinstance(text, str) and re.match(r"--[a-z][\w-]*(?![\w=-])", text) is not None


def _flag_params() -> set[str]:
    """The modules outside dse.cli that name a flag of a command where a user error is made: an error's field or
    parameter (``field="--out"``, a parameter's default), an error's message or a checking helper's first argument
    (``UserError("--rebuild ...")``, ``bounded("--seeds", ...)``), or the first cell of a table of such checks."""
    where = set()
    for p in _modules("dse"):
        name = _name(p)
        if name.startswith("dse.cli"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            values: list[ast.AST] = []
            if isinstance(node, ast.Call):
                values = [k.value for k in node.keywords if k.arg in ("field", "param")]
                if isinstance(node.func, ast.Name) and node.args:
                    values.append(node.args[0])
            elif isinstance(node, ast.arguments):
                values = [d for d in node.defaults + node.kw_defaults if d is not None]
            elif isinstance(node, ast.Tuple) and node.elts:
                values = [node.elts[0]]
            if any(_flag(v) for v in values):
                where.add(name)
    return where


def test_only_the_cli_names_flags_but_for_the_modules_design_lists():
    rule = next(r for r in _rules() if r.startswith("Bad input is a one-line error"))
    stated = set(re.findall(r"`(dse\.[\w.]+)`", rule.split("not yet", 1)[1])) if "not yet" in rule else set()
    assert _flag_params() == stated


def test_user_toml_is_parsed_only_by_inputs_and_the_cli_values():
    parsers = set()
    for p in _modules("dse"):
        for node in ast.walk(ast.parse(p.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("tomllib", "tomlkit")
                and node.func.attr in ("load", "loads", "parse")
            ):
                parsers.add(_name(p))
    row = next(line for line in _section("Where things live").splitlines() if line.startswith("| `dse/inputs.py`"))
    assert parsers == {"dse.inputs", *re.findall(r"`(dse\.cli\.\w+)`", row)}


def test_points_are_resolved_off_the_evaluator_only_where_design_says():
    callers = set()
    for folder in ("dse", "agents", "envs"):
        for p in _modules(folder):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "dse.rules.trial":
                    if any(a.name == "resolve" for a in node.names):
                        callers.add(_name(p))
    way = DESIGN.split("Off a study's way,", 1)[1].split("every other", 1)[0]
    assert callers == {"dse.rules.points", *re.findall(r"`(dse\.[\w.]+)`", way)}
