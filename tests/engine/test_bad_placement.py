"""Placement settings that cannot work are refused with one typed line before anything loads,
and the engine stays usable: a tensor split over GPUs llama.cpp does not have here, a main
GPU that does not exist, more expert layers than the model has. (Splits that do not add up —
negative, all zero, empty — are refused by the settings themselves: tests/unit/planner/
test_split.py.) Fake GPUs stand in for NVML; this CPU build of llama.cpp still loads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.engine import build
from runtime.engine.engine import Engine
from runtime.errors import SettingsError
from runtime.planner import devices
from runtime.planner.devices import Device
from tests.engine.conftest import tiny_settings
from tests.fixtures.tiny_moe_gguf import write_tiny_moe_gguf

CPU = Device("cpu", "test CPU", "cpu", 64 << 30, 32 << 30)


def gpu(i: int) -> Device:
    return Device(f"cuda:{i}", f"Fake RTX {i}", "cuda", 8 << 30, 8 << 30)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> list[Device]:
    """Two fake GPUs (a GPU build of llama.cpp, as far as the factory can tell)."""
    gpus = [gpu(0), gpu(1)]
    monkeypatch.setattr(devices, "nvml_devices", lambda: gpus)
    monkeypatch.setattr(devices, "cpu_device", lambda: CPU)
    monkeypatch.setattr(build, "supports_gpu_offload", lambda: True)
    return gpus


@pytest.fixture
def engine() -> Iterator[Engine]:
    """An engine with the factory's placement (no probe, no drafting: nothing else matters)."""
    eng = Engine(plan_gpu_layers=build.auto_gpu_layers)
    eng.start()
    yield eng
    eng.stop()


def refused(engine: Engine, path: Path, message: str, **kw: object) -> None:
    """Loading `path` with `kw` raises exactly `message`; the engine then loads it plainly."""
    with pytest.raises(SettingsError) as caught:
        engine.load(tiny_settings(path, **kw))
    assert str(caught.value) == message
    assert engine.status().state == "empty"
    assert engine.load(tiny_settings(path)).n_ctx == 512  # nothing lost: the next load works


@pytest.mark.parametrize(("kw", "message"), [
    ({"tensor_split": (1, 1, 1)}, "the tensor split names 3 GPUs, but this machine has 2 GPUs"),
    ({"tensor_split": (1, 1, 1), "gpu_layers": 3},
     "the tensor split names 3 GPUs, but this machine has 2 GPUs"),
    ({"main_gpu": 2}, "main GPU 2 does not exist: this machine has GPUs 0 to 1"),
    ({"main_gpu": 2, "gpu_layers": 99}, "main GPU 2 does not exist: this machine has GPUs 0 to 1"),
])
def test_gpus_that_do_not_exist_are_refused_at_load(engine: Engine, tiny_target: Path,
                                                    machine: list[Device], kw: dict[str, object],
                                                    message: str) -> None:
    refused(engine, tiny_target, message, **kw)


def test_a_split_naming_fewer_gpus_than_there_are_loads(engine: Engine, tiny_target: Path,
                                                        machine: list[Device]) -> None:
    assert engine.load(tiny_settings(tiny_target, tensor_split=(1,))).n_ctx == 512


@pytest.mark.parametrize(("kw", "message"), [
    ({"tensor_split": (3, 1)}, "the tensor split names 2 GPUs, but this llama.cpp build runs "
                               "on the CPU only"),
    ({"main_gpu": 0}, "main GPU 0 does not exist: this llama.cpp build runs on the CPU only"),
])
def test_a_cpu_build_has_no_gpu_to_name(engine: Engine, tiny_target: Path,
                                        machine: list[Device], monkeypatch: pytest.MonkeyPatch,
                                        kw: dict[str, object], message: str) -> None:
    monkeypatch.setattr(build, "supports_gpu_offload", lambda: False)  # NVML still sees two
    refused(engine, tiny_target, message, **kw)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_moe_gguf(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


@pytest.mark.parametrize("kw", [{}, {"gpu_layers": 2}, {"gpu_layers": 0}],
                         ids=["auto layers", "2 layers", "cpu"])
def test_more_expert_layers_than_the_model_has(engine: Engine, tiny_moe: Path,
                                               machine: list[Device], kw: dict[str, object]) -> None:
    # Through the planner (auto layers) it names the model; through llama.cpp, the file.
    owner = "the model" if not kw else "tiny-moe.gguf"
    refused(engine, tiny_moe, f"MoE experts on CPU: 9 layers asked for, but {owner} has 4",
            cpu_moe=9, **kw)


def test_more_expert_layers_than_the_model_has_on_a_bare_engine(tiny_moe: Path) -> None:
    bare = Engine()
    bare.start()
    try:
        refused(bare, tiny_moe, "MoE experts on CPU: 5 layers asked for, but tiny-moe.gguf has 4",
                cpu_moe=5)
    finally:
        bare.stop()
