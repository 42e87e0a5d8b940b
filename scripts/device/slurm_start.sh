#!/usr/bin/env bash
# Runs on the GPU machine (no network, root, bare): unpacks the .debs scripts/device/slurm_prepare.sh packed (dpkg -x
# into SLURM_ROOT, no maintainer scripts) and starts a one-node Slurm with .ci/slurm.sh's SLURM_PREFIX mode: munge,
# slurmctld, slurmd, the local GPUs as gres, no accounting, no cgroups. Then put $SLURM_ROOT/bin first on PATH.
#   bash scripts/device/slurm_start.sh stage .device-new/slurm   in the call that carries the folder: copy to /tmp/dev-slurm
#   bash scripts/device/slurm_start.sh [DEBS_DIR]                 unpack (default the staged copy) and start
#   bash scripts/device/slurm_start.sh stop
# Env: SLURM_ROOT (default /tmp/slurm-root), GPUS (default: nvidia-smi's count; 0 = FAKE_GPUS stand-ins),
#   NCPUS, CRED_EXPIRE (as .ci/slurm.sh). A target glibc older than the binaries' (GLIBC_NEEDED) gets the carried
#   libc6's loader (SLURM_CARRIED_GLIBC=1 forces it, to try that path). On this CPU machine: `GPUS=0 FAKE_GPUS=2 bash scripts/device/slurm_start.sh .device-new/slurm`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STAGE=/tmp/dev-slurm
export SLURM_ROOT=${SLURM_ROOT:-/tmp/slurm-root}
case "${1:-}" in
  stage) mkdir -p "$STAGE"; cp "$2"/* "$STAGE/"; echo "staged: $(ls "$STAGE" | wc -l) files in $STAGE"; exit;;
  stop) SLURM_PREFIX=$SLURM_ROOT bash "$here/../../.ci/slurm.sh" stop; exit;;
esac
DEBS=${1:-$STAGE}
ls "$DEBS"/*.deb >/dev/null 2>&1 || { echo "no .debs in $DEBS: stage .device-new/slurm first (slurm_prepare.sh)"; exit 2; }

# dpkg -x where dpkg is; else the same by hand (a .deb is an ar archive holding data.tar.*).
unpack() {  # unpack DEB DIR
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", f"{sys.argv[1]}: not a .deb"
pos = 8
while pos < len(data):
    name, size = data[pos:pos + 16].decode().strip().rstrip("/"), int(data[pos + 48:pos + 58])
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(data[pos + 60:pos + 60 + size])).extractall(sys.argv[2], filter="tar")
    pos += 60 + size + size % 2
PY
}
rm -rf "$SLURM_ROOT" && mkdir -p "$SLURM_ROOT/glibc"
for d in "$DEBS"/*.deb; do
  case $(basename "$d") in libc6_*) unpack "$d" "$SLURM_ROOT/glibc";; *) unpack "$d" "$SLURM_ROOT";; esac
done

# The system's glibc if it is new enough for the binaries, else the carried one's loader (and its libc).
need=$(cat "$DEBS/GLIBC_NEEDED")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ "${SLURM_CARRIED_GLIBC:-0}" != 1 ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" = "$need" ]; then
  export SLURM_LOADER=/lib64/ld-linux-x86-64.so.2
  echo "[slurm_start] system glibc $have >= $need: system loader"
else
  export SLURM_LOADER=$SLURM_ROOT/glibc/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
  echo "[slurm_start] system glibc ${have:-unknown} < $need: the carried glibc's loader $SLURM_LOADER"
fi
if [ -z "${GPUS:-}" ]; then GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
export GPUS ACCOUNTING=0 SLURM_PREFIX=$SLURM_ROOT
[ "$GPUS" -gt 0 ] && export FAKE_GPUS=0
echo "[slurm_start] $(uname -srm); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); GPUs: $GPUS; uid $(id -u)"
bash "$here/../../.ci/slurm.sh" start
echo "[slurm_start] Slurm is up: export PATH=$SLURM_ROOT/bin:\$PATH"
