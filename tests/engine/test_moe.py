"""MoE experts on the CPU, on the tiny `qwen3moe` fixture with this CPU build of llama.cpp.

The tensor buffer overrides reach llama.cpp (it logs "tensor blk.0.ffn_up_exps.weight …
buffer type overridden to CPU" for exactly the tensors asked for). On a CPU build they
change no buffer's name: an override to the CPU buffer type still takes the CPU's own list
(repacked where the type allows, mapped from the file otherwise; llama-model-loader.cpp),
so the weights stay in one "CPU_Mapped model" buffer, and the plan's CPU weights match it.
Generation is unchanged (the same kernels read the same bytes): token-identical at T = 0.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from runtime.engine import build, loader
from runtime.engine.engine import Engine
from runtime.errors import SettingsError
from runtime.events import Finished, GenerationRequest, SamplingParams, TokenEvent
from runtime.gguf.info import read_model_info
from runtime.gguf.preflight import check_gguf
from runtime.llama.binding import Batch, LlamaContext, LlamaModel
from runtime.llama.buffers import parse_buffer_sizes
from runtime.llama.params import LlamaParams, to_llama_params
from runtime.planner import devices
from runtime.planner.devices import Device
from runtime.planner.gpu_layers import Offload
from runtime.planner.plan import plan_memory
from runtime.settings.load import LoadSettings
from tests.engine.conftest import tiny_settings
from tests.fixtures.tiny_moe_gguf import MOE, write_tiny_moe_gguf

LOG_ROUNDING = 16 << 10  # buffer sizes are logged in MiB with two decimals
EXPERT_BYTES = 3 * MOE.n_expert * MOE.n_ff_expert * MOE.n_embd * 4  # gate, up, down at F32
_OVERRIDDEN = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")
CPU = Device("cpu", "test CPU", "cpu", 64 << 30, 32 << 30)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_moe_gguf(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


def expert_names(layers: range) -> set[str]:
    return {f"blk.{il}.ffn_{part}_exps.weight" for il in layers for part in ("gate", "up", "down")}


def greedy(model: LlamaModel, settings: LoadSettings, n: int = 12) -> list[int]:
    ctx = LlamaContext(model, to_llama_params(settings, 0))
    try:
        batch = Batch(64)
        prompt = model.tokenize("the cat sat on the mat", add_special=False)
        batch.add_tokens(prompt, pos0=0, seq_id=0, logits_last=True)
        out: list[int] = []
        for step in range(n):
            assert ctx.decode(batch) == 0
            token = int(ctx.logits(batch.n_outputs)[-1].argmax())
            out.append(token)
            batch.clear()
            batch.add(token, len(prompt) + step, 0, True)
        return out
    finally:
        ctx.close()


def test_the_reader_and_preflight_know_the_experts(tiny_moe: Path) -> None:
    check_gguf(tiny_moe)
    info = read_model_info(tiny_moe)
    assert (info.architecture, info.n_expert, info.n_expert_used) == ("qwen3moe", 8, 2)
    assert info.is_moe and info.n_expert_shared == 0
    assert info.expert_bytes_by_layer == (EXPERT_BYTES,) * MOE.n_layer
    # The router and attention stay with the block: its other tensors are not experts.
    assert all(t > e for t, e in zip(info.tensor_bytes_by_layer, info.expert_bytes_by_layer,
                                     strict=True))


@pytest.mark.parametrize(("cpu_moe", "layers"), [(0, range(0)), (2, range(2)),
                                                 ("all", range(MOE.n_layer))])
def test_overrides_reach_llama_cpp_and_the_plan_matches_its_buffers(
        tiny_moe: Path, cpu_moe: int | str, layers: range) -> None:
    settings = tiny_settings(tiny_moe, cpu_moe=cpu_moe)
    model = LlamaModel.load(tiny_moe, to_llama_params(settings, 0))
    try:
        overridden = dict(_OVERRIDDEN.findall(model.load_log))
        assert set(overridden) == expert_names(layers)
        assert set(overridden.values()) <= {"CPU"}
        buffers = parse_buffer_sizes(model.load_log)
        assert set(buffers) == {"CPU_Mapped model"}  # CPU build: one mapped buffer
        plan = plan_memory(read_model_info(tiny_moe), settings, [CPU])
        assert plan.cpu_moe_layers == len(layers)
        assert plan.devices[-1].weights == pytest.approx(buffers["CPU_Mapped model"],
                                                         abs=LOG_ROUNDING)
        assert greedy(model, settings) == greedy_reference(tiny_moe)
    finally:
        model.close()


_REFERENCE: dict[Path, list[int]] = {}


def greedy_reference(path: Path) -> list[int]:
    """Greedy tokens with every expert in its block (the default), computed once."""
    if path not in _REFERENCE:
        settings = tiny_settings(path)
        model = LlamaModel.load(path, to_llama_params(settings, 0))
        try:
            _REFERENCE[path] = greedy(model, settings)
        finally:
            model.close()
    return _REFERENCE[path]


def test_more_layers_than_the_model_has_is_a_one_line_error(tiny_moe: Path) -> None:
    settings = tiny_settings(tiny_moe, cpu_moe=MOE.n_layer + 1)
    with pytest.raises(SettingsError, match=r"^MoE experts on CPU: 5 layers asked for, but "
                                            r"tiny-moe.gguf has 4$"):
        LlamaModel.load(tiny_moe, to_llama_params(settings, 0))
    with pytest.raises(SettingsError, match="5 layers asked for, but the model has 4"):
        plan_memory(read_model_info(tiny_moe), settings, [CPU])


def test_the_engine_loads_and_generates_the_same_with_experts_in_ram(tiny_moe: Path,
                                                                     engine: Engine) -> None:
    replies = []
    for cpu_moe in (0, 2, "all"):
        loaded = engine.load(tiny_settings(tiny_moe, cpu_moe=cpu_moe))
        assert (loaded.architecture, loaded.settings.cpu_moe) == ("qwen3moe", cpu_moe)
        handle = engine.submit(GenerationRequest(
            prompt="the cat sat on the mat", sampling=SamplingParams(temperature=0.0,
                                                                     max_tokens=16)))
        events = list(handle.events(timeout=60))
        assert any(isinstance(e, Finished) for e in events)
        replies.append([e.token_id for e in events if isinstance(e, TokenEvent)])
    assert len(replies[0]) == 16
    assert replies[1] == replies[0] and replies[2] == replies[0]


# ---- "auto": the planner's count reaches llama.cpp (a fake GPU; this CPU build still loads) ----


def fake_gpu(monkeypatch: pytest.MonkeyPatch, free_bytes: int) -> None:
    """NVML sees one GPU with `free_bytes` free, and llama.cpp says it can offload."""
    gpu = Device("cuda:0", "Fake RTX", "cuda", 8 << 30, free_bytes)
    monkeypatch.setattr(devices, "nvml_devices", lambda: [gpu])
    monkeypatch.setattr(devices, "cpu_device", lambda: CPU)
    monkeypatch.setattr(build, "supports_gpu_offload", lambda: True)


def test_auto_loads_with_the_planners_expert_count(tiny_moe: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    info = read_model_info(tiny_moe)
    settings = tiny_settings(tiny_moe, n_ctx=256, cpu_moe="auto")
    # A GPU with room for every layer and the experts of all blocks but the first two.
    roomy = [Device("cuda:0", "big", "cuda", 64 << 30, 64 << 30), CPU]
    need = plan_memory(info, dataclasses.replace(settings, cpu_moe=2), roomy).devices[0].total
    fake_gpu(monkeypatch, need)
    received: list[LlamaParams] = []
    real = loader.load_model

    def recording(load: LoadSettings, params: LlamaParams, *rest: Any) -> Any:
        received.append(params)
        return real(load, params, *rest)

    monkeypatch.setattr(loader, "load_model", recording)
    engine = Engine(plan_gpu_layers=build.auto_gpu_layers)
    engine.start()
    try:
        loaded = engine.load(settings)
        handle = engine.submit(GenerationRequest(prompt="the cat", sampling=SamplingParams(
            temperature=0.0, max_tokens=4)))
        assert any(isinstance(e, Finished) for e in handle.events(timeout=60))
    finally:
        engine.stop()
    (params,) = received
    assert (params.n_cpu_moe, params.n_gpu_layers) == (2, info.n_layers_offloadable)
    assert "MoE experts on CPU (auto): the first 2 layers keep their experts in RAM" in loaded.notes
    # One GPU byte less than that and a third block's experts go to RAM.
    fake_gpu(monkeypatch, need - 1)
    offload = build.auto_gpu_layers(settings)
    assert isinstance(offload, Offload) and offload.cpu_moe == 3


def test_auto_on_a_dense_model_or_a_cpu_build_plans_no_experts(
        tiny_moe: Path, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, 8 << 30)
    dense = build.auto_gpu_layers(tiny_settings(tiny_target, cpu_moe="auto"))
    assert isinstance(dense, Offload) and dense.cpu_moe is None
    roomy = build.auto_gpu_layers(tiny_settings(tiny_moe, cpu_moe="auto"))
    assert roomy == Offload(gpu_layers=MOE.n_layer + 1, cpu_moe=0)
    # A layer count the user gave stays; the experts are still planned around it.
    given = build.auto_gpu_layers(tiny_settings(tiny_moe, cpu_moe="auto", gpu_layers=2))
    assert given == Offload(gpu_layers=2, cpu_moe=0)
    assert build.auto_gpu_layers(tiny_settings(tiny_moe, cpu_moe=1, gpu_layers=2)) == 2
    monkeypatch.setattr(build, "supports_gpu_offload", lambda: False)
    assert build.auto_gpu_layers(tiny_settings(tiny_moe, cpu_moe="auto")) == 0
