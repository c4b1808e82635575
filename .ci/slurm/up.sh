#!/usr/bin/env bash
# Start a local Slurm cluster for dse's integration tests: munge, MariaDB, slurmdbd (for sacct),
# slurmctld, and two slurmd daemons on this one machine (nodes "node1" and "node2", both 127.0.0.1),
# so that 2-node reproducer jobs really get two Slurm nodes.
#
# Idempotent: when the cluster already answers (sinfo shows nodes idle, sacct answers) it does nothing.
# Needs root. PIDs of the daemons it starts go to $DSE_SLURM_STATE/pids (stopped by down.sh).
set -euo pipefail

STATE=${DSE_SLURM_STATE:-/var/lib/dse-slurm}
CONF=/etc/slurm
NODES=${DSE_SLURM_NODES:-2}
mkdir -p "$STATE"

ready() {
  sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && sacct -n -X -S now-1minute >/dev/null 2>&1
}

if command -v sinfo >/dev/null 2>&1 && ready; then
  echo "slurm: reusing the running cluster"; exit 0
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmdbd >/dev/null 2>&1 || ! command -v mariadbd >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm slurmctld slurmd slurm-client munge slurmdbd mariadb-server >/dev/null
fi

CPUS=2
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / NODES / 2 ))  # MiB per node, half the machine

# -- configuration -------------------------------------------------------------------------------
mkdir -p "$CONF" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /run/mysqld
for i in $(seq 1 "$NODES"); do mkdir -p "/var/spool/slurmd/node$i"; done
cat > "$CONF/slurm.conf" <<CONFEOF
ClusterName=dse
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
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
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
NodeName=node[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONFEOF

cat > "$CONF/slurmdbd.conf" <<CONFEOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$STATE/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
CONFEOF
chmod 600 "$CONF/slurmdbd.conf"
: > "$CONF/cgroup.conf"

PIDS="$STATE/pids"
touch "$PIDS"
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
pid_of() { awk -v n="$1" '$1 == n {print $2}' "$PIDS" | tail -n1; }
record() { echo "$1 $2" >> "$PIDS"; }
wait_for() {  # wait_for SECONDS CMD...
  local t=$1; shift
  for _ in $(seq 1 $((t * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  echo "timed out waiting for: $*" >&2; return 1
}

# -- munge ---------------------------------------------------------------------------------------
if ! (munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1); then
  [ -s /etc/munge/munge.key ] || (umask 077; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none)
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged --force
  wait_for 10 bash -c "munge -n </dev/null | unmunge"
  record munged "$(cat /run/munge/munged.pid)"
fi

# -- MariaDB -------------------------------------------------------------------------------------
if ! mysqladmin ping >/dev/null 2>&1; then
  chown -R mysql:mysql /run/mysqld /var/lib/mysql
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  /usr/sbin/mariadbd --user=mysql --datadir=/var/lib/mysql --socket=/run/mysqld/mysqld.sock \
    --pid-file=/run/mysqld/mysqld.pid --bind-address=127.0.0.1 >/var/log/slurm/mariadb.log 2>&1 &
  record mariadbd $!
  wait_for 60 mysqladmin ping
fi
mysql -u root <<'SQL'
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL

# -- slurmdbd ------------------------------------------------------------------------------------
if ! alive "$(pid_of slurmdbd)"; then
  /usr/sbin/slurmdbd -D >/var/log/slurm/slurmdbd.out 2>&1 &
  record slurmdbd $!
  wait_for 60 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819'
fi

# -- slurmctld -----------------------------------------------------------------------------------
if ! alive "$(pid_of slurmctld)"; then
  /usr/sbin/slurmctld -D -i >/var/log/slurm/slurmctld.out 2>&1 &
  record slurmctld $!
  wait_for 60 scontrol ping
fi
# The cluster must be known to the accounting database for sacct to list its jobs.
sacctmgr -i add cluster dse >/dev/null 2>&1 || true
sacctmgr -i add account dse Cluster=dse Description=dse Organization=dse >/dev/null 2>&1 || true
sacctmgr -i add user root Account=dse Cluster=dse >/dev/null 2>&1 || true

# -- slurmd, one per node --------------------------------------------------------------------------
for i in $(seq 1 "$NODES"); do
  if ! alive "$(pid_of "slurmd-node$i")"; then
    /usr/sbin/slurmd -D -N "node$i" >"/var/log/slurm/slurmd-node$i.out" 2>&1 &
    record "slurmd-node$i" $!
  fi
done

wait_for 90 bash -c "[ \$(sinfo -h -o '%T %D' | awk '\$1 == \"idle\" {n += \$2} END {print n+0}') -ge $NODES ]"
wait_for 60 sacct -n -X -S now-1minute
echo "slurm: cluster up ($NODES nodes)"
sinfo
