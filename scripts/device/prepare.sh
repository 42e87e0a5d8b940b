#!/usr/bin/env bash
# Prepare, here, the wheels the GPU machine (device tool) lacks, in carry-sized folders: the package set and versions
# come from uv.lock, so what the GPU runs use cannot drift from the project's pins.
# Usage (any directory of the checkout):
#   DEVICE_KINDS=/work/.library/device/KINDS.md bash scripts/device/prepare.sh
# Env: DEVICE_OUT (default .device) gets te1..N (TE core wheel in parts), deps1..N and cache/ (new downloads);
#      DEVICE_CACHE (default $DEVICE_OUT/cache) is looked in first and never written, so re-runs download nothing;
#      DEVICE_KINDS: KINDS.md whose package list is what the GPU image has; PYTHON312 (default .venv/bin/python).
# Then, on the device, one run per folder, back to back while the machine stays warm, each carrying only it:
#   carry [".device/te1"]  command: bash scripts/device/install.sh stage .device/te1   (... te2.., deps1..)
#   then                   command: bash scripts/device/install.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
OUT=${DEVICE_OUT:-.device}
DL=$OUT/cache
CACHE=${DEVICE_CACHE:-$DL}
PY=${PYTHON312:-$root/.venv/bin/python}
# One device call carries at most 64 MiB, working tree included: a folder gets what the tree leaves, less 2 MiB.
TREE=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
MAX=$(((62 * 1024 * 1024 - TREE) / 1048576 * 1048576))
mkdir -p "$DL"
# Keep the output out of git (and so out of every device call's working tree) when it lies in the checkout.
git check-ignore -q "$OUT/x" 2>/dev/null || case $(realpath "$OUT") in "$root"/*)
  echo "/$(realpath --relative-to="$root" "$OUT")/" >> .git/info/exclude;; esac
"$PY" -c "import packaging, pip" || { echo "set PYTHON312 to a Python 3.12 with pip and packaging (the project venv)"; exit 2; }
UV=$(command -v uv || echo "$root/.venv/bin/uv")
[ -x "$UV" ] || { echo "uv not found: python3 -m pip install 'uv>=0.8' (as scripts/setup_env.sh does)"; exit 2; }

# Built here from sdists: pure Python, no wheel on PyPI (the shared script did the same).
BUILD_HERE="antlr4-python3-runtime"
# Lock entries with no wheel for this platform that the GPU runs have done without (megatron-bridge's GPU-built
# extras). pyproject's override-dependencies already drop them (marker sys_platform=='never'); listed for safety.
NO_WHEEL="fast-hadamard-transform flashinfer-python flashinfer-cubin"
# What the GPU image already has (same list as ../shared/device/prepare.sh, plus KINDS.md's list).
HAVE="torch triton numpy setuptools pip wheel packaging typing-extensions filelock fsspec jinja2 markupsafe sympy mpmath networkx pyyaml requests urllib3 idna certifi charset-normalizer tqdm regex safetensors huggingface-hub hf-xet einops accelerate peft timm psutil protobuf grpcio pillow scipy pandas pyarrow matplotlib tensorboard tensorboard-data-server werkzeug markdown absl-py six python-dateutil tzdata pytz onnx onnxscript onnx-ir ml-dtypes sentencepiece tiktoken rich pygments markdown-it-py mdurl click attrs aiohttp aiosignal frozenlist multidict yarl propcache aiohappyeyeballs anyio httpx httpcore h11 sniffio nvidia-ml-py cloudpickle msgpack xxhash opencv-python-headless scikit-image scikit-learn joblib threadpoolctl imageio tifffile lazy-loader kiwisolver cycler fonttools contourpy pyparsing typer shellingham uvloop portalocker"
if [ -n "${DEVICE_KINDS:-}" ]; then HAVE="$HAVE $(sed -n 's/.*Packages: //p' "$DEVICE_KINDS" | tr ',' '\n' | sed 's/^ *//; s/\.$//' | tr '\n' ' ')"
else echo "note: DEVICE_KINDS unset, using the built-in list of what the GPU image has"; fi
# CUDA libraries come with the image's torch; TE is handled on its own below. The image's transformers (5.17) and
# tokenizers are newer than the lock's, so the lock's are always carried.
export HAVE BUILD_HERE NO_WHEEL CACHE DL DROP="nvidia-cu* nvidia-cuda-* nvidia-cublas nvidia-cudnn-* nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse* nvidia-nccl-* nvidia-nvjitlink nvidia-nvshmem-* nvidia-nvtx cuda-* transformer-engine*" ALWAYS="transformers tokenizers"

