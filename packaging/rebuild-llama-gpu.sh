#!/usr/bin/env bash
# Rebuild llama-cpp-python for this machine's GPU: CUDA when nvcc is found, Metal on macOS.
# Usage: packaging/rebuild-llama-gpu.sh PYTHON   (make gpu passes the venv's python)
set -euo pipefail
py=${1:-python3}
version=$("$py" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
extra=${CMAKE_ARGS:-}
if [ "$(uname -s)" = "Darwin" ]; then
  args="-DGGML_METAL=on $extra"
elif command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
  args="-DGGML_CUDA=on $extra"
else
  echo "No GPU toolkit found (nvcc for CUDA, or macOS for Metal); nothing to rebuild." >&2
  exit 1
fi
echo "Rebuilding llama-cpp-python $version with CMAKE_ARGS=\"$args\""
CMAKE_ARGS="$args" "$py" -m pip install --force-reinstall --no-deps --no-cache-dir \
  "llama-cpp-python==$version"
