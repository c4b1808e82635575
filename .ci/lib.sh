# Helpers shared by the test services' up/down scripts (sourced, not run). Every service of one CI run lives
# under one root directory: its configuration, state, logs, sockets and the PIDs it started (ROOT/pids, one
# "name pid" per line). Nothing outside the root is written, reused or stopped.

# The root given as $1 (created, made absolute); the scripts refuse to guess one.
service_root() {
  [ -n "${1:-}" ] || { echo "usage: $0 ROOT (one directory per CI run; .ci/run makes it)" >&2; exit 2; }
  mkdir -p "$1"
  # the daemons that drop root (postgres, munge) must reach their own folders below it
  chmod 755 "$1"
  (cd "$1" && pwd)
}

# N ports that nothing listens on now, below the kernel's ephemeral range (so an outgoing connection does not
# take one before its daemon binds it), picked at random so that two runs rarely even try the same one.
free_ports() {
  python3 - "$1" <<'PY'
import random
import socket
import sys

picked: list[int] = []
while len(picked) < int(sys.argv[1]):
    port = random.randint(20000, 32000)
    if port in picked:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    picked.append(port)
print(" ".join(map(str, picked)))
PY
}

# record ROOT NAME PID: remember a daemon this run started (down scripts stop exactly these).
record() { echo "$2 $3" >> "$1/pids"; }

# wait_for SECONDS CMD...: until CMD succeeds.
wait_for() {
  local t=$1; shift
  for _ in $(seq 1 $((t * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  echo "timed out waiting for: $*" >&2; return 1
}

# running PID: the process exists and is not a zombie (one that ended and waits for its parent to read it).
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [[ "$st" != Z* ]]; }

# stop_recorded ROOT [PREFIX]: stop the daemons recorded under ROOT (newest first), TERM then KILL after 10 s;
# only those whose name starts with PREFIX when given. A PID is stopped only while it still runs the program
# it was recorded for (its command line or environment names a path under ROOT), so a reused PID is never hit.
stop_recorded() {
  local root=$1 prefix=${2:-} pids="$1/pids" name pid
  [ -f "$pids" ] || return 0
  tac "$pids" | while read -r name pid; do
    [[ "$name" == "$prefix"* ]] || continue
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
       && cat "/proc/$pid/cmdline" "/proc/$pid/environ" 2>/dev/null | tr '\0' '\n' | grep -qF "$root/"; then
      kill "$pid" 2>/dev/null && echo "stopped $name ($pid)"
      for _ in $(seq 1 40); do running "$pid" || break; sleep 0.25; done
      running "$pid" && kill -9 "$pid" 2>/dev/null && echo "killed $name ($pid)"
    fi
  done
  if [ -n "$prefix" ]; then
    grep -v "^$prefix" "$pids" > "$pids.rest" || true
    mv "$pids.rest" "$pids"
  else
    rm -f "$pids"
  fi
}