"$UV" export --frozen --no-hashes --no-dev --no-emit-project --quiet -o "$OUT/lock.txt"
# plan: every lock pin whose marker holds on the device (Linux x86_64, CPython 3.12) and that the image lacks ->
# "file PATH" if a wheel of that exact version is in CACHE or DL, else "need NAME==VERSION"; "skip" lines say why not.
plan() { "$PY" - "$OUT/lock.txt" <<'EOF'
import fnmatch, os, pathlib, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon, parse_wheel_filename
from packaging.version import Version
env = dict(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix",
           implementation_name="cpython", platform_python_implementation="CPython",
           python_version="3.12", python_full_version="3.12.3")
E = lambda k: os.environ[k].split()
have, drop, always = {canon(n) for n in E("HAVE")}, E("DROP"), set(E("ALWAYS"))
wheels = {}
for d in (os.environ["CACHE"], os.environ["DL"]):
    for f in sorted(pathlib.Path(d).glob("*.whl")):
        n, v, _, _ = parse_wheel_filename(f.name); wheels.setdefault((n, v), f)
off = []
for line in open(sys.argv[1]):
    if not line.strip() or line.lstrip().startswith("#"): continue
    r = Requirement(line.strip()); n = canon(r.name); v = next(iter(r.specifier)).version; pin = f"{n}=={v}"
    if r.marker and not r.marker.evaluate(env): off.append(pin); continue
    if any(fnmatch.fnmatch(n, p) for p in drop) or (n in have and n not in always): continue
    if n in E("NO_WHEEL"): print(f"skip {pin}: no wheel for manylinux x86_64; GPU runs did without it"); continue
    f = wheels.get((n, Version(v)))
    print(f"file {f}" if f else f"need {pin}")
print("skip", len(off), "lock entries whose marker never holds on Linux x86_64 (pyproject overrides etc.):", *off)
EOF
}
pipdl() { "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLAT[@]}" --find-links "$CACHE" --find-links "$DL" -d "$DL" "$@"; }
PLAT=()   # pip matches manylinux_2_N exactly, so name every N the wheels we need use (as the shared script does)
for t in _2_39 _2_38 _2_35 _2_34 _2_31 _2_28 _2_27 _2_26 _2_25 _2_24 _2_18 _2_17 _2_12 _2_5 2014 2010 1; do
  PLAT+=(--platform "manylinux${t}_x86_64"); done
PLAT+=(--platform any)

