#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the multi-worker tests under ROOT (one directory per CI run): Debian's
# postgresql, run as the `postgres` user (the server refuses root), its data directory ROOT/postgres/data,
# listening on 127.0.0.1 at a port chosen free at start and on a unix socket in its data directory, trust
# authentication, one database `dse`. It never reuses a running server. Tests find it through DSE_PG_URL.
#   bash .ci/postgres/up.sh ROOT      # as root; then `. ROOT/postgres/env.sh`; bash .ci/postgres/down.sh ROOT
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$here/lib.sh"
ROOT=$(service_root "${1:-}")
P="$ROOT/postgres"
DATA="$P/data"
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  $SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql >/dev/null
  BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
if [ "$(id -u)" -eq 0 ]; then AS="runuser -u postgres --"; else AS=""; fi
if [ -e "$DATA" ]; then echo "postgres: $DATA exists; one server per root" >&2; exit 1; fi
mkdir -p "$DATA"
[ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$P"
chmod 700 "$DATA"
$AS "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 >"$P/initdb.log"
read -r PORT <<<"$(free_ports 1)"
$AS "$BIN/pg_ctl" -D "$DATA" -l "$P/server.log" -w -t 60 \
  -o "-p $PORT -k $DATA -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" start >/dev/null
record "$ROOT" postgres "$(head -1 "$DATA/postmaster.pid")"
$AS "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres dse
URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/dse"
echo "export DSE_PG_URL=$URL" > "$P/env.sh"
echo "postgres: up on 127.0.0.1:$PORT (pid $(head -1 "$DATA/postmaster.pid")) under $P; DSE_PG_URL=$URL"
