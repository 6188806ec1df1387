"""The router rows of `server_vs_llamaserver.py --router`: what loading models on demand costs.

1. *Cold JIT load to first token*: `outrider serve` with no model, the model in its library;
   the clock runs from the first request naming the model to its first streamed token (an
   engine process started, the model loaded, the prompt prefilled). llama-server has no JIT
   loading; its nearest figure is process start to first token (`--llama-server`), given
   beside it.
2. *Per-request routing overhead*: the time a request spends in the router when its model is
   resident — `ModelRouter.acquire(name)` and `release()`, name resolution included, with
   the model named by its file stem and by its Ollama-style library name, in a library of
   `--router-library` models (copies of the file under other names), p50 and p99 over
   `--router-requests` calls. Measured in-process on the router itself: through HTTP the same
   microseconds drown in the request's own milliseconds. The end-to-end figure beside it is
   the p50 time to first token of a 1-token reply through Outrider (router + engine process)
   and through llama-server, same model and prompt, sequential requests.

Goals: routing ≤ 2 ms per request (issue 17); warm TTFT through the router ≤ 1.0× of
llama-server's (issue 36: no IPC before submit, the template rendered once). The script
exits 1 when a goal is missed.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from runtime.llama.params import repack_is_safe
from runtime.openmp import reference_env

ROOT = Path(__file__).resolve().parents[1]


def _first_token_s(url: str, key: str, model: str | None, max_tokens: int = 1,
                   client: httpx.Client | None = None) -> float:
    """Seconds from sending a streamed chat request to its first content chunk. With
    `client` the connection is kept (a warm client: creating an httpx client costs ~20 ms
    of its own, the same for both servers, and is not what the row compares)."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Say hello."}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if model is not None:
        body["model"] = model
    start = time.perf_counter()
    with (client or httpx).stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600,
                                  headers={"Authorization": f"Bearer {key}"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - start
    return time.perf_counter() - start


def _warm_p50(url: str, key: str, model: str | None, n: int = 40) -> float:
    """p50 time to first token of `n` requests over one kept connection, after 5 unmeasured."""
    with httpx.Client() as client:
        for _ in range(5):
            _first_token_s(url, key, model, client=client)
        return _p50(lambda: _first_token_s(url, key, model, client=client), n)


def _library(model: Path, root: Path, copies: int) -> Path:
    """A library holding `model` and `copies - 1` more files under other names (links)."""
    (root / "bench" / "router").mkdir(parents=True)
    shutil.copyfile(model, root / "bench" / "router" / model.name)
    for i in range(1, copies):
        folder = root / f"owner{i}" / f"repo{i}"
        folder.mkdir(parents=True)
        (folder / f"other-{i}.Q4_0.gguf").symlink_to(model)
    return root


def routing_overhead(model: Path, copies: int, requests: int) -> dict[str, tuple[float, float]]:
    """p50 and p99 µs of acquire + release for a resident model, per way of naming it."""
    sys.path.insert(0, str(ROOT))
    from runtime.server.models.names import ModelNames
    from runtime.server.models.router import ModelRouter
    from runtime.settings.load import LoadSettings
    from tests.server.fake_engine import FakeEngine

    with tempfile.TemporaryDirectory() as tmp:
        library = _library(model, Path(tmp), copies)
        primary = FakeEngine()
        primary.start()
        names: list[ModelNames] = []
        router = ModelRouter(primary, find=lambda asked: names[0].find_in_library(asked),
                             make_engine=FakeEngine)
        names.append(ModelNames(library, router.named))
        path = library / "bench" / "router" / model.name
        primary.load(LoadSettings(model_path=path))
        out: dict[str, tuple[float, float]] = {}
        library_name = names[0].listing()[0].name  # Ollama-style: bench/router:QUANT
        try:
            for label, asked in (("default (no model named)", None),
                                 (f"file stem {path.stem}", path.stem),
                                 (f"library name {library_name}", library_name)):
                timings = []
                for _ in range(requests):
                    start = time.perf_counter_ns()
                    router.acquire(asked).release()
                    timings.append((time.perf_counter_ns() - start) / 1000)
                cuts = statistics.quantiles(timings, n=100, method="inclusive")
                out[label] = (statistics.median(timings), cuts[98])
        finally:
            router.close()
            primary.stop()
    return out


def cold_jit(model: Path, key: str) -> tuple[float, float]:
    """Seconds from the first request naming the model to its first token (the server up
    with no model; the load takes the settings the app remembers for the file, else the
    defaults: llama.cpp's thread count), and then p50 TTFT of a warm 1-token request."""
    from benchmarks.server_vs_llamaserver import free_port, wait_healthy

    with tempfile.TemporaryDirectory() as tmp:
        library = _library(model, Path(tmp), 1)
        port = free_port()
        cmd = [sys.executable, "-m", "runtime.cli.main", "serve", "--port", str(port),
               "--api-key", key, "--models-dir", str(library), "--log-level", "warning"]
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process)
            cold = _first_token_s(url, key, model.stem)
            warm = _warm_p50(url, key, model.stem)
        finally:
            process.terminate()
            process.wait(timeout=30)
    return cold, warm


