"""The fake engine server (tests/gui/fake_server.py) with what attachments need: a model's
capabilities ("vision" when its file name says so, with a projector and `IMAGE_TOKENS` per
image), `/v1/embeddings` answered with deterministic bag-of-words vectors (texts sharing
words point the same way; an input holding `[[noembed]]` is refused as a model that cannot
embed would be), `/tokenize` counting one token per word (`fake_tokens`; a text holding
`[[notokenize]]` is answered with a 500, one holding `[[gate]]` only once the --gate-file
exists), and every chat request body recorded, one JSON line each, in `--record-file`, so
tests assert what went to the engine.

    python -m tests.gui.fake_media_server --record-file /tmp/requests.jsonl --port 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.gui import fake_server

DIMENSIONS = 64
IMAGE_TOKENS = 600  # what the fake projector makes of one image
PROJECTOR = "mmproj-vision-model-f16.gguf"


def fake_tokens(text: str) -> list[int]:
    """The fake tokenizer: one token per whitespace-separated word (the estimate is
    characters / 4, so the two differ).

    >>> text = "Flour, milk, two eggs."
    >>> len(fake_tokens(text)), len(text) / 4
    (4, 5.5)
    """
    return [int(hashlib.md5(word.encode()).hexdigest()[:4], 16) for word in text.split()]


def embedding(text: str) -> list[float]:
    """A unit vector counting `text`'s words into `DIMENSIONS` hashed buckets.

    >>> a, b = embedding("zebras eat grass"), embedding("what do zebras eat?")
    >>> round(sum(x * y for x, y in zip(a, b)), 2) > 0.5
    True
    """
    vector = [0.0] * DIMENSIONS
    for word in re.findall(r"[a-z]{3,}", text.lower()):
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIMENSIONS] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def flat_text(content: Any) -> str:
    """A message's content as text, content parts included (images as "[image]")."""
    if isinstance(content, str):
        return content
    parts = content or []
    return " ".join(p.get("text", "") if p.get("type") == "text" else "[image]" for p in parts)


class MediaHandler(fake_server.Handler):
    record_file: str = ""
    record_lock = threading.Lock()

    def do_POST(self) -> None:
        if self.path == "/tokenize" and self._authorized():
            self._tokenize(self._body())
            return
        if self.path == "/v1/embeddings" and self._authorized():
            body = self._body()
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            if any("[[noembed]]" in t for t in texts):
                self._json(400, {"error": {"message": "fake-model cannot make embeddings",
                                           "type": "invalid_request_error",
                                           "code": "embeddings_unsupported"}})
                return
            self._json(200, {"object": "list", "model": body.get("model", ""),
                             "data": [{"object": "embedding", "index": i,
                                       "embedding": embedding(t)} for i, t in enumerate(texts)],
                             "usage": {"prompt_tokens": 0, "total_tokens": 0}})
            return
        super().do_POST()

    def _tokenize(self, body: dict[str, Any]) -> None:
        content = str(body.get("content", ""))
        if self.state.model is None:
            self._json(400, {"error": {"message": "No model is loaded.", "type":
                                       "invalid_request_error", "code": "no_model"}})
            return
        if "[[notokenize]]" in content:
            self._json(500, {"error": {"message": "the tokenizer broke", "type": "server_error"}})
            return
        if "[[gate]]" in content:
            fake_server._wait_for_gate_file(self.state.gate_file)
        tokens = fake_tokens(content)
        self._json(200, {"tokens": tokens, "count": len(tokens),
                         "model": body.get("model") or self.state.model["name"]})

    def _event(self, name: str | None, data: Any) -> None:
        if name == "loaded":  # the model as the real server describes it: with capabilities
            model = data["model"]
            vision = "vision" in Path(str(model.get("path", ""))).name
            model["capabilities"] = ["structured_output", "embeddings", *(["vision"] * vision)]
            model["projector"] = PROJECTOR if vision else None
            model["image_tokens"] = IMAGE_TOKENS if vision else None
        super()._event(name, data)

    def _chat(self, body: dict[str, Any]) -> None:
        if self.record_file:
            with self.record_lock, open(self.record_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(body) + "\n")
        flat = dict(body, messages=[dict(m, content=flat_text(m.get("content")))
                                    for m in body.get("messages") or []])
        super()._chat(flat)


def main(argv: list[str] | None = None) -> int:
    """As `fake_server.main`, with `--record-file` and the handler above."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--saved-kv-gib", type=float)
    parser.add_argument("--allow-any-path", action="store_true")
    parser.add_argument("--token-delay", type=float, default=0.001)
    parser.add_argument("--metrics-interval", type=float, default=0.1)
    parser.add_argument("--load-delay", type=float, default=0.05)
    parser.add_argument("--record-file", default="")
    parser.add_argument("--gate-file")
    args = parser.parse_args(argv)
    state = fake_server.State(args.token_delay, args.metrics_interval, args.load_delay,
                              args.gate_file)
    handler = type("BoundMediaHandler", (MediaHandler,),
                   {"state": state, "api_key": args.api_key, "record_file": args.record_file})
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler)
    except OSError as exc:  # as `outrider serve` answers a port in use: one line, exit 2
        print(f"error: port {args.port} on {args.host} is already in use: {exc}", file=sys.stderr)
        return 2
    server.daemon_threads = True
    if args.parent_pid:
        threading.Thread(target=fake_server._watch_parent, args=(args.parent_pid,),
                         daemon=True).start()
    host, port = server.server_address[:2]
    print("OUTRIDER_SERVER_READY " + json.dumps({"url": f"http://{host}:{port}", "pid": os.getpid()}),
          flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
