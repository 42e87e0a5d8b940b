#!/usr/bin/env bash
# Single-node Slurm (Debian 12: slurm-wlm 22.05.8) for CI, without systemd. Run as root.
# Usage: slurm_ci.sh start|stop   (start also stops leftovers of an earlier start)
# Env knobs: NCPUS (default nproc), FAKE_GPUS (default 2), ACCOUNTING=1 (slurmdbd+MariaDB so `sacct` works),
#   CRED_EXPIRE (default 20 s; Slurm's 120): a requeued job waits CRED_EXPIRE+1 s before it can start again.
#   GPUS=N: N real GPUs as gres (File=/dev/nvidia<i>) instead of FAKE_GPUS.
#   SLURM_PREFIX=DIR: the packages are already unpacked there (dpkg -x, scripts/device/slurm_start.sh) instead of
#     installed by apt: every Slurm/munge program runs through a wrapper in DIR/bin (put it first on PATH) that
#     starts it with SLURM_LOADER (default the system's ld-linux; an older glibc: the carried libc6's loader) and
#     the prefix's libraries, without exporting LD_LIBRARY_PATH to jobs.
set -euo pipefail

# ---- stop: by PID file only, and only if that PID really is the expected daemon ----
stop_pid() {  # stop_pid <pidfile> <comm>
  local pidfile=$1 comm=$2 pid
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  # the program itself, or (SLURM_PREFIX) a loader running it: then the program's path is in the command line
  if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$comm" ] ||
     tr '\0' '\n' < /proc/"$pid"/cmdline 2>/dev/null | grep -qx ".*/$comm\(-wlm\)\?"; then
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

# What went wrong, then exit 1: daemon log tails and what Slurm says about the node and the jobs.
diagnose() {
  echo "[slurm.sh] FAILED: $*" >&2
  for f in /var/log/munge/munged.log /var/log/slurm/*.log; do
    [ -s "$f" ] && { echo "---- tail $f" >&2; tail -n 30 "$f" >&2; }
  done
  for c in "sinfo -N -l" "squeue -a" "scontrol show node" "scontrol show job"; do
    echo "---- $c" >&2; timeout 10 $c >&2 2>&1 || true
  done
  # a node daemon that never registered says why in the foreground (its errors before it logs to the file)
  if ! pgrep -x slurmd >/dev/null && ! pgrep -f "sbin/slurmd " >/dev/null; then
    echo "---- slurmd -D -vvv (10 s, foreground)" >&2
    timeout 10 "${SBIN:-/usr/sbin}/slurmd" -D -vvv -N localhost >&2 2>&1 || true
  fi
  exit 1
}

# SLURM_PREFIX: one wrapper per program in $SLURM_PREFIX/bin; slurmd runs the compiled-in /usr/sbin/slurmstepd.
prefix_wrappers() {
  local P=$SLURM_PREFIX loader=${SLURM_LOADER:-/lib64/ld-linux-x86-64.so.2} lib=/lib/x86_64-linux-gnu f
  local libs="$P/usr/lib/x86_64-linux-gnu/slurm-wlm:$P/usr/lib/x86_64-linux-gnu:$P$lib"
  case $loader in "$P"/*) libs="$(dirname "$loader"):$libs";; esac   # the carried glibc first, with its loader
  [ -x "$loader" ] || diagnose "loader $loader not found"
  mkdir -p "$P/bin"
  # Debian ships slurmd-wlm etc. and its postinst (not run here) links the plain names; Slurm's daemons go by
  # their program name (run_in_daemon), so they must run under the plain one.
  for f in "$P"/usr/sbin/*-wlm; do ln -sfn "$(basename "$f")" "${f%-wlm}"; done
  for f in "$P"/usr/bin/* "$P"/usr/sbin/*; do
    case $f in *-wlm) continue;; esac
    printf '#!/bin/sh\nexec %s --library-path %s %s "$@"\n' "$loader" "$libs" "$f" > "$P/bin/${f##*/}"
    chmod 0755 "$P/bin/${f##*/}"
  done
  if [ ! -e /usr/sbin/slurmstepd ] || grep -qs "$P/usr/sbin/slurmstepd" /usr/sbin/slurmstepd; then  # none, or ours
    cp "$P/bin/slurmstepd" /usr/sbin/slurmstepd || diagnose "cannot write /usr/sbin/slurmstepd, the path slurmd runs"
  elif ! cmp -s /usr/sbin/slurmstepd "$P/usr/sbin/slurmstepd"; then
    diagnose "/usr/sbin/slurmstepd (compiled into slurmd) is another Slurm's: remove it or use that Slurm"
  fi
  export PATH=$P/bin:$PATH
}

