#!/usr/bin/env bash
# Single-node Slurm (Debian 12: slurm-wlm 22.05.8) for CI, without systemd. Run as root.
# Usage: slurm_ci.sh start|stop   (start also stops leftovers of an earlier start)
# Env knobs: NCPUS (default nproc), FAKE_GPUS (default 2), ACCOUNTING=1 (slurmdbd+MariaDB so `sacct` works),
#   CRED_EXPIRE (default 20 s; Slurm's 120): a requeued job waits CRED_EXPIRE+1 s before it can start again.
set -euo pipefail

# ---- stop: by PID file only, and only if that PID really is the expected daemon ----
stop_pid() {  # stop_pid <pidfile> <comm>
  local pidfile=$1 comm=$2 pid
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$comm" ]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do   # gone, or a zombie waiting for PID 1 to reap it
      [ -e /proc/"$pid" ] && [ "$(awk '{print $3}' /proc/"$pid"/stat 2>/dev/null)" != Z ] || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}
slurm_stop() {
  stop_pid /run/slurmd.pid slurmd
  stop_pid /run/slurmctld.pid slurmctld
  stop_pid /run/slurmdbd.pid slurmdbd
  if [ -s /run/mysqld/mysqld.pid ] && command -v mysqladmin >/dev/null; then
    /etc/init.d/mariadb stop >/dev/null 2>&1 || true   # mysqladmin shutdown; mysqld_safe exits with it
  fi
  stop_pid /run/munge/munged.pid munged
}

slurm_start() {
NCPUS=${NCPUS:-$(nproc)}
FAKE_GPUS=${FAKE_GPUS:-2}
ACCOUNTING=${ACCOUNTING:-1}
CRED_EXPIRE=${CRED_EXPIRE:-20}
MEM_MB=${MEM_MB:-$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 * 9 / 10 ))}

pkgs="slurmctld slurmd slurm-client munge"
[ "$ACCOUNTING" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  apt-get update -qq
  # policy-rc.d on this image stops postinst from starting daemons; we start them ourselves below
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/munge
chown munge:munge /run/munge && chmod 0755 /run/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key

GRES=""; [ "$FAKE_GPUS" -gt 0 ] && GRES="Gres=gpu:${FAKE_GPUS}"
if [ "$ACCOUNTING" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=${CRED_EXPIRE}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/lib/slurm/slurmd
StateSaveLocation=/var/lib/slurm/slurmctld
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
${ACCT}
JobCompType=jobcomp/none
MpiDefault=none
# trust the node line below even if it claims more CPUs than nproc (NCPUS=8 -> 4 parallel 2-rank jobs)
SlurmdParameters=config_overrides
GresTypes=gpu
SlurmctldDebug=info
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdDebug=info
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=${NCPUS} RealMemory=${MEM_MB} ${GRES} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

# Fake GPUs: gres/gpu drops file-less GPUs and wants char/block devices -> symlinks to /dev/null.
# Jobs asking --gpus-per-node=N get CUDA_VISIBLE_DEVICES=0..N-1.
mkdir -p /var/lib/slurm/fakegpu
: > /etc/slurm/gres.conf
for i in $(seq 0 $((FAKE_GPUS-1))); do
  ln -sfn /dev/null /var/lib/slurm/fakegpu/gpu$i
  echo "NodeName=localhost Name=gpu File=/var/lib/slurm/fakegpu/gpu$i" >> /etc/slurm/gres.conf
done

wait_for() {  # wait_for <tries of 0.2s> <command...>
  local n=$1; shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  "$@"
}

# 1) munge
runuser -u munge -- /usr/sbin/munged
wait_for 50 bash -c 'munge -n </dev/null | unmunge'

# 2) accounting: MariaDB + slurmdbd
if [ "$ACCOUNTING" = 1 ]; then
  /etc/init.d/mariadb start >/dev/null
  wait_for 100 mysqladmin ping
  mysql -e "CREATE OR REPLACE USER 'slurm'@'localhost' IDENTIFIED BY 'slurm';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
  chmod 600 /etc/slurm/slurmdbd.conf
  /usr/sbin/slurmdbd
  wait_for 150 bash -c 'sacctmgr -n show cluster'   # slurmdbd answering (first start creates tables)
fi

# 3) controller (-c: drop saved job state of an earlier run), 4) node daemon named "localhost"
/usr/sbin/slurmctld -c
wait_for 100 bash -c 'scontrol ping | grep -q "is UP"'
/usr/sbin/slurmd -N localhost

# 5) wait until the node is idle
wait_for 150 bash -c '[ "$(sinfo -h -n localhost -o %T)" = idle ]' || { tail -n 30 /var/log/slurm/*.log; exit 1; }
sinfo
}

case "${1:-start}" in
  start) slurm_stop; slurm_start ;;
  stop) slurm_stop ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
