#!/usr/bin/env bash
# Rebuild llama-cpp-python for this machine's GPU: CUDA when nvcc is found, Metal on macOS.
# Usage: packaging/rebuild-llama-gpu.sh PYTHON   (make gpu passes the venv's python)
# The build (with the RPC backend, as every build) is packaging/llama_wheel.py's.
set -euo pipefail
py=${1:-python3}
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
"$py" "$(dirname "$0")/llama_wheel.py" --extra "$args"
