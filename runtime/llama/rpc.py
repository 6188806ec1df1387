"""llama.cpp's RPC backend (ggml-rpc) through ctypes: lend this machine's devices to others
(`serve`, what `outrider worker` runs), and use other machines' devices in a load
(`model_devices`, the list `llama_model_params.devices` takes).

    serve("127.0.0.1:50052", [cpu_device()], n_threads=4)   # blocks, serving one client at a time
    devices = model_devices(("10.0.0.2:50052",))            # RPC devices first, then local GPUs

llama-cpp-python binds neither (its `llama_model_params.devices` is a bare pointer), so the
functions are taken from the libggml-rpc its build installs (`packaging/llama_wheel.py`
builds it with `-DGGML_RPC=ON`). The C prototypes are the comments above each binding
(ggml/include/ggml-rpc.h, ggml-backend.h of the vendored llama.cpp).

A worker's devices are handed to the one load that names them (`llama_model_params.devices`),
never registered process-wide: another load in the same process keeps its own devices.
Before any of this the workers have answered `runtime.planner.workers.probe_workers`: the
RPC client aborts the process on a worker that cannot serve.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as L
from llama_cpp._ctypes_extensions import load_shared_library

from runtime.errors import WorkerError

# enum ggml_backend_dev_type
DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU = 0, 1, 2

_NO_RPC = ("this llama.cpp build has no RPC backend: rebuild it with `make` (which adds "
           "-DGGML_RPC=ON, packaging/llama_wheel.py)")


@dataclass(frozen=True)
class LocalDevice:
    """One of this machine's ggml devices, as a worker offers it."""

    name: str  # "CPU", "CUDA0"
    description: str
    type: int
    free_bytes: int
    total_bytes: int
    handle: int  # ggml_backend_dev_t


class _Ggml:
    """The ggml functions this module calls, typed once."""

    def __init__(self) -> None:
        lib_dir = Path(L.__file__).parent / "lib"
        self.ggml = load_shared_library("ggml", lib_dir)
        self.base = load_shared_library("ggml-base", lib_dir)
        try:
            self.rpc: ctypes.CDLL | None = load_shared_library("ggml-rpc", lib_dir)
        except (FileNotFoundError, OSError, RuntimeError):
            self.rpc = None
        vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        # size_t ggml_backend_dev_count(void);  ggml_backend_dev_t ggml_backend_dev_get(size_t);
        _sig(self.ggml.ggml_backend_dev_count, sz)
        _sig(self.ggml.ggml_backend_dev_get, vp, sz)
        # const char * ggml_backend_dev_name(dev);  const char * ggml_backend_dev_description(dev);
        _sig(self.base.ggml_backend_dev_name, cp, vp)
        _sig(self.base.ggml_backend_dev_description, cp, vp)
        # enum ggml_backend_dev_type ggml_backend_dev_type(dev);
        _sig(self.base.ggml_backend_dev_type, ctypes.c_int, vp)
        # void ggml_backend_dev_memory(dev, size_t * free, size_t * total);
        _sig(self.base.ggml_backend_dev_memory, None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
        # ggml_backend_reg_t ggml_backend_dev_backend_reg(dev);  const char * ggml_backend_reg_name(reg);
        _sig(self.base.ggml_backend_dev_backend_reg, vp, vp)
        _sig(self.base.ggml_backend_reg_name, cp, vp)
        # size_t ggml_backend_reg_dev_count(reg);  ggml_backend_dev_t ggml_backend_reg_dev_get(reg, size_t);
        _sig(self.base.ggml_backend_reg_dev_count, sz, vp)
        _sig(self.base.ggml_backend_reg_dev_get, vp, vp, sz)
        if self.rpc is not None:
            # ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
            _sig(self.rpc.ggml_backend_rpc_add_server, vp, cp)
            # void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
            #         size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices);
            _sig(self.rpc.ggml_backend_rpc_start_server, None, cp, cp, sz, sz, ctypes.POINTER(vp))


def _sig(fn: Any, restype: object, *argtypes: object) -> None:
    fn.restype = restype
    fn.argtypes = list(argtypes)


@cache
def _ggml() -> _Ggml:
    return _Ggml()


def rpc_available() -> bool:
    """Whether the installed llama.cpp carries the RPC backend."""
    return _ggml().rpc is not None


def local_devices() -> list[LocalDevice]:
    """This machine's devices as ggml registered them (the CPU, and GPUs of a GPU build)."""
    g = _ggml()
    out = []
    for i in range(g.ggml.ggml_backend_dev_count()):
        dev = g.ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(LocalDevice(_text(g.base.ggml_backend_dev_name(dev)),
                               _text(g.base.ggml_backend_dev_description(dev)),
                               int(g.base.ggml_backend_dev_type(dev)),
                               int(free.value), int(total.value), int(dev)))
    return out


def has_local_gpu() -> bool:
    """A GPU backend of this machine (CUDA, Metal ...), not counting RPC: llama.cpp's own
    `llama_supports_gpu_offload` also says yes for a CPU build that merely has RPC."""
    g = _ggml()
    return any(d.type in (DEVICE_GPU, DEVICE_IGPU)
               and _text(g.base.ggml_backend_reg_name(
                   g.base.ggml_backend_dev_backend_reg(d.handle))) != "RPC"
               for d in local_devices())


def model_devices(workers: Sequence[str]) -> ctypes.Array[ctypes.c_void_p]:
    """The NULL-ended device array for `llama_model_params.devices`: each worker's devices
    in order, then this machine's GPUs (discrete ones, else integrated), as llama.cpp orders
    them by default. The CPU is not listed: llama.cpp always keeps it for what is not
    offloaded. Each worker must have answered the probe first."""
    g = _ggml()
    if g.rpc is None:
        raise WorkerError(_NO_RPC)
    devices: list[int] = []
    for endpoint in workers:
        reg = g.rpc.ggml_backend_rpc_add_server(endpoint.encode())
        if not reg:
            raise WorkerError(f"worker {endpoint}: llama.cpp could not connect to it")
        devices += [int(g.base.ggml_backend_reg_dev_get(reg, i))
                    for i in range(g.base.ggml_backend_reg_dev_count(reg))]
    local = local_devices()
    gpus = [d.handle for d in local if d.type == DEVICE_GPU]
    devices += gpus or [d.handle for d in local if d.type == DEVICE_IGPU]
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def serve(endpoint: str, devices: Sequence[LocalDevice], n_threads: int,
          cache_dir: Path | None = None) -> None:
    """Serve `devices` to RPC clients on `endpoint` ("host:port"); blocks for as long as the
    server runs (llama.cpp returns only when it cannot listen or accept). `cache_dir` keeps
    tensors a client sent, by hash, so the next load of the same model skips sending them."""
    g = _ggml()
    if g.rpc is None:
        raise WorkerError(_NO_RPC)
    array = (ctypes.c_void_p * len(devices))(*[d.handle for d in devices])
    sys.stdout.flush()  # llama.cpp prints its banner through C's stdout
    g.rpc.ggml_backend_rpc_start_server(
        endpoint.encode(), str(cache_dir).encode() if cache_dir else None, n_threads,
        len(devices), array)


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", errors="replace")
