"""`outrider serve` as a real process, the way the desktop app starts it."""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.server.serve import READY_PREFIX

KEY = "process-test-key"


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "runtime.cli.main", "serve", *args]


def first_line(process: subprocess.Popen[str], timeout: float = 120) -> str:
    """The first stdout line, or fail after `timeout` seconds (the process may hang)."""
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    return lines.get(timeout=timeout)


@pytest.fixture
def fake_parent() -> Iterator[subprocess.Popen[bytes]]:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield parent
    parent.kill()
    parent.wait()


def test_serve_prints_ready_answers_and_dies_with_its_parent(
        tiny_target: Path, tmp_path: Path, fake_parent: subprocess.Popen[bytes]) -> None:
    stderr = (tmp_path / "stderr.txt").open("w")
    process = subprocess.Popen(
        serve_command("--port", "0", "--api-key", KEY, "--parent-pid", str(fake_parent.pid),
                      "--ctx", "512", str(tiny_target)),
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=Path(__file__).parents[2])
    try:
        line = first_line(process)
        assert line.startswith(READY_PREFIX + " "), (line, (tmp_path / "stderr.txt").read_text())
        ready = json.loads(line[len(READY_PREFIX) + 1:])
        assert ready["pid"] == process.pid
        url = ready["url"]
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert httpx.get(f"{url}/v1/models").status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        models = httpx.get(f"{url}/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == [tiny_target.stem]
        reply = httpx.post(f"{url}/v1/completions", headers=auth, timeout=60,
                           json={"prompt": "Hello there", "max_tokens": 4, "temperature": 0})
        assert reply.json()["usage"]["completion_tokens"] == 4

        fake_parent.kill()
        fake_parent.wait()
        assert process.wait(timeout=60) == 0
        assert process.stdout is not None and process.stdout.read() == ""  # one line only
    finally:
        process.kill()
        process.wait()
        stderr.close()


def test_ollama_port_serves_the_same_models_on_a_second_port(tiny_target: Path,
                                                              tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        ollama_port = probe.getsockname()[1]
    process = subprocess.Popen(
        serve_command("--port", "0", "--ollama-port", str(ollama_port), "--ctx", "512",
                      str(tiny_target)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        cwd=Path(__file__).parents[2])
    try:
        ready = json.loads(first_line(process)[len(READY_PREFIX) + 1:])
        assert ready["ollama_url"] == f"http://127.0.0.1:{ollama_port}"
        main = httpx.get(f"{ready['url']}/api/tags").json()
        assert httpx.get(f"{ready['ollama_url']}/api/tags").json() == main
        reply = httpx.post(f"{ready['ollama_url']}/api/generate", timeout=60, json={
            "model": tiny_target.stem, "prompt": "Hi", "stream": False,
            "options": {"num_predict": 2}})
        assert reply.status_code == 200 and reply.json()["done"] is True
    finally:
        process.terminate()  # uvicorn shuts down, then re-raises SIGTERM as its exit
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)


def test_port_in_use_exits_2_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(serve_command("--port", str(port)), capture_output=True,
                                text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is already in use: choose another with --port, "
        "or --port 0 for any free one"]


@pytest.mark.parametrize(("args", "words"), [
    (["--host", "0.0.0.0", "--port", "0"], "--api-key"),
    (["--port", "0", "--ctx", "512"], "MODEL"),
    (["--port", "0", "/no/such/model.gguf"], "no model file"),
    (["--port", "0", "--parent-pid", "999999999"], "parent process"),
    (["--port", "0", "--max-models", "0"], "--max-models"),
    (["--port", "0", "--memory-budget-gib", "-1"], "--memory-budget-gib"),
    (["--port", "0", "--ollama-port", "70000"], "--ollama-port"),
])
def test_refusals_exit_2_with_one_line(args: list[str], words: str) -> None:
    result = subprocess.run(serve_command(*args), capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parents[2], env=_without_key())
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and words in line


def _without_key() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "OUTRIDER_API_KEY"}
