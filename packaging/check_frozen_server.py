"""The frozen server answers structured output and forced tool calls (`make package-test`).

    .venv/bin/python packaging/check_frozen_server.py --app dist/Outrider/Outrider --model M.gguf

Starts `APP --engine serve MODEL --port 0 --models-dir DIR` with a temporary OUTRIDER_HOME,
takes its address from the one line it prints when it listens (OUTRIDER_SERVER_READY {...},
runtime/server/serve.py), and asks it over HTTP:

1. MODEL, a chat completion with `response_format: {"type": "json_schema", ...}`: the reply
   must be JSON valid against the schema;
2. a tiny random-weight model with a Hermes-style chat template, loaded on demand from DIR
   (the default model's template has no tool-call format, so the server rightly refuses it
   tools), a chat completion with `tools` and a `tool_choice` naming `get_weather`: the reply
   must be a call of `get_weather` whose arguments are JSON valid against its parameters.

The server and every process it started are killed at the end, whatever happened. Runs with
the venv's Python (httpx, jsonschema and tests/fixtures/tiny_gguf.py), not inside the bundle.
Prints one line per check; exit 0 when both pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import psutil

ROOT = Path(__file__).resolve().parents[1]
READY = "OUTRIDER_SERVER_READY"
START_TIMEOUT_S = 180
REQUEST_TIMEOUT_S = 300

PERSON = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "object",
           "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                      "parameters": WEATHER}},
]
# ChatML with the tools in a system turn and calls as <tool_call>{json}</tool_call>: the
# "hermes" family (runtime/chat/families.py), whose calls the server forces with a grammar.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Call one as <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def say(line: str) -> None:
    print(f"check_frozen_server: {line}", flush=True)


def write_tools_model(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.tiny_gguf import TARGET, write_tiny_gguf

    spec = replace(TARGET, name="tiny-tools", chat_template=TOOLS_TEMPLATE)
    return write_tiny_gguf(folder / "tiny-tools.gguf", spec)


class Server:
    """`APP --engine serve …` in its own session; `stop()` ends it and its children."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode(errors="replace").rstrip("\n"))
        self._lines.put(None)

    def wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"the server exited ({self.proc.wait()}) before listening")
            if line.startswith(READY):
                return str(json.loads(line[len(READY):])["url"])
        raise RuntimeError(f"the server did not listen within {timeout:.0f} s")

    def stop(self) -> None:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.send_signal(sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)  # the session's group: whatever else it started
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
            if not psutil.wait_procs(children, timeout=10)[1]:
                break
        self._log.close()


def model_id(client: httpx.Client, path: Path) -> str:
    models = client.get("/v1/models").raise_for_status().json()["data"]
    for model in models:
        if Path(model.get("outrider", {}).get("path", "")).resolve() == path.resolve():
            return str(model["id"])
    raise RuntimeError(f"the server lists no model at {path}: {[m['id'] for m in models]}")


def chat(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def check_structured_output(client: httpx.Client, model: str) -> str:
    message = chat(client, {
        "model": model, "temperature": 0, "max_tokens": 200,
        "messages": [{"role": "user", "content": "Give a person named Ann, aged 30, as JSON."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "person", "strict": True, "schema": PERSON}}})
    content = message.get("content") or ""
    value = json.loads(content)  # raises on anything but JSON
    jsonschema.validate(value, PERSON)
    return f"json_schema reply {json.dumps(value)}"


def check_tool_call(client: httpx.Client, model: str) -> str:
    message = chat(client, {
        "model": model, "temperature": 0, "seed": 7, "max_tokens": 1000,
        "messages": [{"role": "user", "content": "Weather in Oslo for 2 days?"}],
        "tools": TOOLS, "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    calls = message.get("tool_calls") or []
    if not calls:
        raise RuntimeError(f"no tool call in the reply: {json.dumps(message)[:500]}")
    function = calls[0]["function"]
    if function["name"] != "get_weather":
        raise RuntimeError(f"the call is of {function['name']!r}, not 'get_weather'")
    arguments = json.loads(function["arguments"])
    jsonschema.validate(arguments, WEATHER)
    return f"tool call get_weather({json.dumps(arguments)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", type=Path, default=ROOT / "dist" / "Outrider" / "Outrider")
    parser.add_argument("--model", type=Path, required=True, help="the default model's file")
    args = parser.parse_args(argv)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="outrider-frozen-server-") as tmp:
        work = Path(tmp)
        models = work / "models"
        models.mkdir()
        tools_model = write_tools_model(models)
        env = dict(os.environ, OUTRIDER_HOME=str(work / "home"))
        command = [str(args.app), "--engine", "serve", str(args.model.resolve()),
                   "--port", "0", "--models-dir", str(models), "--saved-kv-gib", "0",
                   "--parent-pid", str(os.getpid())]
        say(" ".join(command))
        log = work / "server.log"
        server = Server(command, env, log)
        try:
            url = server.wait_ready(START_TIMEOUT_S)
            say(f"listening at {url}")
            with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
                checks = (("structured output", check_structured_output, args.model),
                          ("tool call", check_tool_call, tools_model))
                for label, check, path in checks:
                    try:
                        say(f"ok: {label}: {check(client, model_id(client, path))}")
                    except Exception as exc:
                        failures += 1
                        say(f"FAILED: {label}: {type(exc).__name__}: {exc}")
        except Exception as exc:
            failures += 1
            say(f"FAILED: {type(exc).__name__}: {exc}")
        finally:
            server.stop()
        if failures:
            tail = log.read_text(errors="replace").splitlines()[-30:]
            say("the server's stderr, last lines:\n    " + "\n    ".join(tail))
    say("passed" if not failures else f"{failures} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