slurm_start() {
NCPUS=${NCPUS:-$(nproc)}
FAKE_GPUS=${FAKE_GPUS:-2}
GPUS=${GPUS:-0}
ACCOUNTING=${ACCOUNTING:-1}
CRED_EXPIRE=${CRED_EXPIRE:-20}
MEM_MB=${MEM_MB:-$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 * 9 / 10 ))}
SBIN=/usr/sbin
PLUGINS=""

if [ -n "${SLURM_PREFIX:-}" ]; then
  [ "$ACCOUNTING" = 1 ] && diagnose "ACCOUNTING=1 needs slurmdbd and MariaDB, which SLURM_PREFIX does not carry"
  prefix_wrappers
  SBIN=$SLURM_PREFIX/bin
  PLUGINS="PluginDir=$SLURM_PREFIX/usr/lib/x86_64-linux-gnu/slurm-wlm"
else
  pkgs="slurmctld slurmd slurm-client munge"
  [ "$ACCOUNTING" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
  missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ]; then
    apt-get update -qq
    # policy-rc.d on this image stops postinst from starting daemons; we start them ourselves below
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
fi

# munged runs as the munge user where there is one (apt's postinst made it); else as root (--force)
if [ -z "${MUNGE_USER:-}" ]; then MUNGE_USER=root; getent passwd munge >/dev/null && MUNGE_USER=munge; fi
mkdir -p /etc/slurm /etc/munge /var/lib/munge /var/log/munge /var/lib/slurm/slurmctld /var/lib/slurm/slurmd \
  /var/log/slurm /run/munge
# -R: files an earlier start as another munge user left (a root munged's log) make munged refuse to start
chown -R "$MUNGE_USER:" /run/munge /etc/munge /var/lib/munge /var/log/munge && chmod 0755 /run/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown "$MUNGE_USER:" /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key

NGPU=$FAKE_GPUS; [ "$GPUS" -gt 0 ] && NGPU=$GPUS
GRES=""; [ "$NGPU" -gt 0 ] && GRES="Gres=gpu:${NGPU}"
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
${PLUGINS}
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

# Nothing here uses cgroups (linuxproc, task/none, no accounting), but slurmd loads a cgroup plugin anyway: v1's init
# does nothing, while autodetect on a cgroup-v2 host picks v2, which needs systemd's dbus (bare GPU machine: none).
echo "CgroupPlugin=cgroup/v1" > /etc/slurm/cgroup.conf

# Fake GPUs: gres/gpu drops file-less GPUs and wants char/block devices -> symlinks to /dev/null.
# Real GPUs: their /dev/nvidia<i> (a sandbox without them gets the /dev/null stand-ins, and says so).
# Jobs asking --gpus-per-node=N get CUDA_VISIBLE_DEVICES=0..N-1.
mkdir -p /var/lib/slurm/fakegpu
: > /etc/slurm/gres.conf
for i in $(seq 0 $((NGPU-1))); do
  dev=/var/lib/slurm/fakegpu/gpu$i
  if [ "$GPUS" -gt 0 ] && [ -c /dev/nvidia$i ]; then dev=/dev/nvidia$i
  else
    [ "$GPUS" -gt 0 ] && echo "[slurm.sh] note: no /dev/nvidia$i here: gres gpu $i is a count only (/dev/null stand-in)"
    ln -sfn /dev/null "$dev"
  fi
  echo "NodeName=localhost Name=gpu File=$dev" >> /etc/slurm/gres.conf
done

wait_for() {  # wait_for <tries of 0.2s> <command...>
  local n=$1; shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  "$@"
}

# 1) munge
if [ "$MUNGE_USER" = munge ]; then runuser -u munge -- "$SBIN/munged"; else "$SBIN/munged" --force; fi ||
  diagnose "munged exited $? at start"
wait_for 50 bash -c 'munge -n </dev/null | unmunge' || diagnose "munged does not answer"

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
"$SBIN/slurmctld" -c || diagnose "slurmctld exited $? at start"
wait_for 100 bash -c 'scontrol ping | grep -q "is UP"' || diagnose "slurmctld is not up"
"$SBIN/slurmd" -N localhost || diagnose "slurmd exited $? at start"

# 5) wait until the node is idle
wait_for 150 bash -c '[ "$(sinfo -h -n localhost -o %T)" = idle ]' || diagnose "node localhost is not idle"
sinfo
scontrol --version
sinfo -h -n localhost -o "node %n: %c CPUs, %m MB, gres %G"
}

case "${1:-start}" in
  start) slurm_stop; slurm_start ;;
  stop) slurm_stop ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
