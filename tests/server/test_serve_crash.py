"""`outrider serve` as a real process survives a file that aborts llama.cpp: `/api/load` answers
400 with the assertion, `/health` still answers, and the next good model loads and replies.

The server's engine probes each new file in a child (runtime.engine.probe); the crash file
passes the preflight and really aborts llama.cpp (tests/fixtures/crash_gguf.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.gguf.verdicts import FILE_NAME
from runtime.paths import user_dirs
from runtime.server.serve import READY_PREFIX
from tests.fixtures.crash_gguf import aborts_llama_cpp, crashing_gguf
from tests.server.sse_parse import parse_sse
from tests.server.test_serve_process import first_line, serve_command

KEY = "crash-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def server(tmp_path: Path, tiny_target: Path) -> Iterator[tuple[httpx.Client, Path, Path]]:
    """A served library holding a crashing file and a good one; no model loaded at start."""
    models = tmp_path / "models" / "o" / "r"
    crash = crashing_gguf(models)
    assert crash is not None, "the preflight refuses every crash file tests/fixtures knows"
    assert aborts_llama_cpp(crash)
    good = models / "good.gguf"
    shutil.copyfile(tiny_target, good)
    stderr = (tmp_path / "stderr.txt").open("w")
    process = subprocess.Popen(
        serve_command("--port", "0", "--api-key", KEY, "--models-dir", str(tmp_path / "models")),
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=Path(__file__).parents[2],
        env=dict(os.environ))
    try:
        line = first_line(process)
        assert line.startswith(READY_PREFIX + " "), (line, (tmp_path / "stderr.txt").read_text())
        url = json.loads(line[len(READY_PREFIX) + 1:])["url"]
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
            yield http, crash, good
        assert process.poll() is None, "the server died"
    finally:
        process.kill()
        process.wait()
        stderr.close()


def test_a_crashing_file_is_a_400_and_the_server_lives_on(
        server: tuple[httpx.Client, Path, Path]) -> None:
    http, crash, _good = server
    name = str(crash.relative_to(crash.parents[2]))
    response = http.post("/api/load", json={"model_path": name, "n_ctx": 256, "n_threads": 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_model_file"
    message = error["message"]
    assert message.startswith(f"llama.cpp crashed while loading {crash.name}: ")
    assert "GGML_ASSERT" in message and "\n" not in message
    assert http.get("/health").json() == {"status": "ok"}

    verdicts = user_dirs().cache / FILE_NAME  # the server shares the test's OUTRIDER_HOME
    written = verdicts.stat().st_mtime_ns
    again = http.post("/api/load", json={"model_path": name, "n_ctx": 256, "n_threads": 1})
    assert again.status_code == 400 and again.json()["error"]["message"] == message
    assert verdicts.stat().st_mtime_ns == written  # refused from the store: no new probe

    events = parse_sse(http.post("/api/load", json={"model_path": "o/r/good.gguf",
                                                    "n_ctx": 256, "n_threads": 1}).text)
    assert events[-1][0] == "loaded", events[-1]
    reply = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3,
                                               "temperature": 0})
    assert reply.json()["usage"]["completion_tokens"] == 3
    assert http.get("/health").json() == {"status": "ok"}
