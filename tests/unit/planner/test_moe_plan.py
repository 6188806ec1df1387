"""MoE experts in RAM in the plan: expert bytes move to the CPU for the first N blocks, and
"auto" picks N as llama.cpp's --fit does (fake GPUs)."""

from __future__ import annotations

import pytest

from runtime.errors import SettingsError
from runtime.llama.params import CPU_MOE_ALL, expert_override_patterns, to_llama_params
from runtime.planner.plan import DeviceUsage, MemoryPlan, plan_memory
from tests.unit.planner.test_planner import GIB, cpu, cuda, model, settings

BLOCK, EXPERTS = 360 * 10**6, 340 * 10**6  # per block; the experts are most of it
# A Qwen3-30B-A3B-like file at Q4_K_M: 48 blocks, 128 experts, 8 per token (~17 GiB).
QWEN3_30B_A3B = model(48, 2048, 32, 4, 128, n_ff=6144, n_vocab=151936, layer_bytes=BLOCK,
                      embd_bytes=300 * 10**6, architecture="qwen3moe", n_expert=128,
                      n_expert_used=8, n_ff_expert=768, n_ctx_train=40960,
                      expert_bytes_by_layer=(EXPERTS,) * 48)


def gpu(plan: MemoryPlan) -> DeviceUsage:
    return plan.devices[0]


def test_the_first_n_blocks_keep_their_experts_in_ram() -> None:
    devices = [cuda(0, 80), cpu(64)]
    none = plan_memory(QWEN3_30B_A3B, settings(gpu_layers=49), devices)
    some = plan_memory(QWEN3_30B_A3B, settings(gpu_layers=49, cpu_moe=10), devices)
    every = plan_memory(QWEN3_30B_A3B, settings(gpu_layers=49, cpu_moe="all"), devices)
    assert gpu(none).weights - gpu(some).weights == 10 * EXPERTS
    assert some.devices[-1].weights - none.devices[-1].weights == 10 * EXPERTS
    assert gpu(every).weights == gpu(none).weights - 48 * EXPERTS
    assert (some.cpu_moe_layers, every.cpu_moe_layers, none.cpu_moe_layers) == (10, 48, 0)
    assert gpu(some).kv == gpu(none).kv  # attention stays on the GPU: so does its cache
    assert "experts of 10 layers in RAM" in some.describe()


def test_auto_keeps_as_many_experts_on_the_gpu_as_fit() -> None:
    devices = [cuda(0, 12), cpu(64)]
    plan = plan_memory(QWEN3_30B_A3B, settings(n_ctx=8192, cpu_moe="auto"), devices)
    n = plan.cpu_moe_layers
    assert 0 < n < 48 and plan.verdict == "full_gpu" and gpu(plan).fits
    # One block fewer in RAM would not fit: n is the smallest count that does.
    tighter = plan_memory(QWEN3_30B_A3B, settings(n_ctx=8192, gpu_layers=49, cpu_moe=n - 1),
                          devices)
    assert tighter.verdict == "wont_fit"
    # A longer context leaves less room for experts on the GPU.
    longer = plan_memory(QWEN3_30B_A3B, settings(n_ctx=32768, cpu_moe="auto"), devices)
    assert longer.cpu_moe_layers > n


def test_auto_needs_no_experts_in_ram_when_everything_fits_or_there_is_no_gpu() -> None:
    assert plan_memory(QWEN3_30B_A3B, settings(cpu_moe="auto"),
                       [cuda(0, 80), cpu(64)]).cpu_moe_layers == 0
    cpu_only = plan_memory(QWEN3_30B_A3B, settings(cpu_moe="auto"), [cpu(64)])
    assert (cpu_only.cpu_moe_layers, cpu_only.verdict) == (0, "cpu_only")


def test_auto_cuts_gpu_layers_once_even_all_experts_in_ram_do_not_fit() -> None:
    plan = plan_memory(QWEN3_30B_A3B, settings(cpu_moe="auto"), [cuda(0, 1.2), cpu(64)])
    assert plan.cpu_moe_layers == 48
    assert plan.verdict == "partial" and 0 < plan.gpu_layers < 49 and gpu(plan).fits


def test_a_dense_model_ignores_the_setting() -> None:
    dense = model(8, 512, 8, 8, 64, n_ff=1024, n_vocab=1000, layer_bytes=10**6, embd_bytes=10**6)
    assert plan_memory(dense, settings(cpu_moe="all"), [cpu(64)]).cpu_moe_layers == 0


def test_more_layers_than_the_model_has_is_a_one_line_error() -> None:
    with pytest.raises(SettingsError, match=r"^MoE experts on CPU: 49 layers asked for, but the "
                                            r"model has 48$"):
        plan_memory(QWEN3_30B_A3B, settings(cpu_moe=49), [cpu(64)])


@pytest.mark.parametrize("bad", [-1, "some", True, 1.5])
def test_bad_values_are_refused(bad: object) -> None:
    with pytest.raises(SettingsError, match=r"^MoE experts on CPU must be all, auto or a layer"):
        settings(cpu_moe=bad)


def test_the_setting_becomes_llama_params() -> None:
    assert to_llama_params(settings(cpu_moe=3), cpu_count=2).n_cpu_moe == 3
    assert to_llama_params(settings(cpu_moe="all"), cpu_count=2).n_cpu_moe == CPU_MOE_ALL
    assert to_llama_params(settings(cpu_moe="auto"), 0, cpu_count=2).n_cpu_moe == 0
    unplanned = to_llama_params(settings(cpu_moe="auto"), 20, cpu_count=2)
    assert unplanned.n_cpu_moe == CPU_MOE_ALL
    assert any("all stay in RAM" in note for note in unplanned.notes)
    assert to_llama_params(settings(cpu_moe="auto"), cpu_count=2, plan_cpu_moe=7).n_cpu_moe == 7
    assert to_llama_params(settings(cpu_moe=2), cpu_count=2, plan_cpu_moe=7).n_cpu_moe == 2
    assert expert_override_patterns(0) == ()
    assert expert_override_patterns(1) == (r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",)


def test_the_free_memory_figure_is_what_auto_fits_against() -> None:
    small, large = cuda(0, 10), cuda(0, 14)
    n_small = plan_memory(QWEN3_30B_A3B, settings(cpu_moe="auto"), [small, cpu(64)])
    n_large = plan_memory(QWEN3_30B_A3B, settings(cpu_moe="auto"), [large, cpu(64)])
    freed = n_small.cpu_moe_layers - n_large.cpu_moe_layers
    assert freed == pytest.approx(4 * GIB / EXPERTS, abs=1)
