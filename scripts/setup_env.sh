#!/usr/bin/env bash
# Create or update .venv (Python 3.12) from uv.lock, with the real Transformer Engine and nvidia-resiliency-ext.
# Idempotent and cache-friendly: TE's torch extension is an sdist compiled once (~10-15 min on 2 cores) into
# ~/.cache/vlmtrain/wheels, keyed by the torch and TE versions; later setups install that wheel in seconds.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export UV_PYTHON_DOWNLOADS=never

command -v uv >/dev/null || python3 -m pip install -q "uv>=0.8"
find_python312() {  # python3.12 on PATH if it runs (pyenv shims may not), else pyenv's 3.12
  if python3.12 -c '' 2>/dev/null; then command -v python3.12; return; fi
  local v; v=$(pyenv versions --bare 2>/dev/null | grep -m1 '^3\.12') || true
  [ -n "$v" ] && PYENV_VERSION=$v pyenv which python3.12 && return
  echo "no Python 3.12 found: install one or set UV_PYTHON" >&2; return 1
}
export UV_PYTHON=${UV_PYTHON:-$(find_python312)}
echo "[setup] python: $UV_PYTHON"
locked() { awk -v n="$1" '$0 == "name = \"" n "\"" {getline; print $3}' uv.lock | tr -d '"'; }

# Bytecode at install time (uv compiles what each step installs): with PYTHONDONTWRITEBYTECODE set, as on CI, every
# process would otherwise recompile Megatron, Bridge and transformers from source when it imports them.
# 1. Everything but the two packages that need care.
uv sync --frozen --compile-bytecode \
  --no-install-package transformer-engine-torch --no-install-package nvidia-resiliency-ext

# 2. TE's torch extension: compiled against the venv's torch and CUDA headers (nvcc needed, no GPU needed).
te=$(locked transformer-engine-torch); torch_v=$(locked torch)
wheels=${VLMTRAIN_WHEEL_CACHE:-$HOME/.cache/vlmtrain/wheels}/torch-$torch_v
mkdir -p "$wheels"
if ! ls "$wheels"/transformer_engine_torch-"$te"-*.whl >/dev/null 2>&1; then
  sp=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cuda=${CUDA_HOME:-/usr/local/cuda}
  echo "[setup] building transformer-engine-torch $te for torch $torch_v (first time ~10-15 min on 2 cores)"
  CUDA_HOME=$cuda NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=${NVTE_CUDA_ARCHS:-90} MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  CPATH=$sp/nvidia/nccl/include:$sp/nvidia/cudnn/include:$sp/nvidia/cu13/include:$cuda/include${CPATH:+:$CPATH} \
    .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$wheels" "transformer-engine-torch==$te"
fi
uv pip install -q --python .venv/bin/python --compile-bytecode --no-deps "$wheels"/transformer_engine_torch-"$te"-*.whl

# 3. nvidia-resiliency-ext ships manylinux_2_39 wheels only; its Python parts run on older glibc too
#    (the one compiled module, CUPTI tracing, is optional), so install the locked wheel for 2_39 explicitly.
uv pip install -q --python .venv/bin/python --compile-bytecode --no-deps --python-platform x86_64-manylinux_2_39 \
  "nvidia-resiliency-ext==$(locked nvidia-resiliency-ext)"

.venv/bin/python -c 'import torch, transformer_engine.pytorch, megatron.bridge, megatron.core; print("[setup] ok: torch", torch.__version__, "| megatron-bridge", megatron.bridge.__version__)' 2>&1 | tail -1
