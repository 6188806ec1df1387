"""The memory planner: published KV figures, layer placement as llama.cpp does it, verdicts
against free memory, the largest context that fits, and the draft model's share.

Big models are described by hand (their GGUFs are tens of gigabytes); SmolLM2 and the tiny
fixtures are read from real files.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from runtime.errors import SettingsError
from runtime.gguf.info import ModelInfo, read_model_info
from runtime.planner.devices import Device
from runtime.planner.plan import (
    GPU_RUNTIME_OVERHEAD,
    compute_bytes,
    host_overhead,
    kv_bytes_per_token,
    kv_layer_bytes_per_token,
    max_context,
    plan_memory,
)
from runtime.settings.load import LoadSettings

MIB, GIB = 1 << 20, 1 << 30
PATH = Path("model.gguf")


def model(n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, *,
          n_ff: int, n_vocab: int, layer_bytes: int, embd_bytes: int, n_ctx_train: int = 4096,
          **extra: object) -> ModelInfo:
    """A ModelInfo as read_model_info would build it for a llama-style file."""
    fields: dict[str, object] = dict(
        path_or_url="hand-made.gguf", architecture="llama", name="hand-made",
        n_params=n_layer * layer_bytes * 2, block_count=n_layer, n_embd=n_embd, n_ff=n_ff,
        n_head=n_head, n_head_kv=(n_head_kv,) * n_layer, key_length=head_dim,
        value_length=head_dim, kv_lora_rank=None, rope_dims=head_dim, key_length_mla=None,
        sliding_window=None, swa_layers=(False,) * n_layer, n_expert=0, n_expert_used=0,
        n_ff_expert=0, n_ctx_train=n_ctx_train, n_vocab=n_vocab, tokenizer_model="llama",
        tokenizer_pre="default", bos_id=1, eos_id=2, add_bos=True, add_eos=False,
        chat_template=None, file_type=15, quant="Q4_K_M",
        tensor_bytes=n_layer * layer_bytes + 2 * embd_bytes,
        tensor_bytes_by_layer=(layer_bytes,) * n_layer, input_bytes=embd_bytes,
        output_bytes=embd_bytes, tied_embeddings=False, bytes_by_type=(("Q4_K", 1),),
        split_index=0, split_count=1, split_paths=("hand-made.gguf",), file_size=0,
        header_bytes=0, n_tokens=n_vocab, vocab_fingerprint="")
    fields.update(extra)
    return ModelInfo(**fields)  # type: ignore[arg-type]


# Llama-2-70B Q4_K_M: about 41 GB of weights.
LLAMA2_70B = model(80, 8192, 64, 8, 128, n_ff=28672, n_vocab=32000, layer_bytes=500 * 10**6,
                   embd_bytes=140 * 10**6)
# DeepSeek-V3 as llama.cpp's converter writes it today (MLA: one 576-wide latent KV "head").
DEEPSEEK_V3 = model(61, 7168, 128, 1, 576, n_ff=18432, n_vocab=129280, layer_bytes=6 * 10**9,
                    embd_bytes=900 * 10**6, architecture="deepseek2", value_length=512,
                    kv_lora_rank=512, rope_dims=64, key_length_mla=192, n_expert=256,
                    n_expert_used=8, n_ff_expert=2048, n_ctx_train=163840)
SMOLLM2_SHAPE = model(30, 576, 9, 3, 64, n_ff=1536, n_vocab=49152, layer_bytes=2216448,
                      embd_bytes=30081024, n_ctx_train=8192)


def cpu(free_gib: float, total_gib: float = 64) -> Device:
    return Device("cpu", "test CPU", "cpu", int(total_gib * GIB), int(free_gib * GIB))


def cuda(i: int, free_gib: float, total_gib: float = 80) -> Device:
    return Device(f"cuda:{i}", f"GPU {i}", "cuda", int(total_gib * GIB), int(free_gib * GIB))


def settings(**kw: object) -> LoadSettings:
    return LoadSettings(model_path=PATH, **kw)  # type: ignore[arg-type]


# --- KV bytes per token ------------------------------------------------------------------


def test_llama2_70b_kv_per_token_counts_k_and_v() -> None:
    per_token = kv_bytes_per_token(LLAMA2_70B, "f16", "f16")
    assert per_token == 327_680  # 163,840 would be K alone
    assert per_token * 8192 == int(2.5 * GIB)


def test_deepseek_v3_mla_cache_is_576_values_per_layer() -> None:
    per_layer = kv_layer_bytes_per_token(DEEPSEEK_V3, "f16", "f16")
    assert set(per_layer) == {576 * 2}
    assert kv_bytes_per_token(DEEPSEEK_V3) == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token(DEEPSEEK_V3, "q8_0", "q8_0") == 61 * 576 * 34 // 32


def test_a_pre_mla_deepseek_file_needs_the_full_cache() -> None:
    old = replace(DEEPSEEK_V3, key_length_mla=None, n_head_kv=(128,) * 61, key_length=192,
                  value_length=128)
    assert kv_bytes_per_token(old) == 61 * 128 * (192 + 128) * 2
    plan = plan_memory(old, settings(n_ctx=4096), [cpu(4000, 4000)])
    assert any("predates llama.cpp's MLA cache" in n for n in plan.notes)


def test_smollm2_shape_kv_per_token_and_quantized_types() -> None:
    assert kv_bytes_per_token(SMOLLM2_SHAPE) == 23_040
    assert kv_bytes_per_token(SMOLLM2_SHAPE, "q8_0", "q8_0") == 23_040 * 34 // 32 // 2 == 12_240
    assert kv_bytes_per_token(SMOLLM2_SHAPE, "q4_0", "q4_0") == 23_040 * 18 // 32 // 2 == 6_480
    assert kv_bytes_per_token(SMOLLM2_SHAPE, "q8_0", "f16") == 30 * 3 * (64 * 34 // 32 + 64 * 2)


@pytest.mark.e2e
def test_smollm2_file_kv_per_token(default_model: Path) -> None:
    info = read_model_info(default_model)
    assert kv_bytes_per_token(info) == 23_040
    # What llama.cpp logged for these settings (docs/benchmarks.md, calibration table):
    plan = plan_memory(info, settings(n_ctx=4096, flash_attn="on"), [cpu(64)])
    assert (plan.weights, plan.kv) == (96_576_768, 90 * MIB)
    assert plan.compute == pytest.approx((98.25 + 0.1875) * MIB, abs=8 << 10)


def test_tiny_target_kv_per_token(tiny_target: Path) -> None:
    assert kv_bytes_per_token(read_model_info(tiny_target)) == 4 * 2 * (32 * 2 + 32 * 2)


def test_sliding_window_layers_cap_at_their_window_by_default() -> None:
    gemma = replace(SMOLLM2_SHAPE, n_head_kv=(3,) * 6, block_count=6,
                    tensor_bytes_by_layer=(1,) * 6, sliding_window=1024,
                    swa_layers=(True,) * 5 + (False,))
    full = plan_memory(gemma, settings(n_ctx=32768), [cpu(64)], swa_full=True)
    capped = plan_memory(gemma, settings(n_ctx=32768), [cpu(64)])  # as the engine loads it
    per_layer = 768
    assert full.kv == 6 * per_layer * 32768  # llama_context_default_params' full SWA cache
    # window 1024 + ubatch 512, padded to 256: 1536 cells on the five SWA layers.
    assert capped.kv == per_layer * (5 * 1536 + 32768)


# --- compute buffer: pinned to what llama.cpp reported (docs/benchmarks.md) ---------------


@pytest.mark.parametrize(("n_kv", "flash", "ubatch", "reported_mib"), [
    (4096, True, 512, 98.25), (16384, True, 512, 98.25), (4096, True, 128, 24.56),
    (8192, False, 512, 166.38), (16384, False, 512, 326.38), (4096, False, 512, 99.38),
])
def test_compute_estimate_matches_llama_cpp_for_smollm2(
        n_kv: int, flash: bool, ubatch: int, reported_mib: float) -> None:
    logits = 4 * 49152  # the output buffer llama.cpp logs separately (0.19 MiB)
    estimate = compute_bytes(SMOLLM2_SHAPE, n_kv, ubatch, flash) - logits
    assert estimate == pytest.approx(reported_mib * MIB, rel=0.015)


# --- placement and verdicts --------------------------------------------------------------


def test_cpu_only_machine() -> None:
    plan = plan_memory(SMOLLM2_SHAPE, settings(n_ctx=4096), [cpu(8)])
    assert (plan.verdict, plan.gpu_layers, plan.n_layers, plan.recommended_gpu_layers) == (
        "cpu_only", 0, 31, 0)
    assert plan.devices[-1].id == "cpu"
    assert plan.weights == SMOLLM2_SHAPE.tensor_bytes
    assert plan.kv == 23_040 * 4096
    assert plan.max_context == 8192  # up to the training context
    assert plan.describe().startswith("CPU only: ")


def test_wont_fit_in_ram_says_where_and_how_much_context_would() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [cpu(32)])
    assert plan.verdict == "wont_fit" and plan.max_context == 0
    assert "needs more memory than is free on cpu" in plan.notes[0]
    # 37.5 GiB of weights + 1.25 GiB of KV at 4K + compute: more than 38.5 GiB
    roomy = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [cpu(38.5)])
    assert roomy.verdict == "wont_fit"
    assert 1024 < roomy.max_context < 4096


def test_full_gpu() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [cuda(0, 79), cpu(16)])
    assert (plan.verdict, plan.gpu_layers, plan.recommended_gpu_layers) == ("full_gpu", 81, 81)
    gpu, host = plan.devices
    assert gpu.weights == 80 * 500 * 10**6 + 140 * 10**6  # all blocks + output head
    assert host.weights == 140 * 10**6  # token embeddings stay in RAM
    assert gpu.kv == 327_680 * 4096 and host.kv == 0
    assert gpu.overhead == GPU_RUNTIME_OVERHEAD
    assert plan.describe().startswith("Full GPU")


def test_partial_offload_counts_layers_from_the_top() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [cuda(0, 24, 24), cpu(60)])
    assert plan.verdict == "partial"
    n = plan.gpu_layers
    assert 30 < n < 50 and n == plan.recommended_gpu_layers
    gpu, host = plan.devices
    # n "layers" = the output layer and the last n - 1 blocks.
    assert gpu.weights == (n - 1) * 500 * 10**6 + 140 * 10**6
    assert gpu.kv == (n - 1) * 4096 * 327_680 // 80
    assert gpu.fits and host.fits
    one_more = plan_memory(LLAMA2_70B, settings(n_ctx=4096, gpu_layers=n + 1),
                           [cuda(0, 24, 24), cpu(60)])
    assert one_more.verdict == "wont_fit" and one_more.recommended_gpu_layers == n
    assert f"({n} of 81 layers on GPU)" in plan.describe()


def test_one_gpu_layer_is_the_output_head_as_in_llama_cpp() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096, gpu_layers=1), [cuda(0, 79), cpu(60)])
    gpu, host = plan.devices
    assert gpu.weights == 140 * 10**6 and gpu.kv == 0
    assert host.weights == 80 * 500 * 10**6 + 140 * 10**6


def test_tied_embeddings_are_copied_to_the_gpu_with_the_head() -> None:
    tied = replace(SMOLLM2_SHAPE, tied_embeddings=True, output_bytes=2304)
    plan = plan_memory(tied, settings(gpu_layers=999), [cuda(0, 8), cpu(8)])
    assert plan.gpu_layers == 31 and plan.verdict == "full_gpu"
    assert plan.devices[0].weights == 30 * 2216448 + 2304 + 30081024
    assert plan.devices[1].weights == 30081024


def test_layers_split_between_gpus_by_free_memory() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [cuda(0, 60), cuda(1, 20), cpu(16)])
    assert plan.verdict == "full_gpu"
    big, small, _ = plan.devices
    # 81 layers split 3:1 as llama.cpp does (layer i goes to the first GPU while i/81 < 0.75):
    # blocks 0..60 on the first; 61..79 and the head on the second.
    assert big.weights == 61 * 500 * 10**6
    assert small.weights == 19 * 500 * 10**6 + 140 * 10**6


def test_no_gpu_but_gpu_layers_requested() -> None:
    plan = plan_memory(SMOLLM2_SHAPE, settings(gpu_layers=10), [cpu(8)])
    assert plan.verdict == "cpu_only" and plan.gpu_layers == 0
    assert "no GPU" in plan.notes[0]


def test_apple_unified_memory_counts_gpu_and_cpu_against_one_ram() -> None:
    metal = Device("metal:0", "Apple M2", "metal", 16 * GIB, 11 * GIB, unified=True)
    host = cpu(12, 16)
    small = plan_memory(SMOLLM2_SHAPE, settings(), [metal, host])
    assert small.verdict == "full_gpu" and small.devices[0].overhead == 0
    mid = model(32, 4096, 32, 8, 128, n_ff=14336, n_vocab=128256, layer_bytes=300 * 10**6,
                embd_bytes=500 * 10**6, n_ctx_train=8192)
    plan = plan_memory(mid, settings(n_ctx=8192), [metal, host])
    gpu_part, cpu_part = plan.devices
    assert gpu_part.fits and cpu_part.fits
    assert gpu_part.total + cpu_part.total <= host.free_bytes


def test_max_context_is_the_edge_of_fitting() -> None:
    devices = [cpu(2)]
    edge = max_context(SMOLLM2_SHAPE, settings(n_ctx=512), devices)
    assert edge % 256 == 0 and edge > 256
    big = replace(SMOLLM2_SHAPE, n_ctx_train=1 << 20)
    edge = max_context(big, settings(n_ctx=512), devices)
    assert plan_memory(big, settings(n_ctx=edge), devices).verdict == "cpu_only"
    assert plan_memory(big, settings(n_ctx=edge + 256), devices).verdict == "wont_fit"


def test_quantized_kv_fits_longer_contexts() -> None:
    devices = [cuda(0, 24, 24), cpu(60)]
    f16 = plan_memory(LLAMA2_70B, settings(n_ctx=4096), devices)
    q4 = plan_memory(LLAMA2_70B, settings(n_ctx=4096, type_k="q4_0", type_v="q4_0"), devices)
    assert q4.kv_bytes_per_token == 327_680 * 18 // 64
    assert q4.gpu_layers >= f16.gpu_layers and q4.flash_attn


def test_draft_model_memory_is_included(tiny_target: Path, tiny_draft: Path) -> None:
    target, draft = read_model_info(tiny_target), read_model_info(tiny_draft)
    alone = plan_memory(target, settings(n_ctx=2048), [cpu(8)])
    both = plan_memory(target, settings(n_ctx=2048), [cpu(8)], draft=draft)
    extra = both.devices[-1].draft
    assert extra == (draft.tensor_bytes + kv_bytes_per_token(draft) * 2048
                     + compute_bytes(draft, 2048, 512, True) + host_overhead(draft))
    assert both.total - alone.total == extra


def test_draft_rides_on_the_gpu_with_a_fully_offloaded_target() -> None:
    draft = model(2, 256, 4, 2, 64, n_ff=512, n_vocab=32000, layer_bytes=10**6, embd_bytes=10**6)
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [cuda(0, 79), cpu(16)], draft=draft)
    assert plan.verdict == "full_gpu" and plan.devices[0].draft > draft.tensor_bytes


def test_plan_is_json(tiny_target: Path) -> None:
    plan = plan_memory(read_model_info(tiny_target), settings(), [cuda(0, 8), cpu(8)])
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["verdict"] == "full_gpu" and data["gpu_layers"] == 5
    assert {d["id"] for d in data["devices"]} == {"cuda:0", "cpu"}
    assert data["total"] == sum(d["total"] for d in data["devices"])
    assert data["summary"].startswith("Full GPU")


@pytest.mark.parametrize(("kw", "message"), [
    ({"n_ctx": 0}, "at least 16"), ({"gpu_layers": -1}, "0 or more"),
    ({"type_k": "q3_k"}, "K cache type 'q3_k'"), ({"type_v": "f8"}, "V cache type"),
])
def test_impossible_settings_are_refused_before_planning(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        settings(**kw)


def test_a_plan_needs_the_cpu() -> None:
    with pytest.raises(SettingsError, match="needs the CPU"):
        plan_memory(SMOLLM2_SHAPE, settings(), [cuda(0, 8)])
