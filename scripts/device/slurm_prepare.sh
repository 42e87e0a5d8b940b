#!/usr/bin/env bash
# Prepare, here (Debian 12, apt), the Slurm the GPU machine lacks: the .debs of slurmctld, slurmd, slurm-client,
# munge and their whole library closure, in one carry-sized folder. scripts/device/slurm_start.sh unpacks them there
# (dpkg -x, no postinst) and starts Slurm with .ci/slurm.sh. The binaries need the glibc named in GLIBC_NEEDED; a
# target with an older glibc runs them through the carried libc6's loader (slurm_start.sh decides).
# Usage (any directory of the checkout):  bash scripts/device/slurm_prepare.sh    Env: SLURM_OUT (.device-new/slurm)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
OUT=${SLURM_OUT:-.device-new/slurm}
MAX=$((60 * 1024 * 1024))   # one device call carries at most 64 MiB, working tree included
git check-ignore -q "$OUT/x" || { echo "$OUT is not ignored by git: add its folder to .git/info/exclude"; exit 2; }
TOP="slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libmunge2"
# Tools and package-management parts of the closure that a dpkg -x prefix never runs (no maintainer scripts).
SKIP="debconf cdebconf dpkg tar passwd adduser install-info ucf sensible-utils lsb-base sysvinit-utils readline-common
libdebian-installer4 libnewt0.52 libslang2 libtextwrap1 libsemanage2 libsemanage-common libsepol2 libelogind0
gcc-12-base libpam-modules libpam-modules-bin libpam-runtime debianutils init-system-helpers"
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances $TOP | grep -v '^ ' | grep -v '^<' | sort -u)
pkgs=$(comm -23 <(echo "$closure") <(echo "$SKIP" | tr ' ' '\n' | sed '/^$/d' | sort -u) | tr '\n' ' ')
rm -rf "$OUT" && mkdir -p "$OUT"
(cd "$OUT" && apt-get download -qq $pkgs libc6)   # libc6: only for targets whose glibc is older than needed
size=$(du -cb "$OUT"/*.deb | tail -1 | cut -f1)
[ "$size" -le "$MAX" ] || { echo "$((size / 1048576)) MiB of .debs: more than one carry ($((MAX / 1048576)) MiB)"; exit 1; }
# The newest GLIBC_x.y symbol version any carried binary or library asks for (libc6's own files left out).
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for d in "$OUT"/*.deb; do case $(basename "$d") in libc6_*) ;; *) dpkg -x "$d" "$tmp";; esac; done
need=$(find "$tmp" -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c 'readelf -V "$1" 2>/dev/null' _ {} \; |
  grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -1 | sed 's/GLIBC_//')
[ -n "$need" ] || { echo "no GLIBC_ symbol versions found in the unpacked binaries: readelf missing?"; exit 1; }
echo "$need" > "$OUT/GLIBC_NEEDED"
echo "prepared $OUT: $(ls "$OUT"/*.deb | wc -l) packages, $((size / 1048576)) MiB; binaries need glibc >= $need"
ls "$OUT" | sed 's/^/  /'
