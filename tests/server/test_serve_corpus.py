"""The mutation corpus (tests/fixtures/gguf_mutations.py, ≥ 300 broken or odd GGUFs) through
ONE `outrider serve` process: every `/api/load` is a 200 or a one-line 4xx, every model that
loads answers one completion with a 200 or a one-line 4xx, and `/health` answers after each —
no file crashes, hangs or poisons the server.

Files the preflight refuses cost a header read; the rest each cost one probe child
(runtime.engine.probe), which is where most of this test's time goes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx

from runtime.server.serve import READY_PREFIX
from tests.fixtures.gguf_mutations import corpus
from tests.server.sse_parse import parse_sse
from tests.server.test_serve_process import first_line, serve_command

KEY = "corpus-test-key"
LOAD = {"n_ctx": 256, "n_threads": 1, "n_parallel": 1}


def one_line_4xx(response: httpx.Response) -> bool:
    if not 400 <= response.status_code < 500:
        return False
    error = response.json()["error"]
    return bool(error["code"]) and bool(error["message"]) and "\n" not in error["message"]


def test_every_corpus_file_loads_or_is_refused_and_the_server_lives(tmp_path: Path) -> None:
    models = tmp_path / "models"
    mutations = corpus(models / "corpus")
    assert len(mutations) >= 300
    stderr = (tmp_path / "stderr.txt").open("w")
    process = subprocess.Popen(
        serve_command("--port", "0", "--api-key", KEY, "--models-dir", str(models)),
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=Path(__file__).parents[2],
        env=dict(os.environ))
    outcomes: Counter[str] = Counter()
    started = time.monotonic()
    try:
        line = first_line(process)
        assert line.startswith(READY_PREFIX + " "), (line, (tmp_path / "stderr.txt").read_text())
        url = json.loads(line[len(READY_PREFIX) + 1:])["url"]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=60) as http:
            for mutation in mutations:
                where = f"{mutation.name} ({mutation.expect})"
                body = {"model_path": str(mutation.path.relative_to(models)), **LOAD}
                response = http.post("/api/load", json=body)
                if response.status_code == 200:
                    name, data = parse_sse(response.text)[-1]
                    assert name in ("loaded", "error"), where
                    if name == "error":  # after loading began: rare, and one line
                        assert "\n" not in data["message"], where
                        outcomes["error event"] += 1
                    else:
                        reply = http.post("/v1/completions", json={
                            "prompt": "Hello", "max_tokens": 2, "temperature": 0})
                        assert reply.status_code == 200 or one_line_4xx(reply), \
                            (where, reply.status_code, reply.text)
                        outcomes[f"loaded, completion {reply.status_code}"] += 1
                else:
                    assert one_line_4xx(response), (where, response.status_code, response.text)
                    outcomes[f"{response.status_code} {response.json()['error']['code']}"] += 1
                assert http.get("/health", timeout=5).json() == {"status": "ok"}, where
                assert mutation.expect != "loads" or response.status_code == 200, \
                    (where, response.text)
        assert process.poll() is None, "the server died"
    finally:
        process.kill()
        process.wait()
        stderr.close()
    print(f"{len(mutations)} files in {time.monotonic() - started:.0f} s: {dict(outcomes)}")