# 1. Download what is missing: all at once, or one by one to name each that has no wheel.
plan > "$OUT/plan.txt"   # (a file, so that a failing plan stops the script)
mapfile -t need < <(sed -n 's/^need //p' "$OUT/plan.txt")
if [ ${#need[@]} -gt 0 ] && ! pipdl "${need[@]}" 2>/dev/null; then
  for r in "${need[@]}"; do
    pipdl "$r" 2>/dev/null && continue
    case " $BUILD_HERE " in *" ${r%%==*} "*) "$PY" -m pip wheel -q --no-deps -w "$DL" "$r" && continue;; esac
    echo "NO WHEEL for manylinux x86_64 / cp312: $r"
  done
fi
# 2. Transformer Engine at the lock's version: core wheel (276 MB, split in parts), meta wheel, and the torch
#    extension's sdist, which install.sh builds on the GPU machine against its torch (pip needs torch here to read it).
TE=$(sed -n 's/^transformer-engine==\([^ ;]*\).*/\1/p' "$OUT/lock.txt")
tefile() { find "$CACHE" "$DL" -maxdepth 1 -name "$1" 2>/dev/null | head -1 || true; }
[ -n "$(tefile "transformer_engine_cu13-$TE-*.whl")" ] || pipdl "transformer-engine-cu13==$TE"
[ -n "$(tefile "transformer_engine-$TE-py3-none-any.whl")" ] || pipdl "transformer-engine==$TE"
[ -n "$(tefile "transformer_engine_torch-$TE.tar.gz")" ] ||
  "$PY" -m pip download -q --no-deps --no-build-isolation -d "$DL" "transformer-engine-torch==$TE"

# 3. Pack: files by name into folders of at most MAX bytes; stop if any pin still lacks its wheel.
plan > "$OUT/plan.txt"
grep '^skip' "$OUT/plan.txt" || true
if grep '^need' "$OUT/plan.txt"; then echo "the pins above have no wheel: add them to BUILD_HERE or NO_WHEEL"; exit 1; fi
rm -rf "$OUT"/te[0-9]* "$OUT"/deps[0-9]*
n=1; size=0; mkdir -p "$OUT/deps1"
# The torch extension scripts/setup_env.sh built here (same torch, CUDA 13, sm_90) goes too, renamed so that the
# install step's `*.whl` leaves it alone: install.sh tries it first and builds the sdist only if it does not import.
TORCH_V=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' "$OUT/lock.txt")
built=$(find "${VLMTRAIN_WHEEL_CACHE:-$HOME/.cache/vlmtrain/wheels}/torch-$TORCH_V" -maxdepth 1 \
  -name "transformer_engine_torch-$TE-*.whl" 2>/dev/null | head -1 || true)
rm -f "$DL"/*.whl.prebuilt
[ -n "$built" ] && cp "$built" "$DL/$(basename "$built").prebuilt"
mapfile -t files < <( (sed -n 's/^file //p' "$OUT/plan.txt"; tefile "transformer_engine-$TE-py3-none-any.whl"
  tefile "transformer_engine_torch-$TE.tar.gz"; tefile "transformer_engine_torch-$TE-*.whl.prebuilt") |
  awk -F/ '{print $NF "\t" $0}' | sort | cut -f2)
for f in "${files[@]}"; do
  s=$(stat -c %s "$f")
  if [ $((size + s)) -gt $MAX ]; then n=$((n + 1)); size=0; mkdir -p "$OUT/deps$n"; fi
  cp "$f" "$OUT/deps$n/"; size=$((size + s))
done
core=$(tefile "transformer_engine_cu13-$TE-*.whl")
split -b "$MAX" -d "$core" "$OUT/$(basename "$core").part"   # install.sh joins NAME.whl.partNN back into NAME.whl
i=1; for p in "$OUT"/*.whl.part[0-9]*; do mkdir -p "$OUT/te$i"; mv "$p" "$OUT/te$i/"; i=$((i + 1)); done
# Every folder carries the list of all of them (folder, file, bytes): install.sh names what was not staged.
(cd "$OUT" && for f in te[0-9]*/* deps[0-9]*/*; do
  [ "${f##*/}" = MANIFEST.txt ] || echo "${f%%/*} ${f##*/} $(stat -c %s "$f")"; done) > "$OUT/manifest.txt"
for d in "$OUT"/te[0-9]* "$OUT"/deps[0-9]*; do cp "$OUT/manifest.txt" "$d/MANIFEST.txt"; done
echo "prepared (each at most $((MAX / 1048576)) MiB):"; du -sh "$OUT"/te[0-9]* "$OUT"/deps[0-9]* | sed 's/^/  /'
