"""Planned memory vs what llama.cpp allocates, and vs the process's RSS growth.

    python -m benchmarks.planner_calibration MODEL.gguf [CASE ...] [--decode] [--json]

A CASE is `n_ctx,type_k,type_v,flash` (flash: on/off), e.g. `8192,q8_0,q8_0,on`; without
cases a default grid runs. For each case the model is loaded once (mmap, CPU) in this
process through llama-cpp-python's low-level API, a context is created, and the buffer sizes
llama.cpp logs (`runtime.llama_log.parse_buffer_sizes`) are compared with
`runtime.planner.plan_memory`. RSS is measured before the model load, after it, and after
the context (and, with --decode, after one full ubatch, which touches the compute buffer).

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

from runtime.devices import Device
from runtime.gguf_info import read_model_info
from runtime.llama_log import buffer_totals, parse_buffer_sizes
from runtime.planner import plan_memory
from runtime.settings import LoadSettings

DEFAULT_CASES = ("512,f16,f16,on", "2048,f16,f16,off", "4096,q8_0,q8_0,on",
                 "8192,q4_0,q4_0,on", "8192,f16,f16,off")
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
             "iq4_nl": 20, "bf16": 30}
MIB = 1 << 20
# A CPU with room for anything: calibration compares sizes, not fit.
BIG_CPU = Device("cpu", "cpu", "cpu", 1 << 50, 1 << 50)


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


def measure(model: Path, cases: list[Case], decode: bool = False) -> list[dict[str, Any]]:
    """One row per case: planned and reported weights/kv/compute, RSS growth (bytes)."""
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
    params.n_gpu_layers = 0
    handle = L.llama_model_load_from_file(str(model).encode(), params)
    if not handle:
        raise SystemExit(f"llama.cpp could not load {model}")
    model_log = "".join(log)
    rss_model = rss()
    rows = []
    for case in cases:
        log.clear()
        rss_before = rss()
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
        rss_decoded = None
        if decode:
            n = min(512, case.n_ctx)
            tokens = (L.llama_token * n)(*[i % 200 + 3 for i in range(n)])  # kept alive
            if L.llama_decode(ctx, L.llama_batch_get_one(tokens, n)) != 0:
                raise SystemExit(f"llama_decode failed for {case}")
            rss_decoded = rss()
        reported = buffer_totals(parse_buffer_sizes(model_log + "".join(log)))
        settings = LoadSettings(model_path=model, n_ctx=case.n_ctx, type_k=case.type_k,
                                type_v=case.type_v, flash_attn="on" if case.flash else "off",
                                gpu_layers=0)
        plan = plan_memory(info, settings, [BIG_CPU])
        rows.append({
            "model": model.name, "n_ctx": case.n_ctx, "type_k": case.type_k,
            "type_v": case.type_v, "flash_attn": case.flash,
            "planned": {"weights": plan.weights, "kv": plan.kv, "compute": plan.compute},
            "planned_overhead": plan.overhead,
            "reported": reported,
            # RSS growth: the model load itself (first case only) plus this context.
            "rss_growth_model": rss_model - rss_start,
            "rss_growth_context": rss_ctx - rss_before,
            "rss_growth_decode": None if rss_decoded is None else rss_decoded - rss_before,
        })
        L.llama_free(ctx)
    L.llama_model_free(handle)
    L.llama_log_set(L.llama_log_callback(), ctypes.c_void_p(0))  # NULL: stderr; on_log dies here
    return rows


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
        resident = p["weights"] + p["kv"] + r["planned_overhead"]
        grown = r["rss_growth_model"] + r["rss_growth_context"]
        decode = r["rss_growth_decode"]
        after = "–" if decode is None else f"{(r['rss_growth_model'] + decode) / MIB:.1f}"
        out.append(
            f"| {r['model']} | {r['n_ctx']} | {r['type_k']}/{r['type_v']} | "
            f"{'on' if r['flash_attn'] else 'off'} | "
            f"{p['weights'] / MIB:.2f} / {p['kv'] / MIB:.2f} / {p['compute'] / MIB:.2f} | "
            f"{q['weights'] / MIB:.2f} / {q['kv'] / MIB:.2f} / {q['compute'] / MIB:.2f} | "
            f"{sum(p.values()) / sum(q.values()):.3f} | {grown / MIB:.1f} | "
            f"{resident / MIB:.1f} | {grown / resident:.3f} | {after} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("cases", nargs="*", default=list(DEFAULT_CASES))
    parser.add_argument("--decode", action="store_true", help="also decode one ubatch per case")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args(argv)
    rows = measure(args.model, [Case.parse(c) for c in args.cases], decode=args.decode)
    print(json.dumps(rows) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
