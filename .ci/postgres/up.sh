#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the multi-worker tests: Debian's postgresql (15), run as the `postgres`
# user (the server refuses root), listening on 127.0.0.1:${DSE_PG_PORT:-55432} and a unix socket in its data
# directory, trust authentication, one database `dse`. Idempotent: a running cluster is reused. Its PID is in
# $DATA/postmaster.pid (and echoed). Tests find it through DSE_PG_URL (default below).
#   bash .ci/postgres/up.sh      # as root; bash .ci/postgres/down.sh stops it
set -euo pipefail
PORT=${DSE_PG_PORT:-55432}
DATA=${DSE_PG_DATA:-/tmp/dse-postgres}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  $SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql >/dev/null
  BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
if [ "$(id -u)" -eq 0 ]; then AS="runuser -u postgres --"; else AS=""; fi
if [ -f "$DATA/postmaster.pid" ] && $AS "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  echo "postgres: already up on 127.0.0.1:$PORT (pid $(head -1 "$DATA/postmaster.pid"))"
  exit 0
fi
if [ ! -f "$DATA/PG_VERSION" ]; then
  mkdir -p "$DATA"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$DATA"
  chmod 700 "$DATA"
  $AS "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 >/dev/null
fi
$AS "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
  -o "-p $PORT -k $DATA -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" start >/dev/null
$AS "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='dse'" | grep -q 1 \
  || $AS "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres dse
echo "postgres: up on 127.0.0.1:$PORT (pid $(head -1 "$DATA/postmaster.pid")); DSE_PG_URL=postgresql+psycopg://postgres@127.0.0.1:$PORT/dse"
