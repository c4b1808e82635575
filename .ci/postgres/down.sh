#!/usr/bin/env bash
# Stop the server of .ci/postgres/up.sh ROOT: pg_ctl on its own data directory (the postmaster.pid there).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$here/lib.sh"
[ -n "${1:-}" ] || { echo "usage: $0 ROOT" >&2; exit 2; }
DATA="$1/postgres/data"
[ -f "$DATA/postmaster.pid" ] || { echo "postgres: nothing to stop under $1"; exit 0; }
ROOT=$(cd "$1" && pwd)
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ "$(id -u)" -eq 0 ]; then AS="runuser -u postgres --"; else AS=""; fi
$AS "$BIN/pg_ctl" -D "$ROOT/postgres/data" -m fast -w -t 30 stop >/dev/null && echo "stopped postgres"
stop_recorded "$ROOT" postgres  # only if pg_ctl could not
