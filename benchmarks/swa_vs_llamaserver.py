"""Sliding-window KV cache: Outrider's engine and planner vs what llama-server allocates.

    python -m benchmarks.swa_vs_llamaserver --llama-server PATH [--model FILE.gguf]
                                            [--case N_CTX,N_PARALLEL,TYPE_K,TYPE_V ...]

For each case the same GGUF is loaded three ways and the KV bytes compared:

- llama-server (`-c N_CTX -np N_PARALLEL -ctk -ctv --kv-unified`, its defaults otherwise:
  `swa_full` off) — the sizes it logs ("CPU KV buffer size", a SWA and a non-SWA part);
- Outrider's engine (`runtime.engine.engine.Engine`, the same settings) — the sizes llama.cpp
  logs for its context (`LoadedModel.allocated`);
- Outrider's planner (`runtime.planner.plan.plan_memory`), from the header alone.

Without `--model` the tiny Gemma-3-style fixture of the tests is written (6 layers, 5 of 6 on
a 32-token window: `tests.fixtures.tiny_gguf.SWA_TARGET`). Both sides log in MiB with two
decimals, so equal means equal to about ±5 KiB per buffer.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.engine.engine import Engine
from runtime.gguf.info import read_model_info
from runtime.llama.buffers import buffer_totals, parse_buffer_sizes
from runtime.openmp import reference_env
from runtime.planner.devices import Device
from runtime.planner.plan import plan_memory
from runtime.settings.load import LoadSettings
from runtime.units import fmt_bytes

DEFAULT_CASES = ("4096,1,f16,f16", "16384,1,f16,f16", "65536,1,f16,f16", "16384,4,f16,f16",
                 "65536,4,q8_0,q8_0")
_CPU = [Device(id="cpu", name="cpu", kind="cpu", total_bytes=64 << 30, free_bytes=64 << 30)]


@dataclass(frozen=True)
class Case:
    n_ctx: int
    n_parallel: int
    type_k: str
    type_v: str

    @classmethod
    def parse(cls, text: str) -> Case:
        n_ctx, n_parallel, type_k, type_v = text.split(",")
        return cls(int(n_ctx), int(n_parallel), type_k, type_v)

    def settings(self, model: Path) -> LoadSettings:
        return LoadSettings(model_path=model, n_ctx=self.n_ctx, n_parallel=self.n_parallel,
                            type_k=self.type_k, type_v=self.type_v, n_threads=1,
                            gpu_layers=0, flash_attn="on" if self.type_v != "f16" else "auto")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_server_kv(binary: Path, model: Path, case: Case, timeout_s: float = 120.0) -> int:
    """KV bytes llama-server logs for `case` (it is stopped once it has loaded)."""
    cmd = [str(binary), "-m", str(model), "-c", str(case.n_ctx), "-np", str(case.n_parallel),
           "-ctk", case.type_k, "-ctv", case.type_v, "--kv-unified", "-t", "1", "-ngl", "0",
           "--host", "127.0.0.1", "--port", str(_free_port()), "--no-webui", "-lv", "4"]
    if case.type_v != "f16":
        cmd += ["-fa", "on"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=reference_env())
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not finish loading in time")
    finally:
        proc.kill()
        proc.wait()
    log = "".join(lines)
    kv = buffer_totals(parse_buffer_sizes(log))["kv"]
    if kv == 0:
        raise RuntimeError(f"llama-server logged no KV buffer:\n{log[-2000:]}")
    return kv


def outrider_kv(engine: Engine, model: Path, case: Case) -> tuple[int, int]:
    """(KV bytes llama.cpp logs for the engine's context, KV bytes the planner plans)."""
    settings = case.settings(model)
    loaded = engine.load(settings)
    measured = buffer_totals(loaded.allocated)["kv"]
    planned = plan_memory(read_model_info(model), settings, _CPU).kv
    return measured, planned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--case", action="append", dest="cases")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from tests.fixtures.tiny_gguf import SWA_TARGET, write_tiny_gguf

        model = Path(tempfile.mkdtemp()) / "tiny-gemma3.gguf"
        write_tiny_gguf(model, SWA_TARGET)
    info = read_model_info(model)
    cases = [Case.parse(c) for c in (args.cases or DEFAULT_CASES)]
    engine = Engine()
    engine.start()
    rows = []
    try:
        for case in cases:
            server = llama_server_kv(args.llama_server, model, case)
            measured, planned = outrider_kv(engine, model, case)
            rows.append((case, server, measured, planned))
    finally:
        engine.stop()
    print(f"{model.name} ({info.architecture}, window {info.sliding_window})\n")
    print("| n_ctx | slots | K/V | llama-server KV | Outrider engine KV | engine/server "
          "| planner KV | planner/engine |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for case, server, measured, planned in rows:
        print(f"| {case.n_ctx:,} | {case.n_parallel} | {case.type_k}/{case.type_v} "
              f"| {fmt_bytes(server)} | {fmt_bytes(measured)} | {measured / server:.4f} "
              f"| {fmt_bytes(planned)} | {planned / measured:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