def llama_server_cold(binary: Path, model: Path, key: str) -> tuple[float, float]:
    """llama-server's process start to first token, and its warm p50 TTFT."""
    from benchmarks.server_vs_llamaserver import free_port, wait_healthy

    port = free_port()
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--api-key", key, "--no-webui", "-c", "4096"]
    if not repack_is_safe():  # as our engine loads: llama.cpp's AMX repacking crashes (#20824)
        cmd.append("--no-repack")
    start = time.perf_counter()
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=reference_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)  # type: ignore[arg-type]
        _first_token_s(url, key, None)
        cold = time.perf_counter() - start
        warm = _warm_p50(url, key, None)
    finally:
        process.terminate()
        process.wait(timeout=30)
    return cold, warm


def _p50(measure: Callable[[], float], n: int) -> float:
    return statistics.median(measure() for _ in range(n))


ROUTING_GOAL_US = 2000.0
WARM_TTFT_GOAL = 1.0  # ours / llama-server's


def router_table(model: Path, key: str, llama_server: Path | None,
                 copies: int, requests: int) -> tuple[str, bool]:
    """The tables, and whether every goal held."""
    overhead = routing_overhead(model, copies, requests)
    cold, warm = cold_jit(model, key)
    met = all(p50 <= ROUTING_GOAL_US for p50, _ in overhead.values())
    lines = [f"router: {model.name}, library of {copies} models, {requests} acquisitions each",
             "", "| routing (resident model) | p50 µs | p99 µs |", "|---|---:|---:|"]
    lines += [f"| {label} | {p50:.0f} | {p99:.0f} |" for label, (p50, p99) in overhead.items()]
    lines += ["", "| | Outrider (JIT) | llama-server | ours / llama-server |",
              "|---|---:|---:|---:|"]
    if llama_server is not None:
        ref_cold, ref_warm = llama_server_cold(llama_server, model, key)
        ratio = warm / ref_warm
        met = met and ratio <= WARM_TTFT_GOAL
        lines.append(f"| cold: to first token, s | {cold:.2f} | {ref_cold:.2f} (process start) "
                     f"| {cold / ref_cold:.2f}× |")
        lines.append(f"| warm TTFT p50, ms (1 token) | {warm * 1e3:.1f} | {ref_warm * 1e3:.1f} "
                     f"| {ratio:.2f}× (goal ≤ {WARM_TTFT_GOAL:.1f}×: "
                     f"{'met' if ratio <= WARM_TTFT_GOAL else 'MISSED'}) |")
    else:
        lines.append(f"| cold: to first token, s | {cold:.2f} | – | – |")
        lines.append(f"| warm TTFT p50, ms (1 token) | {warm * 1e3:.1f} | – | – |")
    return "\n".join(lines), met
