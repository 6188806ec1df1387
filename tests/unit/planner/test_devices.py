"""Devices: the CPU answer on this machine, NVML parsing through a fake `pynvml`, and ggml's
device query through ctypes on llama-cpp-python's real library."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.planner import devices
from runtime.planner.devices import Device, GgmlDevice, engine_rss_bytes, list_devices

GIB = 1 << 30


def test_this_machine_lists_at_least_the_cpu() -> None:
    found = list_devices()
    host = found[-1]
    assert (host.id, host.kind, host.unified) == ("cpu", "cpu", False)
    assert host.total_bytes >= host.free_bytes > 0
    assert host.name
    assert all(d.kind in ("cuda", "metal") for d in found[:-1])
    assert host.to_dict()["free_bytes"] == host.free_bytes


def test_engine_rss_grows_with_touched_memory() -> None:
    before = engine_rss_bytes()
    block = b"\x01" * (64 << 20)  # written, so resident
    after = engine_rss_bytes()
    assert after - before >= 48 << 20
    del block


@dataclass
class FakeMemory:
    total: int
    free: int
    used: int


class FakeNVML(types.ModuleType):
    """Just the part of nvidia-ml-py that runtime.planner.devices calls."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[str | bytes, str, int, int]], fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.fail_init = fail_init
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return self.gpus[handle][0]

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle][1]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> FakeMemory:
        _, _, total, free = self.gpus[handle]
        return FakeMemory(total, free, total - free)


TWO_GPUS: list[tuple[str | bytes, str, int, int]] = [(b"NVIDIA GeForce RTX 4090", "GPU-aaaa-1111", 24 * GIB, 20 * GIB),
            ("NVIDIA H100 80GB HBM3", "GPU-bbbb-2222", 80 * GIB, 79 * GIB)]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNVML:
    fake = FakeNVML(TWO_GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_nvml_gpus_are_listed_before_the_cpu(fake_nvml: FakeNVML) -> None:
    found = list_devices()
    assert found[:2] == [
        Device("cuda:0", "NVIDIA GeForce RTX 4090", "cuda", 24 * GIB, 20 * GIB),
        Device("cuda:1", "NVIDIA H100 80GB HBM3", "cuda", 80 * GIB, 79 * GIB),
    ]
    assert found[2].kind == "cpu" and len(found) == 3
    assert fake_nvml.shutdowns == 1


@pytest.mark.parametrize(("visible", "names"), [
    ("1", ["NVIDIA H100 80GB HBM3"]),
    ("1,0", ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"]),
    ("GPU-aaaa", ["NVIDIA GeForce RTX 4090"]),
    ("0,7,1", ["NVIDIA GeForce RTX 4090"]),  # CUDA stops at the first invalid entry
    ("", []),
    ("-1", []),
])
def test_cuda_visible_devices_filters_and_renumbers(
        fake_nvml: FakeNVML, monkeypatch: pytest.MonkeyPatch, visible: str, names: list[str]) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus = devices.nvml_devices()
    assert [d.name for d in gpus] == names
    assert [d.id for d in gpus] == [f"cuda:{i}" for i in range(len(names))]


def test_no_driver_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(TWO_GPUS, fail_init=True))
    assert devices.nvml_devices() == []


def test_nvml_package_missing_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert devices.nvml_devices() == []


def test_ggml_device_query_through_ctypes_on_the_real_library() -> None:
    path = devices._libggml_path()
    if path is None:
        pytest.skip("llama-cpp-python's libggml is not installed")
    found = devices.ggml_devices(path)
    host = [d for d in found if d.type == devices.GGML_DEVICE_CPU]
    assert host and host[0].name == "CPU" and host[0].total_bytes > 0


def test_ggml_device_query_without_a_library(tmp_path: Path) -> None:
    assert devices.ggml_devices(tmp_path / "libggml.so") == []


def test_metal_devices_are_unified_and_capped_by_free_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 1 << 50  # more than any test machine has free
    monkeypatch.setattr(devices, "ggml_devices", lambda lib_path=None: [
        GgmlDevice("CPU", "Apple M2 Max", devices.GGML_DEVICE_CPU, 64 * GIB, 64 * GIB),
        GgmlDevice("MTL0", "Apple M2 Max", devices.GGML_DEVICE_GPU, budget, budget)])
    (metal,) = devices.metal_devices()
    assert (metal.id, metal.kind, metal.unified, metal.name) == ("metal:0", "metal", True, "Apple M2 Max")
    assert metal.total_bytes == budget
    assert 0 < metal.free_bytes <= devices.cpu_device().total_bytes < budget  # RAM caps it
