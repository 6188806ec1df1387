"""A small, deterministic stand-in for the engine server, speaking docs/api.md.

GUI tests use it where the behaviour under test is the app's, not the engine's: replies are
fixed text, the speed is set on the command line, and words in the user's message steer it:

    [[long]]    a 300-token reply           [[md]]    a reply with a heading, list and code
    [[error]]   an error event mid-stream   [[slow]]  50 ms per token (for Stop / kill tests)
    [[tokens=N]] N tokens of paragraphs with a code block now and then (benchmarks)
    [[gate]]    after 3 tokens, wait until the --gate-file exists (a reply caught mid-stream)
    [[think]]   thinking first (`delta.reasoning_content`), a held-back `</think>` token, then
                the answer               [[json]]  a reply that is one JSON object

Run it as the app runs the real one (`--port 0` prints the ready line):

    python -m tests.gui.fake_server --token-delay 0.002 --port 0 --api-key k --parent-pid 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MD_REPLY = ("## Plan\n\nHere is a list:\n\n- one\n- **two**\n\n"
            "```python\ndef greet(name):\n    return f\"hi {name}\"\n```\n\nDone.")
THINK_TEXT = "The user greets me. A short, friendly answer will do."
JSON_REPLY = '{"name": "Ada", "languages": ["en", "fr"], "age": 36}'


def reply_tokens(user_text: str) -> list[str]:
    """The reply to `user_text`, cut into token-sized pieces.

    >>> reply_tokens("hello there")[:3]
    ['You ', 'said: ', 'hello ']
    """
    if "[[long]]" in user_text:
        return [f"w{i} " for i in range(300)]
    match = re.search(r"\[\[tokens=(\d+)\]\]", user_text)
    if match:
        return long_reply(int(match.group(1)))
    if "[[md]]" in user_text:
        text = MD_REPLY
    elif "[[json]]" in user_text:
        text = JSON_REPLY
    else:
        words = user_text.replace("[[slow]]", "").replace("[[error]]", "").replace(
            "[[think]]", "").split()
        text = "You said: " + " ".join(words) + ". Fine."
    return pieces_of(text)


def pieces_of(text: str) -> list[str]:
    """`text` cut after each space and newline (a stand-in for tokens)."""
    pieces, current = [], ""
    for ch in text:
        current += ch
        if ch in " \n":
            pieces.append(current)
            current = ""
    return [*pieces, current] if current else pieces


def long_reply(n: int) -> list[str]:
    """`n` token pieces: 60-word paragraphs, a fenced code block after every fourth.

    >>> pieces = long_reply(300); len(pieces), sum(p.startswith("```") for p in pieces)
    (300, 2)
    """
    pieces: list[str] = []
    i = 0
    while len(pieces) < n:
        pieces += [f"word{i}_{j} " for j in range(60)] + ["\n\n"]
        if i % 4 == 3:
            pieces += ["```python\n", "def f(x):\n", "    return x * 2\n", "```\n\n"]
        i += 1
    return pieces[:n]


class State:
    def __init__(self, token_delay: float, metrics_interval: float, load_delay: float,
                 gate_file: str | None = None) -> None:
        self.token_delay = token_delay
        self.gate_file = gate_file
        self.metrics_interval = metrics_interval
        self.load_delay = load_delay
        self.model: dict[str, Any] | None = None
        self.decode_rate = 0.0
        self.lock = threading.Lock()


def plan_for(path: str) -> dict[str, Any]:
    size = Path(path).stat().st_size if Path(path).is_file() else 0
    fits = "wont-fit" not in Path(path).name
    return {"verdict": "cpu_only" if fits else "wont_fit", "fits": fits,
            "weights_bytes": size, "kv_bytes": 4 << 20, "compute_bytes": 2 << 20,
            "total_bytes": size + (6 << 20), "max_context": 4096}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer
    state: State
    api_key: str

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("fake-server: " + format % args + "\n")

    # -- plumbing ----------------------------------------------------------------------

    def _authorized(self) -> bool:
        if self.path == "/health" or not self.api_key:
            return True
        if self.headers.get("Authorization") == f"Bearer {self.api_key}":
            return True
        self._json(401, {"error": {"message": "bad key", "type": "authentication_error"}})
        return False

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _send(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, name: str | None, data: Any) -> None:
        payload = data if isinstance(data, str) else json.dumps(data)
        self._send((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- routes ------------------------------------------------------------------------

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path == "/health":
            self._json(200, {"ok": True})
        elif self.path == "/v1/models":
            model = self.state.model
            self._json(200, {"object": "list", "data": [{"id": model["name"], "object": "model"}]
                             if model else []})
        elif self.path == "/api/status":
            model = self.state.model
            self._json(200, {"state": "ready" if model else "empty", "model": model,
                             "settings": None, "plan": model and model.get("plan"),
                             "resident": [_resident(model)] if model else []})
        elif self.path == "/api/metrics":
            self._json(200, self._metrics())
        elif self.path == "/api/metrics/stream":
            self._start_stream()
            try:
                while True:
                    self._event("metrics", self._metrics())
                    time.sleep(self.state.metrics_interval)
            except OSError:
                return
        else:
            self._json(404, {"error": {"message": "no such route", "type": "not_found"}})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        if self.path == "/api/load":
            self._load(body)
        elif self.path == "/api/unload":
            model, asked = self.state.model, body.get("model")
            if asked and (model is None or asked not in (model["name"], model["path"])):
                self._json(404, {"error": {"message": f"{asked} is not resident",
                                           "type": "not_found", "code": "model_not_found"}})
                return
            self.state.model = None
            self._json(200, {"unloaded": True})
        elif self.path == "/v1/chat/completions":
            self._chat(body)
        else:
            self._json(404, {"error": {"message": "no such route", "type": "not_found"}})

    def _metrics(self) -> dict[str, Any]:
        model = self.state.model
        plan = (model or {}).get("plan") or {}
        return {
            "time": time.time(),
            "devices": [{"id": "cpu", "name": "Fake CPU", "kind": "cpu",
                         "total_bytes": 16 << 30, "free_bytes": 12 << 30,
                         "planned": {"weights": plan.get("weights_bytes", 0),
                                     "kv": plan.get("kv_bytes", 0),
                                     "compute": plan.get("compute_bytes", 0)}}],
            "engine_rss_bytes": 300 << 20,
            "decode_tokens_per_s": self.state.decode_rate, "prefill_tokens_per_s": 900.0,
            "acceptance_rate": 0.5 if model else None, "mean_accepted_length": 1.5,
            "draft_k": 4, "drafting_off_reason": None,
            "kv_cells_used": 10, "kv_cells_total": 4096,
            "active_sequences": 0, "waiting_sequences": 0,
        }

    def _load(self, body: dict[str, Any]) -> None:
        path = str(body.get("model_path", ""))
        self._start_stream()
        if not Path(path).is_file():
            self._event("error", {"kind": "ModelNotFound", "message": f"No model file at {path}"})
            self._end_stream()
            return
        plan = plan_for(path)
        self._event("plan", plan)
        for fraction in (0.0, 0.5, 1.0):
            time.sleep(self.state.load_delay / 3)
            self._event("progress", {"fraction": fraction})
        name = Path(path).stem
        model = {"name": name, "path": path, "quant": "F32", "n_ctx": int(body.get("n_ctx", 4096)),
                 "plan": plan}
        self.state.model = model
        measured = {"weights_bytes": plan["weights_bytes"], "kv_bytes": plan["kv_bytes"],
                    "compute_bytes": plan["compute_bytes"] + 1024}
        self._event("loaded", {"model": model, "plan": plan, "measured": measured})
        self._end_stream()

    def _chat(self, body: dict[str, Any]) -> None:
        if self.state.model is None:
            self._json(400, {"error": {"message": "No model is loaded.", "type": "invalid_request_error",
                                       "code": "no_model"}})
            return
        messages = body.get("messages") or []
        user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        # (delta key, text) per token: "reasoning_content" thinking, "" a token whose text
        # the server held back (the `</think>` marker), "content" the answer.
        thinking = [("reasoning_content", p) for p in pieces_of(THINK_TEXT)] + [("", "")] \
            if "[[think]]" in user else []
        items = thinking + [("content", p) for p in reply_tokens(user)]
        tokens = items[: int(body.get("max_tokens") or 10_000)]
        delay = 0.05 if "[[slow]]" in user else self.state.token_delay
        self._start_stream()
        started = time.perf_counter()
        try:
            for i, (key, piece) in enumerate(tokens):
                if "[[error]]" in user and i == 3:
                    self._event(None, {"error": {"message": "The fake engine failed on purpose.",
                                                 "type": "server_error"}})
                    self._end_stream()
                    return
                if "[[gate]]" in user and i == 3:
                    _wait_for_gate_file(self.state.gate_file)
                time.sleep(delay)
                drafted = i % 3 != 0
                chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {key: piece} if key else {},
                                      "finish_reason": None}],
                         "outrider": {"token_ids": [100 + i], "from_draft": [drafted],
                                      "step": {"drafted": 4, "accepted": 2,
                                               "reply_drafted": 4 * (i + 1),
                                               "reply_accepted": 2 * (i + 1), "k": 4,
                                               "acceptance_rate": 0.5, "mean_accepted_length": 3.0,
                                               "predicted_speedup": 1.4, "measured_speedup": 1.2,
                                               "drafting_off_reason": None}}}
                self._event(None, chunk)
            total = time.perf_counter() - started
            self.state.decode_rate = len(tokens) / max(total, 1e-6)
            final = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                     "outrider": {"timings": {"ttft_s": delay, "prefill_tokens_per_s": 900.0,
                                              "decode_tokens_per_s": self.state.decode_rate,
                                              "total_s": total},
                                  "usage": {"prompt_tokens": 12, "completion_tokens": len(tokens),
                                            "total_tokens": 12 + len(tokens)},
                                  "speculative": {"drafted": 4 * len(tokens),
                                                  "accepted": 2 * len(tokens),
                                                  "acceptance_rate": 0.5,
                                                  "mean_accepted_length": 3.0,
                                                  "measured_speedup": 1.2}}}
            self._event(None, final)
            self._event(None, "[DONE]")
            self._end_stream()
        except OSError:
            return  # the client went away (Stop): stop generating, as the real engine does


def _resident(model: dict[str, Any]) -> dict[str, Any]:
    """The one model, as `/api/status` lists resident ones (docs/api.md)."""
    return {"name": model["name"], "path": model["path"], "state": "ready", "default": True,
            "pid": os.getpid(), "ttl_s": None, "idle_s": 12.0, "active_sequences": 0,
            "planned_bytes": model["plan"]["total_bytes"], "rss_bytes": 300 << 20}


def _wait_for_gate_file(path: str | None, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _watch_parent(pid: int) -> None:
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--saved-kv-gib", type=float)  # as `outrider serve`; nothing to save here
    parser.add_argument("--allow-any-path", action="store_true")  # the real one confines loads
    parser.add_argument("--token-delay", type=float, default=0.002)
    parser.add_argument("--metrics-interval", type=float, default=1.0)
    parser.add_argument("--load-delay", type=float, default=0.05)
    parser.add_argument("--gate-file", help="[[gate]] replies pause until this file exists")
    args = parser.parse_args(argv)
    state = State(args.token_delay, args.metrics_interval, args.load_delay, args.gate_file)
    handler = type("BoundHandler", (Handler,), {"state": state, "api_key": args.api_key})
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler)
    except OSError as exc:  # as `outrider serve` answers a port in use: one line, exit 2
        print(f"error: port {args.port} on {args.host} is already in use: {exc}", file=sys.stderr)
        return 2
    server.daemon_threads = True
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    host, port = server.server_address[:2]
    print("OUTRIDER_SERVER_READY " + json.dumps({"url": f"http://{host}:{port}", "pid": os.getpid()}),
          flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
