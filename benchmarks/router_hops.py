"""Where a warm streamed request's time to first token goes, hop by hop, through the server
and its engine process (the table under "Models on demand" in docs/benchmarks.md).

    .venv/bin/python benchmarks/router_hops.py [--model M] [--requests 30]

The server runs in this process (uvicorn in a thread, an `IsolatedEngine` child as
`outrider serve` makes it) and a kept httpx connection asks for 1-token replies of one short
chat. Timestamps are taken with `time.perf_counter` — CLOCK_MONOTONIC, one clock for both
processes — in the parent by wrapping the engine's `submit`, the link's delivery, the
bridge and the ASGI send, and in the child by an engine factory (`child_engine`, pickled by
reference) that wraps the child's message loop, the engine's submit, preparation and
admission, and the pump; the child writes its marks to a file when a request finishes.
Prints the p50 of each hop over the requests after 5 unmeasured ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARKS_FILE = Path(os.environ.get("OUTRIDER_HOPS_FILE", tempfile.gettempdir())) / "hops.jsonl"
ORDER = ["asgi", "p_submit", "c_recv", "c_engine_submit", "c_prep_start", "c_prep_posted",
         "c_admit", "c_admitted", "c_pump_got", "c_events_sent", "p_delivered",
         "p_bridge_put", "p_sent"]


def child_engine() -> Any:
    """The engine factory the child runs: `build_engine`, with its hops timestamped."""
    import runtime.engine.isolated_child as child  # child process: patched here, not in the parent
    from runtime.engine.build import build_engine
    from runtime.events import Finished, TokenEvent

    marks: dict[str, dict[str, float]] = {}

    def mark(rid: str, name: str) -> None:
        marks.setdefault(rid, {}).setdefault(name, time.perf_counter())

    call, pump, send = child._Child.call, child._Child.pump, child._Child.send

    def timed_call(self: Any, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        if method == "submit":
            mark(args[0].id, "c_recv")
        call(self, call_id, method, args)

    def timed_pump(self: Any, handle: Any, n: int) -> None:
        get = handle.get

        def timed_get(timeout: float | None = None) -> Any:
            event = get(timeout)
            if isinstance(event, TokenEvent):
                mark(event.request_id, "c_pump_got")
            return event

        handle.get = timed_get
        pump(self, handle, n)

    def timed_send(self: Any, message: tuple[Any, ...]) -> None:
        send(self, message)
        if message[0] == "events":
            mark(message[1], "c_events_sent")
            if any(type(item) is Finished for item in message[2]):
                with MARKS_FILE.open("a") as out:
                    out.write(json.dumps({"id": message[1], **marks.pop(message[1], {})}) + "\n")

    child._Child.call, child._Child.pump, child._Child.send = timed_call, timed_pump, timed_send  # type: ignore[method-assign]
    engine = build_engine(None)
    submit_now, prepare, admit_now = engine._submit_now, engine._prepare, engine._admit_now

    def timed_submit(request: Any, handle: Any) -> None:
        mark(request.id, "c_engine_submit")
        submit_now(request, handle)

    def timed_prepare(loaded: Any, request: Any, handle: Any) -> None:
        mark(request.id, "c_prep_start")
        prepare(loaded, request, handle)
        mark(request.id, "c_prep_posted")

    def timed_admit(prepared: Any) -> None:
        mark(prepared.request.id, "c_admit")
        admit_now(prepared)
        mark(prepared.request.id, "c_admitted")

    engine._submit_now, engine._prepare, engine._admit_now = (timed_submit, timed_prepare,  # type: ignore[method-assign]
                                                              timed_admit)
    return engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()

    from runtime.openmp import prepare_engine_process  # the engine's environment first

    prepare_engine_process()
    import httpx
    import uvicorn

    import runtime.engine.isolated_link as link
    from runtime.engine.isolated import IsolatedEngine
    from runtime.events import TokenEvent
    from runtime.library.default_model import default_model_path
    from runtime.server import ServerLimits, create_app, sse
    from runtime.settings.load import LoadSettings

    model = args.model or default_model_path()
    MARKS_FILE.unlink(missing_ok=True)
    from benchmarks.router_hops import child_engine as factory  # picklable by its module name

    engine = IsolatedEngine(factory)
    engine.start()
    engine.load(LoadSettings(model_path=model, n_parallel=4))
    marks: dict[str, dict[str, float]] = {}

    def mark(rid: str, name: str) -> None:
        marks.setdefault(rid, {}).setdefault(name, time.perf_counter())

    deliver, put, submit = link.IsolatedHandle._deliver, sse.EventBridge._put, engine.submit

    def timed_deliver(self: Any, events: Any) -> bool:
        if any(isinstance(e, TokenEvent) for e in events):
            mark(self.id, "p_delivered")
        return deliver(self, events)

    def timed_put(self: Any, item: Any) -> None:
        if isinstance(item, TokenEvent):
            mark(item.request_id, "p_bridge_put")
        put(self, item)

    current: dict[str, Any] = {}

    def timed_submit(request: Any) -> Any:
        mark(request.id, "p_submit")
        current["id"] = request.id
        return submit(request)

    link.IsolatedHandle._deliver, sse.EventBridge._put = timed_deliver, timed_put  # type: ignore[method-assign]
    engine.submit = timed_submit  # type: ignore[method-assign]

    class Marks:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or not scope["path"].startswith("/v1/chat"):
                await self.app(scope, receive, send)
                return
            current["asgi"] = time.perf_counter()

            async def timed(message: Any) -> None:
                if (message["type"] == "http.response.body" and b'"content"' in
                        message.get("body", b"") and "id" in current):
                    mark(current["id"], "p_sent")
                await send(message)

            await self.app(scope, receive, timed)

    app = create_app(engine, api_key="k", models_dir=model.parent, limits=ServerLimits(),
                     allowed_models=[model])
    app.add_middleware(Marks)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 1,
            "temperature": 0, "stream": True}
    asgi: dict[str, float] = {}
    with httpx.Client() as client:
        for _ in range(args.requests + 5):
            current.clear()
            with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                               json=body, headers={"Authorization": "Bearer k"}) as reply:
                for _line in reply.iter_lines():
                    pass
            asgi[current["id"]] = current["asgi"]
    time.sleep(0.5)
    server.should_exit = True
    engine.stop()
    child = {row["id"]: row for row in map(json.loads, MARKS_FILE.read_text().splitlines())}
    rows = []
    for rid, parent in marks.items():
        seen = {**parent, **child.get(rid, {}), "asgi": asgi.get(rid)}
        if all(seen.get(name) is not None for name in ORDER):
            rows.append([seen[b] - seen[a] for a, b in pairwise(ORDER)])
    for (a, b), hop in zip(pairwise(ORDER), zip(*rows[5:], strict=True), strict=True):
        print(f"{a:16s} -> {b:16s} {statistics.median(hop) * 1e3:7.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
