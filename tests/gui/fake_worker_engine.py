"""The fake engine server (tests/gui/fake_server.py) with workers that fail, as the real one
reports it (docs/api.md): a load naming a worker of `--down` is refused with HTTP 400
`worker_unavailable`, and a reply to a message with `[[lose]]` loses the loaded model's first
worker after three tokens (`worker_lost`, the model unloaded with it). Every load's body is
appended to `--record` (one JSON line each), so a test can read what the app asked for.

    python -m tests.gui.fake_worker_engine --down 127.0.0.1:50053 --record loads.jsonl --port 0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from tests.gui.fake_server import Handler, State, _watch_parent, pieces_of


def unavailable(worker: str) -> str:
    return (f"worker {worker} cannot be reached (connection refused): start `outrider worker` "
            "there, or check the address")


def lost(worker: str, model: str) -> str:
    return (f"worker {worker} stopped answering (connection refused), and the model {model} "
            "was unloaded with it: start the worker again, or load the model without it")


class WorkerHandler(Handler):
    down: tuple[str, ...] = ()
    record: str = ""
    workers: list[str]  # of the model loaded (a class attribute: one per server)

    def _load(self, body: dict[str, Any]) -> None:
        with open(self.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(body) + "\n")
        workers = [str(w) for w in body.get("workers") or ()]
        bad = next((w for w in workers if w in self.down), None)
        if bad is not None:  # refused before anything loads, as the real planner's probe does
            self._json(400, {"error": {"message": unavailable(bad), "type": "invalid_request_error",
                                       "param": None, "code": "worker_unavailable"}})
            return
        self.workers[:] = workers
        super()._load(body)

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        model = self.state.model
        if "[[lose]]" not in str(user) or model is None or not self.workers:
            super()._chat(body)
            return
        self._start_stream()
        for i, piece in enumerate(pieces_of("Partly written before the worker went ")[:3]):
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
                     "outrider": {"token_ids": [100 + i]}}
            self._event(None, chunk)
        self.state.model = None  # the engine process aborted: the model is gone with it
        self._event(None, {"error": {"message": lost(self.workers[0], model["name"]),
                                     "type": "server_error", "param": None,
                                     "code": "worker_lost"}})
        self._end_stream()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--saved-kv-gib", type=float)
    parser.add_argument("--allow-any-path", action="store_true")
    parser.add_argument("--down", action="append", default=[], help="a worker that is down")
    parser.add_argument("--record", required=True, help="append each load's body here")
    args = parser.parse_args(argv)
    state = State(0.001, 0.1, 0.05)
    handler = type("BoundHandler", (WorkerHandler,),
                   {"state": state, "api_key": args.api_key, "down": tuple(args.down),
                    "record": args.record, "workers": []})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    host, port = server.server_address[:2]
    print("OUTRIDER_SERVER_READY " + json.dumps({"url": f"http://{host}:{port}",
                                                 "pid": os.getpid()}), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
