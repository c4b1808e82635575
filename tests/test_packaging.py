"""One distribution, one import name: what pyproject ships matches the folders, every module sits in a layer of
the import contracts, and the payload runs as the top-level package ``recipes`` with no controller installed.

The non-editable install itself (wheel built, installed into a fresh venv, the main job run from another
directory) is a step of ``.ci/run``: it needs a clean environment that a test inside this one cannot give.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from dse.backends.scripts import stage_code
from dse.rules.space import SPACES_DIR, SYSTEMS_DIR, load_space, load_system

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _import_name(folder: Path) -> str:
    """The installed name of a repository folder, through pyproject's package-dir mapping."""
    rel = folder.relative_to(ROOT).as_posix()
    for name, where in SETUPTOOLS["package-dir"].items():
        if rel == where or rel.startswith(where + "/"):
            return name + rel[len(where) :].replace("/", ".")
    return rel.replace("/", ".")


def _package_folders() -> list[Path]:
    roots = ["dse", *SETUPTOOLS["package-dir"].values()]
    return sorted(p.parent for r in roots for p in (ROOT / r).rglob("__init__.py"))


def test_every_package_folder_is_shipped_under_dse():
    shipped = set(SETUPTOOLS["packages"])
    names = {_import_name(f) for f in _package_folders()}
    assert names - shipped == set(), "package folders missing from [tool.setuptools] packages"
    assert shipped - names == set(), "packages listed that no folder holds"
    assert all(n == "dse" or n.startswith("dse.") for n in shipped)


def test_shipped_conf_is_read_as_package_data():
    assert {p.stem for p in SYSTEMS_DIR.glob("*.toml")} == {p.stem for p in (ROOT / "conf/systems").glob("*.toml")}
    assert SPACES_DIR.samefile(ROOT / "conf/spaces")  # an editable checkout: the resource is the repository's folder
    assert load_system("h100").gpu == "h100"


def test_a_shipped_space_is_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    by_path = load_space("conf/spaces/llama3_405b_space.toml")
    assert by_path == load_space("llama3_405b_space") == load_space("llama3_405b_space.toml")
    (tmp_path / "conf" / "spaces").mkdir(parents=True)  # a file of the user's own wins over the shipped one
    mine = tmp_path / "conf" / "spaces" / "llama3_405b_space.toml"
    mine.write_text((SPACES_DIR / "llama3_405b_space.toml").read_text().replace('"llama3_405b', '"mine_405b', 1))
    assert load_space("conf/spaces/llama3_405b_space.toml").source == "conf/spaces/llama3_405b_space.toml"


def test_every_module_sits_in_a_layer_of_the_import_contracts():
    layers = next(
        c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["type"] == "layers" and "containers" not in c
    )["layers"]
    named = {m.strip() for layer in layers for m in layer.replace(":", "|").split("|")}
    missing = []
    for folder in _package_folders():
        pkg = _import_name(folder)
        if pkg.startswith(("dse.recipes", "dse.conf")):
            continue
        for f in [*folder.glob("*.py")]:
            mod = pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"
            # a package's own module is placed where the package or any of its modules is (a room whose modules
            # sit on several layers, as dse.rl's game below the agents and its training above the environment)
            inner = f.stem == "__init__" and any(n.startswith(mod + ".") for n in named)
            if mod != "dse" and not inner and not any(mod == n or mod.startswith(n + ".") for n in named):
                missing.append(mod)
    assert missing == []


def test_every_module_of_a_room_with_its_own_contract_sits_in_one_of_its_layers():
    """A room whose contract orders its modules (``containers``) names every module it holds, so a module added to
    the room must be placed in its order too."""
    rooms = [c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["type"] == "layers" and "containers" in c]
    assert {r for c in rooms for r in c["containers"]} >= {"dse.cli", "dse.study", "dse.rules", "dse.facts"}
    for contract in rooms:
        named = {m.strip() for layer in contract["layers"] for m in layer.replace(":", "|").split("|")}
        for room in contract["containers"]:
            folder = ROOT / room.replace(".", "/")
            held = {f.stem for f in folder.glob("*.py") if f.stem != "__init__"}
            assert held - named == set(), f"{room}: modules in no layer of {contract['name']!r}"
            assert named - held == set(), f"{room}: layers name modules it does not hold"


def test_the_staged_payload_runs_without_the_controller(tmp_path):
    code = stage_code(tmp_path)
    # -S: no site-packages, so neither dse nor its dependencies can be imported; the staged copy must not need them
    no_dse = subprocess.run([sys.executable, "-S", "-c", "import dse"], cwd=code, capture_output=True, text=True)
    assert no_dse.returncode != 0 and "No module named 'dse'" in no_dse.stderr
    r = subprocess.run(
        [sys.executable, "-S", "-m", "recipes.sim", "--help"], cwd=code, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower()
