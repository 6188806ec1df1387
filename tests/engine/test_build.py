"""The one engine factory (runtime.engine.build): what it wires in, that "auto" GPU layers
reach llama.cpp as the planner's count, and that every command builds its engine there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.cli.main import main
from runtime.engine import build, loader
from runtime.engine.build import auto_gpu_layers, build_engine
from runtime.engine.engine import Engine
from runtime.engine.probe import LoadProbe
from runtime.errors import OutriderError
from runtime.gguf.info import read_model_info
from runtime.planner import devices
from runtime.planner.devices import Device
from runtime.planner.gpu_layers import Offload
from runtime.planner.plan import GPU_RUNTIME_OVERHEAD, plan_memory
from runtime.settings.load import LoadSettings
from runtime.speculative.speculation import Speculation

GIB = 1 << 30
MIB = 1 << 20
# Room for 4 of the tiny target's 5 offloadable layers at context 256 (and the CUDA runtime):
# a count that is neither "none" nor "all", so only the planner can have chosen it.
FAKE_GPU = Device("cuda:0", "Fake RTX", "cuda", 8 * GIB, GPU_RUNTIME_OVERHEAD + 4 * MIB)
FAKE_CPU = Device("cpu", "Fake CPU", "cpu", 64 * GIB, 32 * GIB)


@pytest.fixture
def fake_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> list[Device]:
    """NVML sees FAKE_GPU, the CPU has plenty of RAM, and llama.cpp says it can offload."""
    monkeypatch.setattr(devices, "nvml_devices", lambda: [FAKE_GPU])
    monkeypatch.setattr(devices, "cpu_device", lambda: FAKE_CPU)
    monkeypatch.setattr(build, "supports_gpu_offload", lambda: True)
    return [FAKE_GPU, FAKE_CPU]


@pytest.fixture
def loaded_gpu_layers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The n_gpu_layers of every load, as the loader receives them (the load still runs)."""
    received: list[int] = []
    real = loader.load_model

    def recording(settings: LoadSettings, params: Any, *rest: Any) -> Any:
        received.append(params.n_gpu_layers)
        return real(settings, params, *rest)

    monkeypatch.setattr(loader, "load_model", recording)
    return received


def _planned(model: Path, machine: list[Device]) -> int:
    """What the planner itself chooses for `model` at context 256 on `machine`."""
    info = read_model_info(model)
    chosen = plan_memory(info, LoadSettings(model_path=model, n_ctx=256), machine).gpu_layers
    assert 0 < chosen < info.n_layers_offloadable  # a partial offload: the fake GPU's point
    return chosen


def test_run_with_auto_gpu_layers_loads_the_planners_count(
        tiny_target: Path, fake_gpu_machine: list[Device], loaded_gpu_layers: list[int],
        capsys: pytest.CaptureFixture[str]) -> None:
    expected = _planned(tiny_target, fake_gpu_machine)

    code = main(["run", str(tiny_target), "-p", "hello", "--temp", "0", "--max-tokens", "2",
                 "--ctx", "256", "--threads", "1"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert loaded_gpu_layers == [expected]
    assert "stays on the CPU" not in err


def test_a_gpu_layer_count_given_wins_over_the_planner(
        tiny_target: Path, fake_gpu_machine: list[Device], loaded_gpu_layers: list[int]) -> None:
    assert main(["run", str(tiny_target), "-p", "hello", "--temp", "0", "--max-tokens", "1",
                 "--ctx", "256", "--threads", "1", "--gpu-layers", "2"]) == 0
    assert loaded_gpu_layers == [2]


def test_a_cpu_build_plans_no_gpu_layers_even_with_a_gpu_in_the_machine(
        tiny_target: Path, fake_gpu_machine: list[Device], monkeypatch: pytest.MonkeyPatch) -> None:
    settings = LoadSettings(model_path=tiny_target, n_ctx=256)
    assert auto_gpu_layers(settings) == Offload(_planned(tiny_target, fake_gpu_machine))
    monkeypatch.setattr(build, "supports_gpu_offload", lambda: False)
    assert auto_gpu_layers(settings) == 0


def test_a_file_the_planner_cannot_read_gets_no_count(tmp_path: Path,
                                                      fake_gpu_machine: list[Device]) -> None:
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model")
    assert auto_gpu_layers(LoadSettings(model_path=notes)) is None


def test_the_factory_wires_drafting_and_the_planner() -> None:
    engine = build_engine()
    assert isinstance(engine, Engine)
    assert isinstance(engine._speculation, Speculation)
    assert engine._plan_gpu_layers is auto_gpu_layers
    assert isinstance(engine._probe, LoadProbe)
    assert build_engine() is not engine  # a new engine each time: no shared state


class _Built(OutriderError):
    """Raised by the recording engine as soon as a command uses it: the test has its answer."""


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every engine `build_engine` makes, by its constructor arguments. The engine refuses
    to start or load, so each command stops (exit code 2) right after building it."""
    made: list[dict[str, Any]] = []

    class RecordingEngine:
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)

        def start(self) -> None:
            raise _Built("started")

        def load(self, settings: LoadSettings, on_progress: Any = None) -> None:
            raise _Built("loaded")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(build, "Engine", RecordingEngine)
    # `outrider serve` runs each model's engine in a child process (IsolatedEngine) that calls
    # the factory there; here it is called in this process, where the recording engine is.
    monkeypatch.setattr("runtime.server.serve.IsolatedEngine", lambda factory: factory())
    return made


@pytest.mark.parametrize("argv", [
    ["run", "{model}", "-p", "hi"],
    ["chat", "{model}"],
    ["serve", "--port", "0"],
    ["bench", "{model}", "--kv", "f16/f16"],
], ids=["run", "chat", "serve", "bench"])
def test_every_command_builds_its_engine_with_the_factory(
        argv: list[str], tiny_target: Path, built: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main([a.format(model=tiny_target) for a in argv])
    _, err = capsys.readouterr()
    assert code == 2 and "error: " in err and ("started" in err or "loaded" in err), err
    assert len(built) == 1
    assert isinstance(built[0]["speculation"], Speculation)
    assert built[0]["plan_gpu_layers"] is auto_gpu_layers
