#!/usr/bin/env bash
# [search] screen = "probe" on one H100 (bench/data/h100_probe_screen): `dse run` of the one-GPU grid's space
# (conf/spaces/llama3_8b_4l_h100_local_space.toml) with screen = "probe" (every point probed on the GPU first,
# the points that fit launched through the local backend).
# MBS (default "2, 4"): the micro-batch sizes the study's grid keeps; the real grid (bench/data/h100_mcore_grid)
# ran out of memory at mbs 2 without recompute and at every mbs 4 point, and ran every mbs 1 point.
# Usage, from a checkout with the wheels beside it (WHEELS/mc: megatron-core 0.19.2; WHEELS/ctl: the controller's
# dependencies the device image lacks, as bench/h100_probe_device.sh):
#   bash bench/h100_probe_screen_device.sh WHEELS
# Results go to /tmp/ps_out and are packed into $OUT (without the staged payload copies).
set -u
wheels=$(cd "$1" && pwd)
code=$(cd "$(dirname "$0")/.." && pwd)
out=/tmp/ps_out; mkdir -p "$out"
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
pack() { [[ -n "${OUT:-}" ]] && tar -czf "$OUT/probe_screen.tgz" --exclude=code -C /tmp ps_out; }

sed -e 's/^screen = "none"/screen = "probe"/' -e "s/^mbs = \[1, 2, 4\]/mbs = [${MBS:-2, 4}]/" \
  "$code/conf/spaces/llama3_8b_4l_h100_local_space.toml" > "$out/grid_probe_space.toml"
grep -E "^(mbs|screen) =" "$out/grid_probe_space.toml"
s=$(date +%s)
(cd /tmp && timeout -s INT "${STUDY_S:-330}" python3 -m dse run --space "$out/grid_probe_space.toml" \
   --out "$out/study" 2>&1 | grep -vE "^\s*$" | tail -30) | tee "$out/dse_run.txt"
echo "dse run wall $(( $(date +%s) - s )) s" | tee -a "$out/dse_run.txt"
(cd /tmp && COLUMNS=200 python3 -m dse leaderboard "$out/study" 2>&1 | tail -16) | tee "$out/leaderboard.txt"
pack
echo "total $(( $(date +%s) - t0 )) s"
