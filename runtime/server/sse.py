"""Server-sent events, and the bridge from the engine's blocking handles into asyncio.

The engine hands out a `RequestHandle` whose `get(timeout)` blocks. An `EventBridge` gives it
one small thread that forwards events onto the event loop, so the loop never blocks and a
burst of events (a speculative round accepting 4 tokens) arrives as one batch:

    bridge = EventBridge(handle, n_choices=1, poll_s=0.2)
    bridge.start()
    try:
        while not bridge.done:
            for event in await bridge.next_batch():
                ...
    finally:
        bridge.close()          # cancels the request if it has not finished: frees its cells

`DisconnectAwareStreamingResponse` cancels its body iterator the moment the client goes away,
so `close()` in the iterator's `finally` runs at once, not after the whole reply was generated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from runtime.engine.api import RequestHandle
from runtime.events import ErrorEvent, Event, Finished

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_DONE = b"data: [DONE]\n\n"


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sse_data(data: Any) -> bytes:
    """One anonymous SSE message: `data: {...}` and a blank line."""
    return f"data: {_dumps(data)}\n\n".encode()


def sse_event(name: str, data: Any) -> bytes:
    """One named SSE message: `event: NAME`, `data: {...}`, a blank line."""
    return f"event: {name}\ndata: {_dumps(data)}\n\n".encode()


_END = object()


class EventBridge:
    """Carries one request's events from the engine's blocking handle onto the event loop."""

    def __init__(self, handle: RequestHandle, n_choices: int, poll_s: float = 0.2) -> None:
        self.handle = handle
        self._n = n_choices
        self._poll_s = poll_s
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = threading.Event()
        self._complete = threading.Event()  # the engine said its last word
        self._done = False
        self._thread = threading.Thread(target=self._pump, name=f"sse-{handle.id}", daemon=True)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    @property
    def done(self) -> bool:
        """True once the last batch has been handed out."""
        return self._done

    @property
    def complete(self) -> bool:
        """True when the engine finished every choice or reported an error."""
        return self._complete.is_set()

    async def next_batch(self) -> list[Event]:
        """The events that arrived since the last call, waiting for at least one.
        Empty when the stream has ended (then `done` is True)."""
        if self._done:
            return []
        batch: list[Event] = []
        item = await self._queue.get()
        while True:
            if item is _END:
                self._done = True
                break
            batch.append(item)
            if self._queue.empty():
                break
            item = self._queue.get_nowait()
        return batch

    def close(self) -> None:
        """Stop forwarding; cancel the request if the engine has not finished it."""
        if not self._closed.is_set():
            self._closed.set()
            if not self._complete.is_set():
                try:
                    self.handle.cancel()
                except Exception:  # a failing cancel must not hide the original error
                    log.exception("cancelling %s failed", self.handle.id)

    def _pump(self) -> None:
        finished: set[int] = set()
        try:
            while not self._closed.is_set():
                try:
                    event = self.handle.get(timeout=self._poll_s)
                except Exception as exc:  # the handle broke: say so instead of hanging
                    log.exception("engine handle %s failed", self.handle.id)
                    event = ErrorEvent(self.handle.id, type(exc).__name__, str(exc))
                if event is None:
                    continue
                if isinstance(event, Finished):
                    finished.add(event.index)
                if isinstance(event, ErrorEvent) or len(finished) >= self._n:
                    self._complete.set()
                self._put(event)
                if self._complete.is_set():
                    break
        finally:
            self._put(_END)

    def _put(self, item: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop shut down between the check and the call
            self._closed.set()


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class DisconnectAwareStreamingResponse(StreamingResponse):
    """A `StreamingResponse` that always watches for the client leaving and then cancels the
    body iterator (Starlette does so only for servers speaking ASGI spec < 2.4). `on_close`
    runs however the response ends, even if the body iterator never started."""

    def __init__(self, content: Any, *, on_close: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def run_then_cancel(func: Callable[[], Awaitable[None]]) -> None:
                    with contextlib.suppress(OSError):  # the socket went away mid-write
                        await func()
                    group.cancel_scope.cancel()

                group.start_soon(run_then_cancel, partial(self.stream_response, send))
                await run_then_cancel(partial(wait_for_disconnect, receive))
        finally:
            if self._on_close is not None:
                self._on_close()
        if self.background is not None:
            await self.background()


def sse_response(body: Any, on_close: Callable[[], None] | None = None,
                 ) -> DisconnectAwareStreamingResponse:
    return DisconnectAwareStreamingResponse(body, media_type="text/event-stream",
                                            headers=SSE_HEADERS, on_close=on_close)
