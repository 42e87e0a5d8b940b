#!/usr/bin/env bash
# Runs on the GPU machine (no network): installs what scripts/device/prepare.sh packed into /tmp/site.
#   bash scripts/device/install.sh stage FOLDER...  in each call that carries one .device/teN or depsN folder:
#                                                  copies it to /tmp/dev, which outlives the call while warm
#   bash scripts/device/install.sh                 once all are staged (exit 2 naming any folder not staged);
#                                                  later calls: export PYTHONPATH=/tmp/site
set -euo pipefail
DEV=${DEVICE_STAGE:-/tmp/dev}
SITE=${DEVICE_SITE:-/tmp/site}
if [ "${1:-}" = stage ]; then shift; mkdir -p "$DEV"; for d in "$@"; do cp "$d"/* "$DEV/"; done; echo "staged: $(find "$DEV" -type f | wc -l) files"; exit; fi
cd "$DEV"
# A staging call that never ran (a machine that failed to start takes the call with it) left the TE core wheel
# short, and pip then installed an empty `transformer-engine`: check every staged file first.
if [ -f MANIFEST.txt ]; then
  missing=$(while read -r dir name size; do
    case $name in *.part[0-9]*) [ -e "${name%.part[0-9]*}" ] && continue;; esac  # joined by an earlier run
    [ "$(stat -c %s "$name" 2>/dev/null)" = "$size" ] || echo "$dir"
  done < MANIFEST.txt | sort -u | tr '\n' ' ')
  [ -z "$missing" ] || { echo "not staged (or cut short): $missing- stage each again (install.sh stage .device/<folder>)"; exit 2; }
fi
# The TE core wheel came in parts NAME.whl.part00, part01, ... (one call carries at most 64 MiB).
for first in ./*.whl.part00; do
  [ -e "$first" ] || break
  w=${first%.part00}; cat "$w".part[0-9]* > "$w" && rm -f "$w".part[0-9]*
done
# --no-deps: prepare.sh already chose exactly the lock's versions of what the image lacks.
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" ./*.whl 2>&1 | grep -v "WARNING: Target" || true
# TE's torch extension: the wheel scripts/setup_env.sh built on the CPU machine against the same torch (cu130, sm_90)
# when prepare.sh found one and it imports here; else its sdist, built against the image's torch, CUDA 13 and the
# nvidia wheels' headers (H200: sm_90). --target would replace SITE's transformer_engine package,
# so the extension is merged in by hand.
export PYTHONPATH=$SITE
merge_te_torch() { cp -r /tmp/te-torch/transformer_engine/* "$SITE/transformer_engine/" && cp -r /tmp/te-torch/*.dist-info "$SITE/"; }
prebuilt=$(ls ./transformer_engine_torch-*.whl.prebuilt 2>/dev/null | head -1 || true)
if [ -n "$prebuilt" ] && cp "$prebuilt" "/tmp/${prebuilt%.prebuilt}" &&
   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/te-torch "/tmp/${prebuilt%.prebuilt}" &&
   merge_te_torch && python3 -c "import transformer_engine.pytorch" >/dev/null 2>&1; then
  echo "TE torch extension: the prebuilt wheel"
else
  [ -n "$prebuilt" ] && echo "TE torch extension: the prebuilt wheel did not import here; building the sdist"
  rm -rf /tmp/te-torch
  SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
  CUDA_HOME=/usr/local/cuda CPATH=$SP/nvidia/nccl/include:$SP/nvidia/cudnn/include:$SP/nvidia/cu13/include:/usr/local/cuda/include \
    MAX_JOBS=$(nproc) NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 \
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/te-torch ./transformer_engine_torch-*.tar.gz
  merge_te_torch
fi
# Bytecode once, in parallel: without it every training process recompiled Megatron, Bridge and transformers (the
# compile-time SyntaxWarnings in every train.log); compileall writes even where PYTHONDONTWRITEBYTECODE is set.
python3 -m compileall -q -j "$(nproc)" "$SITE" >/dev/null 2>&1 || true
python3 -c "import torch, transformer_engine.pytorch, megatron.bridge; print('device env ready: torch', torch.__version__, 'gpus', torch.cuda.device_count())"
