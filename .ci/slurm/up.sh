#!/usr/bin/env bash
# Start a private local Slurm cluster for dse's integration tests under ROOT (one directory per CI run):
# munge (its own key and socket), MariaDB and slurmdbd (for sacct), slurmctld, and two slurmd daemons on this
# one machine (nodes "node1" and "node2", both 127.0.0.1), so that 2-node reproducer jobs get two Slurm nodes.
#
#   bash .ci/slurm/up.sh ROOT     # as root; then `. ROOT/slurm/env.sh` (SLURM_CONF); bash .ci/slurm/down.sh ROOT
#
# Everything lives under ROOT/slurm: slurm.conf (found through SLURM_CONF), state, spool, logs, sockets. The
# ports are chosen free at start. It never reuses a running Slurm, MariaDB or munge, never writes /etc, and
# records the PIDs it starts in ROOT/pids (down.sh stops exactly those). Two runs side by side do not meet.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$here/lib.sh"
ROOT=$(service_root "${1:-}")
S="$ROOT/slurm"
NODES=${DSE_SLURM_NODES:-2}

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmdbd >/dev/null 2>&1 \
   || ! command -v mariadbd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm slurmctld slurmd slurm-client munge slurmdbd mariadb-server >/dev/null
fi

mkdir -p "$S/etc" "$S/state" "$S/log" "$S/munge" "$S/mysql"
for i in $(seq 1 "$NODES"); do mkdir -p "$S/spool/node$i"; done
read -r CTLD_PORT DBD_PORT DB_PORT SLURMD_PORTS <<<"$(free_ports $((3 + NODES)))"
SLURMD_PORTS=($SLURMD_PORTS)
CPUS=2
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / NODES / 2 ))  # MiB per node, half the machine
MUNGE_SOCKET="$S/munge/munge.socket"
export SLURM_CONF="$S/etc/slurm.conf"  # slurmdbd.conf and cgroup.conf are read beside it

# -- configuration -------------------------------------------------------------------------------
{
cat <<CONFEOF
ClusterName=dse
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
SlurmctldPort=$CTLD_PORT
# fast feedback for tests: short polling and kill waits, jobs over their time limit die at once
SchedulerParameters=sched_interval=1,defer_batch=0
MessageTimeout=20
KillWait=2
OverTimeLimit=0
InactiveLimit=0
MinJobAge=300
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# the munge socket for the slurmdbd connection (sacct, sacctmgr, slurmctld): Slurm reads it from here, not AuthInfo
AccountingStoragePass=$MUNGE_SOCKET
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
CONFEOF
for i in $(seq 1 "$NODES"); do
  echo "NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=${SLURMD_PORTS[$((i - 1))]}" \
       "CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
done
echo "PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
} > "$SLURM_CONF"

cat > "$S/etc/slurmdbd.conf" <<CONFEOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$S/slurmdbd.pid
LogFile=$S/log/slurmdbd.log
CONFEOF
chmod 600 "$S/etc/slurmdbd.conf"
: > "$S/etc/cgroup.conf"

# -- munge: its own key, socket, seed and log --------------------------------------------------------
(umask 077; dd if=/dev/urandom of="$S/munge/munge.key" bs=1024 count=1 status=none)
chown -R munge:munge "$S/munge"
chmod 700 "$S/munge"
runuser -u munge -- /usr/sbin/munged -F --force --socket="$MUNGE_SOCKET" --key-file="$S/munge/munge.key" \
  --pid-file="$S/munge/munged.pid" --log-file="$S/munge/munged.log" --seed-file="$S/munge/munged.seed" \
  >"$S/log/munged.out" 2>&1 &
wait_for 10 bash -c "munge -S '$MUNGE_SOCKET' -n </dev/null | unmunge -S '$MUNGE_SOCKET'"
record "$ROOT" munged "$(cat "$S/munge/munged.pid")"  # munged itself, not runuser

# -- MariaDB: its own data directory, socket and port ------------------------------------------------
mariadb-install-db --no-defaults --user=root --datadir="$S/mysql/data" >"$S/log/mariadb-install.log" 2>&1
mysql_args=(--no-defaults --user=root --socket="$S/mysql/mysqld.sock")
/usr/sbin/mariadbd --no-defaults --user=root --datadir="$S/mysql/data" --socket="$S/mysql/mysqld.sock" \
  --pid-file="$S/mysql/mysqld.pid" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
  --log-error="$S/log/mariadb.log" >/dev/null 2>&1 &
record "$ROOT" mariadbd $!
wait_for 60 mysqladmin "${mysql_args[@]}" ping
mysql "${mysql_args[@]}" <<'SQL'
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL

# -- slurmdbd, slurmctld -----------------------------------------------------------------------------
/usr/sbin/slurmdbd -D >"$S/log/slurmdbd.out" 2>&1 &
record "$ROOT" slurmdbd $!
wait_for 60 bash -c "exec 3<>/dev/tcp/127.0.0.1/$DBD_PORT"

/usr/sbin/slurmctld -D -i -f "$SLURM_CONF" >"$S/log/slurmctld.out" 2>&1 &
record "$ROOT" slurmctld $!
wait_for 60 scontrol ping
# The cluster must be known to the accounting database for sacct to list its jobs.
sacctmgr -i add cluster dse >/dev/null 2>&1 || true
sacctmgr -i add account dse Cluster=dse Description=dse Organization=dse >/dev/null 2>&1 || true
sacctmgr -i add user root Account=dse Cluster=dse >/dev/null 2>&1 || true

# -- slurmd, one per node ------------------------------------------------------------------------------
for i in $(seq 1 "$NODES"); do
  /usr/sbin/slurmd -D -N "node$i" -f "$SLURM_CONF" >"$S/log/slurmd-node$i.out" 2>&1 &
  record "$ROOT" "slurmd-node$i" $!
done

wait_for 90 bash -c "[ \$(sinfo -h -o '%T %D' | awk '\$1 == \"idle\" {n += \$2} END {print n+0}') -ge $NODES ]"
wait_for 60 sacct -n -X -S now-1minute
cat > "$S/env.sh" <<ENVEOF
export SLURM_CONF=$SLURM_CONF
export DSE_TEST_SLURM_CONF=$SLURM_CONF
ENVEOF
echo "slurm: cluster up ($NODES nodes, slurmctld port $CTLD_PORT) under $S; . $S/env.sh"
sinfo
