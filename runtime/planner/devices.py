"""The compute devices of this machine and their memory, read live.

    >>> list_devices()[-1]                  # doctest: +ELLIPSIS
    Device(id='cpu', name=..., kind='cpu', total_bytes=..., free_bytes=..., unified=False)

GPUs come first, in llama.cpp's order; the CPU is always there, and last. On a machine with
no GPU:

    list_devices()
    # [Device(id='cpu', name='AMD EPYC 7B13', kind='cpu', total_bytes=8335310848,
    #         free_bytes=6871932928, unified=False)]

- NVIDIA GPUs through NVML (`nvidia-ml-py`); no driver or no GPU simply means none listed.
  `CUDA_VISIBLE_DEVICES` is honoured, so `cuda:0` is the device llama.cpp calls CUDA0.
- Apple GPUs through ggml's own device query (ctypes on llama-cpp-python's `libggml`, found
  without importing `llama_cpp`, so the app may use this module). Metal shares RAM with the
  CPU: its free memory is the smaller of Metal's working-set budget and the RAM available.
- The CPU: RAM total and available (`psutil`).

Nothing here is cached: the planner compares against memory free *now*.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

DeviceKind = Literal["cpu", "cuda", "metal", "rpc"]  # rpc: a worker's (planner/workers.py)


@dataclass(frozen=True)
class Device:
    """One place a model's layers can live. Bytes are as of when it was listed."""

    id: str  # "cpu", "cuda:0", "metal:0", "rpc:host:port"
    name: str
    kind: DeviceKind
    total_bytes: int
    free_bytes: int
    unified: bool = False  # shares RAM with the CPU (Apple silicon)

    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_devices() -> list[Device]:
    """GPUs first (in llama.cpp's order), then the CPU. Always at least the CPU."""
    gpus = nvml_devices()
    if not gpus and sys.platform == "darwin":
        gpus = metal_devices()
    return [*gpus, cpu_device()]


def cpu_device() -> Device:
    memory = psutil.virtual_memory()
    return Device("cpu", _cpu_name(), "cpu", int(memory.total), int(memory.available))


def engine_rss_bytes(pid: int | None = None) -> int:
    """Resident memory of the engine process (this one unless `pid` is given)."""
    return int(psutil.Process(pid).memory_info().rss)


def nvml_devices() -> list[Device]:
    """NVIDIA GPUs as NVML sees them, filtered and ordered by CUDA_VISIBLE_DEVICES."""
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py not installed: no NVIDIA support, not an error
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver / no GPU: the normal case on many machines
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append((index, _text(pynvml.nvmlDeviceGetUUID(handle)),
                          _text(pynvml.nvmlDeviceGetName(handle)),
                          int(memory.total), int(memory.free)))
    except pynvml.NVMLError:
        return []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    visible = _visible(found, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [Device(f"cuda:{i}", name, "cuda", total, free)
            for i, (_, _, name, total, free) in enumerate(visible)]


def _visible(found: list[tuple[int, str, str, int, int]],
             spec: str | None) -> list[tuple[int, str, str, int, int]]:
    """Apply CUDA_VISIBLE_DEVICES ("1,0", "GPU-8f…", "" or "-1") the way the CUDA runtime does:
    the list stops at the first entry that names no device."""
    if spec is None:
        return found
    out = []
    for item in (s.strip() for s in spec.split(",")):
        match = [d for d in found if (item.isdigit() and d[0] == int(item))
                 or (item.startswith(("GPU-", "MIG-")) and d[1].startswith(item))]
        if not item or len(match) != 1:
            break
        out.append(match[0])
    return out


# enum ggml_backend_dev_type (ggml-backend.h)
GGML_DEVICE_CPU, GGML_DEVICE_GPU, GGML_DEVICE_IGPU = 0, 1, 2


@dataclass(frozen=True)
class GgmlDevice:
    name: str
    description: str
    type: int
    total_bytes: int
    free_bytes: int


def metal_devices(lib_path: Path | None = None) -> list[Device]:
    """Apple GPUs from ggml's device list, their free memory capped by available RAM."""
    devices = ggml_devices(lib_path)
    available = int(psutil.virtual_memory().available)
    gpus = [d for d in devices if d.type in (GGML_DEVICE_GPU, GGML_DEVICE_IGPU)]
    return [Device(f"metal:{i}", d.description or d.name, "metal", d.total_bytes,
                   min(d.free_bytes, available), unified=True) for i, d in enumerate(gpus)]


def ggml_devices(lib_path: Path | None = None) -> list[GgmlDevice]:
    """Every device ggml registered in llama-cpp-python's library (empty if not found)."""
    path = lib_path or _libggml_path()
    if path is None:
        return []
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return []
    # size_t ggml_backend_dev_count(void);
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_count.argtypes = []
    # ggml_backend_dev_t ggml_backend_dev_get(size_t index);
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    # const char * ggml_backend_dev_name(ggml_backend_dev_t device);  (and _description)
    for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
        fn.restype = ctypes.c_char_p
        fn.argtypes = [ctypes.c_void_p]
    # enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    # void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(GgmlDevice(_text(lib.ggml_backend_dev_name(dev) or b""),
                              _text(lib.ggml_backend_dev_description(dev) or b""),
                              int(lib.ggml_backend_dev_type(dev)), total.value, free.value))
    return out


def _libggml_path() -> Path | None:
    # find_spec locates the package without importing it: `app` must never import llama_cpp.
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    names = {"darwin": "libggml.dylib", "win32": "ggml.dll"}
    candidate = lib_dir / names.get(sys.platform, "libggml.so")
    return candidate if candidate.exists() else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
