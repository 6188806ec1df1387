"""Reading llama.cpp's buffer-size log lines (formats from the vendored sources)."""

from __future__ import annotations

from runtime.llama.buffers import buffer_totals, device_of, parse_buffer_sizes

MIB = 1 << 20

CPU_LOG = """\
load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
llama_context:        CPU  output buffer size =     0.19 MiB
llama_kv_cache:        CPU KV buffer size =    90.00 MiB
llama_kv_cache: size =   90.00 MiB (  4096 cells,  30 layers,  1/1 seqs), K (f16):   45.00 MiB, V (f16):   45.00 MiB
sched_reserve:        CPU compute buffer size =    98.25 MiB
"""

# A partly offloaded sliding-window model: two KV caches (non-SWA and SWA) per device.
CUDA_SWA_LOG = """\
load_tensors: offloaded 20/27 layers to GPU
load_tensors:        CUDA0 model buffer size =  3992.51 MiB
load_tensors:   CPU_Mapped model buffer size =   281.81 MiB
llama_context:  CUDA_Host  output buffer size =     0.98 MiB
llama_kv_cache_iswa: creating non-SWA KV cache, size = 8192 cells
llama_kv_cache:      CUDA0 KV buffer size =   160.00 MiB
llama_kv_cache:        CPU KV buffer size =    56.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 1536 cells
llama_kv_cache:      CUDA0 KV buffer size =   150.00 MiB
llama_kv_cache:        CPU KV buffer size =    52.50 MiB
llama_memory_recurrent:        CPU RS buffer size =    16.00 MiB
sched_reserve:      CUDA0 compute buffer size =   517.12 MiB
sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB
"""


def test_cpu_load() -> None:
    sizes = parse_buffer_sizes(CPU_LOG)
    assert sizes == {"CPU_Mapped model": round(92.10 * MIB), "CPU output": round(0.19 * MIB),
                     "CPU KV": 90 * MIB, "CPU compute": round(98.25 * MIB)}
    assert buffer_totals(sizes) == {"weights": round(92.10 * MIB), "kv": 90 * MIB,
                                    "compute": round(98.25 * MIB) + round(0.19 * MIB)}


def test_offloaded_swa_model_adds_up_both_caches_per_device() -> None:
    sizes = parse_buffer_sizes(CUDA_SWA_LOG)
    assert sizes["CUDA0 KV"] == 310 * MIB
    assert sizes["CPU KV"] == round(108.5 * MIB)
    assert sizes["CPU RS"] == 16 * MIB
    assert sizes["CUDA_Host compute"] == round(24.01 * MIB)
    totals = buffer_totals(sizes)
    assert totals["weights"] == round(3992.51 * MIB) + round(281.81 * MIB)
    assert totals["kv"] == round(434.5 * MIB)


def test_nothing_to_read() -> None:
    assert parse_buffer_sizes("llama_model_load: error loading model\n") == {}
    assert buffer_totals({}) == {"weights": 0, "kv": 0, "compute": 0}


def test_device_of_buffer() -> None:
    assert [device_of(b) for b in ("CUDA0", "CUDA1", "MTL0", "CUDA_Host", "CPU_Mapped", "CPU")] == [
        "cuda:0", "cuda:1", "metal:0", "cpu", "cpu", "cpu"]
