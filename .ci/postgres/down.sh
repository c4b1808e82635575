#!/usr/bin/env bash
# Stop the cluster of .ci/postgres/up.sh (its data directory stays; up.sh reuses it).
set -euo pipefail
DATA=${DSE_PG_DATA:-/tmp/dse-postgres}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ "$(id -u)" -eq 0 ]; then AS="runuser -u postgres --"; else AS=""; fi
[ -f "$DATA/postmaster.pid" ] && $AS "$BIN/pg_ctl" -D "$DATA" -m fast stop >/dev/null || true
