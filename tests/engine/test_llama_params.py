"""LoadSettings → llama.cpp parameters (runtime.llama.params), asserted value by value."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from runtime.gguf.constants import GGML_TYPE_IDS, type_id
from runtime.llama.params import (
    FLASH_ATTN_AUTO,
    FLASH_ATTN_OFF,
    FLASH_ATTN_ON,
    LOAD_MODE_MMAP,
    LOAD_MODE_NONE,
    default_threads,
    repack_is_safe,
    to_llama_params,
)
from runtime.settings.load import KV_CACHE_TYPES, LoadSettings

MODEL = Path("m.gguf")


@pytest.fixture(autouse=True)
def repack_safe_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The notes below are those of a CPU whose repacked kernels are sound; an AMX machine
    adds its own (tested at the end)."""
    monkeypatch.setattr("runtime.llama.params.repack_is_safe", lambda: True)


def test_defaults() -> None:
    p = to_llama_params(LoadSettings(model_path=MODEL), cpu_count=8)
    assert (p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max) == (4096, 512, 512, 1)
    assert (p.n_threads, p.n_threads_batch) == (8, 8)
    assert (p.type_k, p.type_v) == (1, 1)
    assert p.flash_attn == FLASH_ATTN_AUTO
    assert p.kv_unified is True
    assert p.load_mode == LOAD_MODE_MMAP
    assert p.n_gpu_layers == 0
    assert p.notes == ("GPU layers: auto without a memory plan, so the model stays on the CPU",)


def test_every_offered_kv_type_has_a_ggml_id_and_its_size() -> None:
    assert {name.upper() for name in KV_CACHE_TYPES} <= set(GGML_TYPE_IDS)
    assert KV_CACHE_TYPES["q8_0"] == 34 / 32 and KV_CACHE_TYPES["f32"] == 4.0


@pytest.mark.parametrize(("type_v", "flash", "expected_note"), [
    ("q8_0", "auto", "flash attention on: the quantized V cache (q8_0) needs it"),
    ("q4_0", "off", "flash attention on although it was set off: the quantized V cache (q4_0) needs it"),
])
def test_quantized_v_switches_flash_attention_on_and_says_so(type_v: str, flash: str,
                                                             expected_note: str) -> None:
    s = LoadSettings(model_path=MODEL, type_v=type_v, flash_attn=flash, gpu_layers=0)  # type: ignore[arg-type]
    p = to_llama_params(s)
    assert p.flash_attn == FLASH_ATTN_ON
    assert p.type_v == type_id(type_v)
    assert p.notes == (expected_note,)


def test_quantized_k_alone_leaves_flash_attention_to_the_user() -> None:
    p = to_llama_params(LoadSettings(model_path=MODEL, type_k="q8_0", flash_attn="off", gpu_layers=0))
    assert (p.type_k, p.type_v, p.flash_attn, p.notes) == (8, 1, FLASH_ATTN_OFF, ())


def test_gpu_layers_user_beats_plan_beats_cpu() -> None:
    assert to_llama_params(LoadSettings(model_path=MODEL, gpu_layers=12), 30).n_gpu_layers == 12
    planned = to_llama_params(LoadSettings(model_path=MODEL), 30)
    assert planned.n_gpu_layers == 30 and planned.notes == ()


def test_batches_never_exceed_the_context() -> None:
    p = to_llama_params(LoadSettings(model_path=MODEL, n_ctx=256, n_batch=2048, n_ubatch=1024))
    assert (p.n_batch, p.n_ubatch) == (256, 256)


def test_threads_parallel_and_mmap() -> None:
    s = LoadSettings(model_path=MODEL, n_threads=3, n_threads_batch=5, n_parallel=8, use_mmap=False)
    p = to_llama_params(s)
    assert (p.n_threads, p.n_threads_batch, p.n_seq_max, p.load_mode) == (3, 5, 8, LOAD_MODE_NONE)
    assert to_llama_params(LoadSettings(model_path=MODEL, n_threads=3)).n_threads_batch == 3


def fake_cpus(monkeypatch: pytest.MonkeyPatch, cores: int | None, threads: int | None) -> None:
    """A machine with `cores` physical cores and `threads` logical ones (None: unknown)."""
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: threads if logical else cores)
    monkeypatch.setattr(os, "cpu_count", lambda: threads)


def test_default_threads_are_one_per_physical_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 cores with hyperthreading (16 logical): 8 threads, as llama.cpp itself picks."""
    fake_cpus(monkeypatch, cores=8, threads=16)
    assert default_threads() == 8
    p = to_llama_params(LoadSettings(model_path=MODEL))
    assert (p.n_threads, p.n_threads_batch) == (8, 8)


@pytest.mark.parametrize(("cores", "threads", "expected"), [
    (None, 6, 6),     # no physical count (some containers): the logical one
    (None, None, 1),  # nothing known: one thread
])
def test_default_threads_fall_back(monkeypatch: pytest.MonkeyPatch, cores: int | None,
                                   threads: int | None, expected: int) -> None:
    fake_cpus(monkeypatch, cores, threads)
    assert default_threads() == expected


def test_default_threads_override_and_floor() -> None:
    assert default_threads(cpu_count=3) == 3
    assert default_threads(cpu_count=0) == 1


def test_weights_are_not_repacked_where_the_amx_kernels_crash() -> None:
    """llama.cpp#20824: the AMX buffer's mat-mul segfaults on the first real prompt."""
    crashing = to_llama_params(LoadSettings(model_path=MODEL), cpu_count=2, repack=False)
    assert crashing.repack is False
    assert "weight repacking off: llama.cpp's AMX kernels crash on this CPU" in crashing.notes[0]
    sound = to_llama_params(LoadSettings(model_path=MODEL), cpu_count=2, repack=True)
    assert sound.repack is True and not any("repack" in note for note in sound.notes)


@pytest.mark.parametrize(("flags", "safe"), [
    ("fpu avx2 avx512f avx512_vnni", True),
    ("fpu avx2 avx512f amx_bf16 amx_tile amx_int8", False),
    ("fpu avx2 amx_tile", True),  # AMX-INT8 is what llama.cpp's AMX buffer needs
])
def test_an_amx_int8_cpu_is_told_from_cpuinfo(tmp_path: Path, flags: str, safe: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert repack_is_safe(cpuinfo) is safe
    assert repack_is_safe(tmp_path / "absent") is True  # not Linux: llama.cpp's default
