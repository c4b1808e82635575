#!/usr/bin/env bash
# dse probe's device runs (one H100): the real one-GPU grid through dse's local backend, then probes (one rank of
# a larger job under PyTorch's fake process group) run by recipes.mcore --fake-process-group, one log per run.
# Usage, from a checkout of this repository with the wheels beside it (WHEELS/mc: megatron-core 0.19.2;
# WHEELS/ctl: the controller's dependencies the device image lacks):
#   bash bench/h100_probe_device.sh grid  WHEELS   # conf/spaces/llama3_8b_4l_h100_local_space.toml, all 9 points,
#                                                  # then a probe (world 1) of each point
#   bash bench/h100_probe_device.sh PLAN  WHEELS   # PLAN: bench/h100_probe_plan.tsv lines NAME WORLD RANK ARGS
# Logs go to /tmp/probe_out and are packed into $OUT after every run (a cut-off call still returns them).
set -u
shopt -s nullglob  # WHEELS/ctl may be absent: probes need only megatron-core (dse installs with --no-deps)
what=$1; wheels=$(cd "$2" && pwd)
code=$(cd "$(dirname "$0")/.." && pwd)
out=/tmp/probe_out; mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
if [[ ! -d /tmp/site/megatron ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$wheels"/mc/*.whl "$wheels"/ctl/*.whl 2>&1 | tail -3
fi
rm -rf /tmp/site-dse
python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/site-dse "$code" 2>&1 | tail -3
export PYTHONPATH=/tmp/site-dse:/tmp/site
echo "setup $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__)" \
  2>&1 | grep -v Warn | tail -1 | tee -a "$out/gpu.txt"
pack() { [[ -n "${OUT:-}" ]] && tar -czf "$OUT/probe_logs.tgz" -C /tmp probe_out; }

probe() {  # NAME WORLD RANK ARGS...: one probe, its log and a line in runs.tsv
  local name=$1 world=$2 rank=$3; shift 3
  local s=$(date +%s.%N)
  (cd /tmp/site-dse && WORLD_SIZE=$world RANK=$rank timeout "${PROBE_TIMEOUT_S:-150}" \
    python3 -m dse.recipes.mcore --fake-process-group "$@") > "$out/$name.log" 2>&1
  local rc=$? e=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$world" "$rank" "$rc" "$(python3 -c "print(round($e-$s,1))")" "$*" \
    >> "$out/runs.tsv"
  grep -E "iteration +[0-9]+/|memory \(MB\)|Error|error:" "$out/$name.log" | tail -2
  echo "--- $name rc=$rc"
  pack
}
[[ -f "$out/runs.tsv" ]] || printf 'name\tworld\trank\trc\twall_s\targs\n' > "$out/runs.tsv"

if [[ "$what" == grid ]]; then
  mkdir -p /tmp/studies
  (cd /tmp && timeout -s INT "${GRID_S:-360}" python3 -m dse run \
     --space "$code/conf/spaces/llama3_8b_4l_h100_local_space.toml" --backend local --out /tmp/studies/grid 2>&1 \
     | grep -vE "^\s*$" | tail -30)
  (cd /tmp && python3 -m dse leaderboard /tmp/studies/grid 2>&1 | tail -14)
  [[ -n "${OUT:-}" ]] && tar -C /tmp/studies -czf "$OUT/grid_study.tgz" grid
  for t in /tmp/studies/grid/trials/*/; do
    args=$(sed -n 's/.*-m recipes\.mcore \(.*\) > .*/\1/p' "$t/launch.sh")
    # shellcheck disable=SC2086
    probe "grid_probe_$(basename "$t")" 1 0 $args train.train_iters=3 scheduler.lr_decay_iters=3
  done
else
  while IFS=$'\t' read -r name world rank args; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    # shellcheck disable=SC2086
    probe "$name" "$world" "$rank" $args
  done < "$what"
fi
echo "total $(( $(date +%s) - t0 )) s"
