#!/usr/bin/env bash
# Stop the daemons that .ci/slurm/up.sh started, by the PIDs it recorded (newest first).
set -uo pipefail
STATE=${DSE_SLURM_STATE:-/var/lib/dse-slurm}
PIDS="$STATE/pids"
[ -f "$PIDS" ] || { echo "slurm: nothing to stop"; exit 0; }
tac "$PIDS" | while read -r name pid; do
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" && echo "stopped $name ($pid)"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  fi
done
rm -f "$PIDS"
