"""A model split across machines over llama.cpp's RPC backend, against llama.cpp's own split.

On one machine over loopback (the network cost is then only the protocol's): two workers
hold `--gpu-layers` of the model's layers (`--tensor-split` between them), this process the
rest. Decode speed (tg: `-n` tokens after a one-token prompt, greedy, EOS ignored), one run:

    engine, local                 the engine with the whole model here
    engine, 2 Outrider workers    `outrider worker` ×2 + the engine with --worker ×2
    engine, 2 rpc-servers         llama.cpp's rpc-server ×2 + the engine (the same protocol)
    llama-bench, local            llama-bench -ngl 0
    llama-bench, 2 rpc-servers    rpc-server ×2 + llama-bench --rpc A,B -ngl G -ts 1/1

The goal: the engine split over Outrider's workers ≥ 0.95× llama-bench's split. Every process
gets `--threads` threads (1 by default: on a small machine three processes take turns, and a
single thread per process leaves none spinning at another's barriers).

    python benchmarks/distributed.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --rpc-server /tmp/llama-tools/bin/rpc-server --llama-bench /tmp/llama-tools/bin/llama-bench

rpc-server and llama-bench must come from a llama.cpp build with -DGGML_RPC=ON of the version
llama-cpp-python vendors (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.engine import Engine
from runtime.events import Finished, GenerationRequest, SamplingParams
from runtime.openmp import reference_env
from runtime.planner.workers import probe_worker
from runtime.settings.load import LoadSettings

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def servers(kind: str, threads: int, rpc_server: Path | None = None,
            n: int = 2) -> Iterator[list[str]]:
    """n RPC servers on loopback ("outrider": `outrider worker`; "llama": rpc-server),
    yielded as endpoints once each answers the handshake."""
    processes, endpoints = [], []
    try:
        for _ in range(n):
            port = free_port()
            if kind == "outrider":
                cmd = [sys.executable, "-m", "runtime.cli.main", "worker", "--port", str(port),
                       "--threads", str(threads), "--no-cache"]
                env = None
            else:
                assert rpc_server is not None
                cmd = [str(rpc_server), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)]
                env = reference_env()
            processes.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
            endpoints.append(f"127.0.0.1:{port}")
        for endpoint in endpoints:
            deadline = time.monotonic() + 120
            while True:
                try:
                    probe_worker(endpoint, timeout_s=2.0)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        yield endpoints
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


def engine_tg(model: Path, threads: int, n: int, reps: int, workers: tuple[str, ...] = (),
              gpu_layers: int | None = None,
              tensor_split: tuple[float, ...] | None = None) -> list[float]:
    engine = Engine()
    try:
        engine.load(LoadSettings(model_path=model, n_ctx=n + 64, n_threads=threads,
                                 workers=workers, gpu_layers=gpu_layers if workers else 0,
                                 tensor_split=tensor_split if workers else None))
        sampling = SamplingParams(temperature=0, max_tokens=n + 1, ignore_eos=True)

        def once() -> float:
            events = list(engine.submit(GenerationRequest(prompt=(1000,), sampling=sampling)).events())
            done = events[-1]
            if not isinstance(done, Finished):
                sys.exit(f"the engine failed: {done}")
            return done.timings.decode_tokens_per_s

        once()  # warm-up
        return [once() for _ in range(reps)]
    finally:
        engine.stop()


def bench_tg(binary: Path, model: Path, threads: int, n: int, reps: int,
             rpc: list[str] | None = None, gpu_layers: int = 0,
             tensor_split: tuple[float, ...] | None = None) -> list[float]:
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-p", "0", "-n", str(n),
           "-r", str(reps), "-o", "json", "-ngl", str(gpu_layers)]
    if rpc:
        cmd += ["--rpc", ",".join(rpc)]
    if tensor_split:
        cmd += ["-ts", "/".join(f"{x:g}" for x in tensor_split)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env=reference_env())
    if result.returncode != 0:
        sys.exit(f"llama-bench failed ({result.returncode}): {result.stderr.strip()[-800:]}")
    row = json.loads(result.stdout)[0]
    return [float(x) for x in row.get("samples_ts") or [row["avg_ts"]]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rpc-server", type=Path, help="llama.cpp's rpc-server (GGML_RPC=ON)")
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench (GGML_RPC=ON)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("-n", type=int, default=64, help="tokens generated per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the whole comparison, interleaved (medians over rounds)")
    parser.add_argument("--gpu-layers", type=int, default=21,
                        help="layers on the two workers (default 21 of SmolLM2's 31: what the "
                             "planner puts there by free memory on one machine)")
    parser.add_argument("--tensor-split", default="1,1")
    args = parser.parse_args()
    split = tuple(float(x) for x in args.tensor_split.split(","))
    rows: dict[str, list[float]] = {}

    def add(name: str, samples: list[float]) -> None:
        rows.setdefault(name, []).append(statistics.median(samples))

    for round_no in range(args.rounds):
        load = os.getloadavg()[0]
        add("engine, local", engine_tg(args.model, args.threads, args.n, args.reps))
        with servers("outrider", args.threads) as endpoints:
            add("engine, 2 Outrider workers", engine_tg(
                args.model, args.threads, args.n, args.reps, tuple(endpoints), args.gpu_layers,
                split))
        if args.rpc_server is not None:
            with servers("llama", args.threads, args.rpc_server) as endpoints:
                add("engine, 2 rpc-servers", engine_tg(
                    args.model, args.threads, args.n, args.reps, tuple(endpoints),
                    args.gpu_layers, split))
                if args.llama_bench is not None:
                    add("llama-bench, 2 rpc-servers", bench_tg(
                        args.llama_bench, args.model, args.threads, args.n, args.reps,
                        endpoints, args.gpu_layers, split))
        if args.llama_bench is not None:
            add("llama-bench, local", bench_tg(args.llama_bench, args.model, args.threads,
                                               args.n, args.reps))
        print(f"round {round_no + 1}: load {load:.2f} → {os.getloadavg()[0]:.2f}; "
              + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()), file=sys.stderr)

    median = {name: statistics.median(values) for name, values in rows.items()}
    print(f"\n{args.model.name}, {args.threads} thread(s) per process, tg{args.n}, "
          f"{args.gpu_layers} layers on the workers split {args.tensor_split}, "
          f"{args.rounds} round(s) × {args.reps} reps\n")
    print("| configuration | tok/s (median) | ÷ local of the same tool |")
    print("|---|---:|---:|")
    for name, value in median.items():
        local = median.get("engine, local" if name.startswith("engine") else "llama-bench, local")
        ratio = f"{value / local:.3f}" if local else "—"
        print(f"| {name} | {value:.1f} | {ratio} |")
    ours, ref = median.get("engine, 2 Outrider workers"), median.get("llama-bench, 2 rpc-servers")
    if ours and ref:
        print(f"\nengine split ÷ llama-bench split: **{ours / ref:.3f}** (goal ≥ 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
