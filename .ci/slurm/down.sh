#!/usr/bin/env bash
# Stop the daemons that .ci/slurm/up.sh ROOT started, by the PIDs it recorded under ROOT (newest first).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$here/lib.sh"
[ -n "${1:-}" ] || { echo "usage: $0 ROOT" >&2; exit 2; }
[ -d "$1" ] || { echo "slurm: nothing to stop under $1"; exit 0; }
ROOT=$(cd "$1" && pwd)
for name in slurmd- slurmctld slurmdbd mariadbd munged; do stop_recorded "$ROOT" "$name"; done
