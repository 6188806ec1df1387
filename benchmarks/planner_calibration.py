"""Planned memory vs what llama.cpp allocates, and vs the process's RSS growth.

    python -m benchmarks.planner_calibration MODEL.gguf [CASE ...] [--decode] [--json]
                                             [--gpu-layers N]

A CASE is `n_ctx,type_k,type_v,flash` (flash: on/off), e.g. `8192,q8_0,q8_0,on`; without
cases a default grid runs. For each case the model is loaded once (mmap, CPU) in this
process through llama-cpp-python's low-level API, a context is created, and the buffer sizes
llama.cpp logs (`runtime.llama.buffers.parse_buffer_sizes`) are compared with
`runtime.planner.plan.plan_memory`. RSS is measured before the model load, after it, and after
the context (and, with --decode, after one full ubatch, which touches the compute buffer).

With `--gpu-layers N` (a GPU build) the model is loaded with N layers offloaded (999: all)
and a second table compares the plan for GPU 0 with the CUDA buffers llama.cpp reports and
with the growth of the memory in use on GPU 0 as NVML reports it (the whole device's figure:
run it where nothing else uses the GPU). Growth minus the reported buffers is the CUDA
runtime's own share (context, cuBLAS workspace, memory pools), which the planner estimates
as `GPU_RUNTIME_OVERHEAD` per device.

Run it in a fresh process: RSS growth is only meaningful for the first load of a file, and
llama.cpp's log callback is process-global.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from runtime.gguf.info import read_model_info
from runtime.llama.buffers import buffer_totals, device_of, parse_buffer_sizes
from runtime.llama.params import repack_is_safe
from runtime.planner.devices import Device
from runtime.planner.plan import DeviceUsage, plan_memory
from runtime.settings.load import LoadSettings

DEFAULT_CASES = ("512,f16,f16,on", "2048,f16,f16,off", "4096,q8_0,q8_0,on",
                 "8192,q4_0,q4_0,on", "8192,f16,f16,off")
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
             "iq4_nl": 20, "bf16": 30}
MIB = 1 << 20
# A CPU with room for anything: calibration compares sizes, not fit.
BIG_CPU = Device("cpu", "cpu", "cpu", 1 << 50, 1 << 50)
BIG_GPU = Device("cuda:0", "gpu", "cuda", 1 << 50, 1 << 50)


@dataclass(frozen=True)
class Case:
    n_ctx: int
    type_k: str
    type_v: str
    flash: bool

    @classmethod
    def parse(cls, text: str) -> Case:
        n_ctx, type_k, type_v, flash = text.split(",")
        return cls(int(n_ctx), type_k, type_v, flash == "on")


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def gpu_used() -> int | None:
    """Bytes in use on GPU 0 as NVML reports them; None without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def growth(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def parts(usage: DeviceUsage) -> dict[str, int]:
    return {"weights": usage.weights, "kv": usage.kv, "compute": usage.compute}


def measure(model: Path, cases: list[Case], decode: bool = False,
            gpu_layers: int = 0) -> list[dict[str, Any]]:
    """One row per case: planned and reported weights/kv/compute, RSS growth (bytes); with
    `gpu_layers`, also GPU 0's planned and reported parts and its memory growth."""
    gpu_start = gpu_used() if gpu_layers else None  # before CUDA is touched in this process
    import llama_cpp as L

    log: list[str] = []

    @L.llama_log_callback
    def on_log(level: int, text: bytes | None, user: ctypes.c_void_p) -> None:
        log.append((text or b"").decode(errors="replace"))

    L.llama_log_set(on_log, ctypes.c_void_p(0))
    L.llama_backend_init()
    info = read_model_info(model)
    rss_start = rss()
    params = L.llama_model_default_params()
    params.n_gpu_layers = gpu_layers
    params.use_extra_bufts = repack_is_safe()  # as the engine loads (no AMX repacking)
    handle = L.llama_model_load_from_file(str(model).encode(), params)
    if not handle:
        raise SystemExit(f"llama.cpp could not load {model}")
    model_log = "".join(log)
    rss_model = rss()
    gpu_model = gpu_used() if gpu_layers else None
    rows = []
    for case in cases:
        log.clear()
        rss_before = rss()
        gpu_before = gpu_used() if gpu_layers else None
        cparams = L.llama_context_default_params()
        cparams.n_ctx = case.n_ctx
        cparams.n_batch = cparams.n_ubatch = 512
        cparams.n_seq_max = 1
        cparams.kv_unified = True
        cparams.type_k, cparams.type_v = GGML_TYPE[case.type_k], GGML_TYPE[case.type_v]
        cparams.flash_attn_type = 1 if case.flash else 0
        ctx = L.llama_init_from_model(handle, cparams)
        if not ctx:
            raise SystemExit(f"llama.cpp refused a context for {case}: {''.join(log)[-300:]}")
        rss_ctx = rss()
        gpu_ctx = gpu_used() if gpu_layers else None
        rss_decoded = gpu_decoded = None
        if decode:
            n = min(512, case.n_ctx)
            tokens = (L.llama_token * n)(*[i % 200 + 3 for i in range(n)])  # kept alive
            if L.llama_decode(ctx, L.llama_batch_get_one(tokens, n)) != 0:
                raise SystemExit(f"llama_decode failed for {case}")
            rss_decoded = rss()
            gpu_decoded = gpu_used() if gpu_layers else None
        sizes = parse_buffer_sizes(model_log + "".join(log))
        reported = buffer_totals(sizes)
        settings = LoadSettings(model_path=model, n_ctx=case.n_ctx, type_k=case.type_k,
                                type_v=case.type_v, flash_attn="on" if case.flash else "off",
                                gpu_layers=gpu_layers)
        plan = plan_memory(info, settings, [BIG_GPU, BIG_CPU] if gpu_layers else [BIG_CPU])
        gpu_row: dict[str, Any] = {}
        if gpu_layers:
            on_gpu = {k: v for k, v in sizes.items()
                      if device_of(k.rsplit(" ", 1)[0]).startswith("cuda")}
            gpu_plan, host_plan = plan.devices[0], plan.devices[-1]
            gpu_row = {
                "gpu_layers": plan.gpu_layers,
                "planned_host": parts(host_plan),
                "planned_gpu": parts(gpu_plan),
                "planned_gpu_overhead": gpu_plan.overhead,
                "reported_gpu": buffer_totals(on_gpu),
                # NVML growth: the model load (with the CUDA context) only in the first case.
                "gpu_growth_model": growth(gpu_model, gpu_start),
                "gpu_growth_context": growth(gpu_ctx, gpu_before),
                "gpu_growth_decode": growth(gpu_decoded, gpu_before),
            }
        rows.append({
            "model": model.name, "n_ctx": case.n_ctx, "type_k": case.type_k,
            "type_v": case.type_v, "flash_attn": case.flash,
            "planned": {"weights": plan.weights, "kv": plan.kv, "compute": plan.compute},
            # RAM outside the buffers (with a GPU, its runtime's share is in gpu_row).
            "planned_overhead": plan.devices[-1].overhead,
            "reported": reported,
            # RSS growth: the model load itself (first case only) plus this context.
            "rss_growth_model": rss_model - rss_start,
            "rss_growth_context": rss_ctx - rss_before,
            "rss_growth_decode": None if rss_decoded is None else rss_decoded - rss_before,
            **gpu_row,
        })
        L.llama_free(ctx)
    L.llama_model_free(handle)
    L.llama_log_set(L.llama_log_callback(), ctypes.c_void_p(0))  # NULL: stderr; on_log dies here
    return rows


def wkc(parts: dict[str, int]) -> str:
    """'weights / kv / compute' in MiB, as both tables show them."""
    return " / ".join(f"{parts[key] / MIB:.2f}" for key in ("weights", "kv", "compute"))


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: planned vs reported buffers, and RSS growth vs the planned resident part.

    Resident = weights + KV + host overhead: llama.cpp maps the weights and clears the KV
    cache at load, but compute pages are only touched by the batches that need them.
    """
    out = ["| model | n_ctx | K/V | FA | planned W / KV / C (MiB) | reported W / KV / C (MiB) "
           "| planned ÷ reported | RSS growth (MiB) | planned W+KV+OH (MiB) | RSS ÷ planned "
           "| RSS after 1 ubatch (MiB) |",
           "|" + "---|" * 11]
    for r in rows:
        p, q = r["planned"], r["reported"]
        host = r.get("planned_host", p)  # with a GPU, only the host's part is in RSS
        resident = host["weights"] + host["kv"] + r["planned_overhead"]
        grown = r["rss_growth_model"] + r["rss_growth_context"]
        decode = r["rss_growth_decode"]
        after = "–" if decode is None else f"{(r['rss_growth_model'] + decode) / MIB:.1f}"
        out.append(
            f"| {r['model']} | {r['n_ctx']} | {r['type_k']}/{r['type_v']} | "
            f"{'on' if r['flash_attn'] else 'off'} | "
            f"{wkc(p)} | {wkc(q)} | "
            f"{sum(p.values()) / sum(q.values()):.3f} | {grown / MIB:.1f} | "
            f"{resident / MIB:.1f} | {grown / resident:.3f} | {after} |")
    return "\n".join(out)


def gpu_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: GPU 0's planned vs reported buffers, and its memory growth vs the plan.

    Growth is the model load (first case: CUDA context included) plus this case's context;
    "runtime" is growth minus the reported CUDA buffers, the planner's GPU_RUNTIME_OVERHEAD.
    """
    def mib(n: int | None) -> str:
        return "–" if n is None else f"{n / MIB:.1f}"

    out = ["| n_ctx | K/V | FA | GPU layers | planned W / KV / C (MiB) | CUDA0 W / KV / C (MiB) "
           "| planned ÷ reported | growth (MiB) | runtime: growth − buffers (MiB) "
           "| planned incl. runtime (MiB) | growth ÷ planned | growth after 1 ubatch (MiB) |",
           "|" + "---|" * 12]
    for r in rows:
        p, q = r["planned_gpu"], r["reported_gpu"]
        planned = sum(p.values()) + r["planned_gpu_overhead"]
        model, ctx, dec = r["gpu_growth_model"], r["gpu_growth_context"], r["gpu_growth_decode"]
        grown = None if model is None or ctx is None else model + ctx
        after = None if model is None or dec is None else model + dec
        runtime = None if grown is None else grown - sum(q.values())
        ratio = f"{sum(p.values()) / sum(q.values()):.3f}" if sum(q.values()) else "–"
        vs_plan = "–" if grown is None else f"{grown / planned:.3f}"
        out.append(
            f"| {r['n_ctx']} | {r['type_k']}/{r['type_v']} | {'on' if r['flash_attn'] else 'off'} | "
            f"{r['gpu_layers']} | "
            f"{wkc(p)} | {wkc(q)} | "
            f"{ratio} | {mib(grown)} | {mib(runtime)} | {planned / MIB:.1f} | {vs_plan} | "
            f"{mib(after)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("cases", nargs="*", default=list(DEFAULT_CASES))
    parser.add_argument("--decode", action="store_true", help="also decode one ubatch per case")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.add_argument("--gpu-layers", type=int, default=0,
                        help="layers offloaded to GPU 0 (999: all; default 0, CPU only)")
    args = parser.parse_args(argv)
    rows = measure(args.model, [Case.parse(c) for c in args.cases], decode=args.decode,
                   gpu_layers=args.gpu_layers)
    if args.json:
        print(json.dumps(rows))
    else:
        print(table(rows))
        if args.gpu_layers:
            print()
            print(gpu_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
