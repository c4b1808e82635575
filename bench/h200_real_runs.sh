#!/usr/bin/env bash
# Real runs of recipes.mcore on one H200 (the device machine), one log per configuration.
# Usage (from the directory that holds recipes/ and the megatron-core wheel in .whl/):
#   bash bench/h200_real_runs.sh PLAN_FILE OUT_DIR
# PLAN_FILE: one run per line, "NAME<TAB>ARGS" (ARGS: flags and path=value overrides of recipes.mcore);
# a line whose NAME starts with "smoke" must succeed or the rest is skipped. Each run's stdout+stderr goes to
# OUT_DIR/NAME.log; OUT_DIR/runs.tsv records name, exit status, wall seconds and the command; after every
# run OUT_DIR is packed into $OUT/real_h200_logs.tgz (when $OUT is set) so a cut-off call still returns logs.
set -u
plan=$1; out=$2
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
printf 'name\trc\twall_s\tcommand\n' > "$out/runs.tsv"
while IFS=$'\t' read -r name args; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  if [[ "$name" == smoke* ]]; then
    cmd="python3 -m recipes.mcore $args"
  else
    cmd="torchrun --standalone --nproc-per-node 1 -m recipes.mcore $args"
  fi
  echo "=== $name: $cmd"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout "${RUN_TIMEOUT_S:-150}" $cmd > "$out/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  wall=$(python3 -c "print(round($t1-$t0,1))")
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$wall" "$cmd" >> "$out/runs.tsv"
  grep -E "iteration +[0-9]+/|memory \(MB\)" "$out/$name.log" | tail -3
  echo "--- $name rc=$rc wall=${wall}s"
  if [[ -n "${OUT:-}" ]]; then tar -czf "$OUT/real_h200_logs.tgz" -C "$(dirname "$out")" "$(basename "$out")"; fi
  if [[ "$name" == smoke* && $rc -ne 0 ]]; then tail -40 "$out/$name.log"; echo "smoke failed; stopping"; exit 1; fi
done < "$plan"
