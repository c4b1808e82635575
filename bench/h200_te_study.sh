#!/usr/bin/env bash
# Run (or continue) one dse study through the local backend on the device machine, after bench/te_device_setup.sh,
# and bring it back: bash bench/h200_te_study.sh SPACE_NAME SECONDS [dse run flags...]
# The study lives in /tmp/studies/SPACE_NAME (kept between the calls of one warm machine, so a later call can pass
# --resume); $OUT gets SPACE_NAME.tar.gz (study.db, leaderboard, dse.json, every trial's launch.sh and log).
# SECONDS bounds the call: dse gets SIGINT then (Ctrl-C: the trial in flight is recorded interrupted).
set -u
name=$1; secs=$2; shift 2
repo=$PWD
# dse installed from this checkout (no dependencies: te_device_setup.sh put them in /tmp/site): the checkout's folders
# agents/, envs/, recipes/ are dse.agents, dse.envs, dse.recipes only once installed. It runs from /tmp, so the
# checkout's own dse/ is not the first on sys.path.
python3 -m pip install -q --no-deps --no-index --no-build-isolation --upgrade --target /tmp/site-dse "$repo"
export PYTHONPATH=/tmp/site-dse:/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/studies
cd /tmp
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout -s INT "$secs" python3 -m dse run --space "$repo/conf/spaces/${name}_space.toml" --backend local \
  --out "/tmp/studies/$name" "$@" 2>&1 | tee "/tmp/studies/$name.console.log" | grep -vE "^\s*$" | tail -60
python3 -m dse leaderboard "/tmp/studies/$name" 2>&1 | tail -40
tar -C /tmp/studies -czf "$OUT/$name.tar.gz" "$name" "$name.console.log"
ls -la "$OUT"
