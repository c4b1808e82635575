#!/usr/bin/env bash
# Create (or reuse) the NeMo 2 test environment: a separate venv with nemo-toolkit 2.7 and CPU torch.
# Usage: bash .ci/nemo-env.sh [DIR]   (default: .venv-nemo in the repository root; git-ignored)
# Idempotent: a stamp records the hash of the requirement files; a matching, importable venv is kept.
# Prints the venv path last; tests find it through DSE_NEMO_ENV (or the default path).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${DSE_NEMO_ENV:-$root/.venv-nemo}}"
req="$root/.ci/nemo-requirements.txt"
cons="$root/.ci/nemo-constraints.txt"
py="${DSE_NEMO_PYTHON:-python3.11}"  # the CPU torch wheel on disk is for CPython 3.11
stamp="$venv/.dse-stamp"
want="$(cat "$req" "$cons" | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && "$venv/bin/python" -c "import nemo, nemo_run, megatron.core" 2>/dev/null; then
  echo "nemo-env: up to date"
  echo "$venv"
  exit 0
fi

start=$(date +%s)
rm -rf "$venv"
"$py" -m venv "$venv"
# One resolver pass over everything, under the constraints (never a free choice of torch).
if ! "$venv/bin/pip" install --disable-pip-version-check -c "$cons" -r "$req" >"$venv/pip.log" 2>&1; then
  grep -v -E "is ignored: it is neither a file nor a directory" "$venv/pip.log" | tail -40
  echo "nemo-env: pip install failed (log: $venv/pip.log)" >&2
  exit 1
fi
"$venv/bin/python" - <<'PY'
import warnings
warnings.simplefilter("ignore")
from nemo.collections import llm
llm.llama3_8b.pretrain_recipe(performance_mode=True)
print("nemo-env: nemo.collections.llm imports and builds a recipe")
PY
echo "$want" > "$stamp"
echo "nemo-env: installed in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)"
echo "$venv"
