#!/usr/bin/env bash
# dse as a user installs it: a wheel built from this checkout, installed non-editable into a fresh venv, the main
# job run from another directory, and the import contracts checked on that installed tree. (The repository's
# agents/, envs/, recipes/ and conf/ are dse.agents, dse.envs, dse.recipes and dse.conf through setuptools'
# package-dir: import-linter and mypy walk folders, so they read the layout where it is real, in the installed
# package.)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=$(mktemp -d "${TMPDIR:-/tmp}/dse-wheel.XXXXXX")
trap 'rm -rf "$root"' EXIT
python3 -m venv "$root/venv"
"$root/venv/bin/pip" wheel -q --no-deps -w "$root/dist" "$repo"
"$root/venv/bin/pip" install -q "$root"/dist/dse-*.whl import-linter==2.17
cd "$root"
"$root/venv/bin/python" - <<'PY'
import importlib.util

import dse

assert "site-packages" in dse.__file__, f"dse imported from {dse.__file__}, not the installed wheel"
for name in ("agents", "envs", "recipes", "conf"):
    assert importlib.util.find_spec(name) is None, f"the wheel installs a generic top-level package {name!r}"
print("wheel: dse from", dse.__file__)
PY
"$root/venv/bin/dse" run --space conf/spaces/llama3_405b_space.toml --out "$root/quickstart" | tail -n 5
test -s "$root/quickstart/leaderboard.csv"
"$root/venv/bin/lint-imports" --no-cache "$repo/pyproject.toml"
# Types on the installed tree; the stubs are those of typed dependencies that ship no inline types (pandas, scipy).
# Pinned, as ruff is in the test extra: a new checker release must not fail a change that did not touch types.
"$root/venv/bin/pip" install -q mypy==2.4.1 pandas-stubs==3.1.0.261029 scipy-stubs==1.17.1.5
"$root/venv/bin/mypy" --config-file "$repo/pyproject.toml" -p dse
