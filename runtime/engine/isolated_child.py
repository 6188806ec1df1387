"""The child's side of `runtime.engine.isolated.IsolatedEngine`: a command loop around one
real engine, and a pump per request that sends its events to the parent.

The messages, all tuples on one duplex pipe (`multiprocessing.Pipe`):

    parent → child   ("call", call_id, method, args)       a method of the engine
                     ("cancel", request_id)                 no answer
    child → parent   ("ret", call_id, value)                the method's result
                     ("err", call_id, (module, class, message))  what it raised
                     ("progress", call_id, fraction)        load's on_progress
                     ("events", request_id, [event, ...])   every event ready at once, in
                                                            order (`packed`)

Call 0 is the start: the child answers ("ret", 0, pid) once its engine has started. "stop"
stops the engine, waits for the pumps to send their last events, answers and exits.

Quick methods (status, metrics, submit ...) run on the loop's thread, so a status() answers
while a load or an embedding runs; the ones that block or may take a while (load, unload,
embed, render_chat) run on a small pool. The child ignores SIGINT — Ctrl-C in a terminal
reaches the whole process group, and the parent, not the child, decides what stops — and
exits when its pipe ends or its parent changes (the parent died).
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from runtime import errors
from runtime.engine.api import EngineAPI, RequestHandle
from runtime.errors import EngineError
from runtime.events import ErrorEvent, Event, Finished, TokenEvent

_INLINE = frozenset({"status", "metrics"})
_POOLED = frozenset({"load", "unload", "embed", "render_chat", "tokenize"})
_POOL_WORKERS = 8
_PARENT_CHECK_S = 1.0
_PUMP_JOIN_S = 5.0  # at stop: how long the last events may take to leave


def error_payload(exc: BaseException) -> tuple[str, str, str]:
    """What travels for an exception: its class (module and name) and its message."""
    return type(exc).__module__, type(exc).__qualname__, str(exc)


def rebuilt_error(module: str, name: str, message: str) -> BaseException:
    """The child's exception (`error_payload`) as the parent raises it: the same class (an
    Outrider error or a builtin one) with the same message; `EngineError` when the class
    cannot be rebuilt.

    >>> rebuilt_error("runtime.errors", "ModelNotFound", "no file at /m.gguf")
    ModelNotFound('no file at /m.gguf')
    >>> rebuilt_error("tests.fake", "Odd", "an odd failure")
    EngineError('an odd failure')
    """
    cls: Any = None
    if module == errors.__name__:
        cls = getattr(errors, name, None)
    elif module == builtins.__name__:
        cls = getattr(builtins, name, None)
    elif module.startswith("runtime."):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            cls = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # a class whose constructor wants more than a message
            pass
    return EngineError(message or name)


def packed(request_id: str, events: list[Event]) -> list[Any]:
    """Events as they travel: a TokenEvent (nearly all of them) as the tuple of its fields
    after the request id, which the message carries once — a pickle a third the size and
    a fifth the time of the dataclass's; every other event as it is."""
    return [(e.index, e.token_id, e.text, e.from_draft, e.logprob, e.top_logprobs)
            if type(e) is TokenEvent and e.request_id == request_id else e for e in events]


def unpacked(request_id: str, items: list[Any]) -> list[Event]:
    """`packed`'s inverse, on the parent's side."""
    return [TokenEvent(request_id, *item) if type(item) is tuple else item for item in items]


class _Child:
    def __init__(self, conn: Connection, engine: EngineAPI) -> None:
        self.conn = conn
        self.engine = engine
        self.send_lock = threading.Lock()
        self.pumps: dict[str, tuple[RequestHandle, threading.Thread]] = {}
        self.pumps_lock = threading.Lock()
        self.stopping = threading.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(_POOL_WORKERS,
                                                          thread_name_prefix="outrider-child")

    def send(self, message: tuple[Any, ...]) -> None:
        with self.send_lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the parent is gone: nobody to tell
                _exit(0)

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the parent died or closed the pipe
                _exit(0)
            if message[0] == "cancel":
                pump = self.pumps.get(message[1])
                if pump is not None:
                    pump[0].cancel()
                continue
            _, call_id, method, args = message
            if method == "stop":
                self.stop(call_id)
                return
            if method in _POOLED:
                self.pool.submit(self.call, call_id, method, args)
            else:
                self.call(call_id, method, args)

    def call(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            if method == "submit":
                self.submit(args[0])
                value: Any = None
            elif method == "load":
                settings, wants_progress = args
                on_progress: Callable[[float], None] | None = (
                    (lambda f: self.send(("progress", call_id, f))) if wants_progress else None)
                value = self.engine.load(settings, on_progress)
            elif method == "render_chat":
                messages, tools, extra = args
                value = self.engine.render_chat(messages, tools=tools, extra=extra)
            elif method == "tokenize":
                text, add_special, parse_special = args
                value = self.engine.tokenize(text, add_special=add_special,
                                             parse_special=parse_special)
            elif method in _INLINE or method in _POOLED:
                value = getattr(self.engine, method)(*args)
            else:
                raise ValueError(f"unknown engine method {method!r}")
        except BaseException as exc:  # every call is answered
            self.send(("err", call_id, error_payload(exc)))
            return
        self.send(("ret", call_id, value))

    def submit(self, request: Any) -> None:
        handle = self.engine.submit(request)
        thread = threading.Thread(target=self.pump, args=(handle, request.n), daemon=True,
                                  name=f"outrider-pump-{request.id}")
        with self.pumps_lock:
            self.pumps[request.id] = (handle, thread)
        thread.start()

    def pump(self, handle: RequestHandle, n: int) -> None:
        """Send the request's events as they come, every ready one in one message, until
        its last Finished or an ErrorEvent."""
        finished = 0
        try:
            while True:
                first = handle.get(1.0)
                if first is None:
                    if self.stopping.is_set():
                        return
                    continue
                batch: list[Event] = [first]
                while (event := handle.get(0)) is not None:
                    batch.append(event)
                ended = False
                for event in batch:
                    if isinstance(event, Finished):
                        finished += 1
                    ended = ended or isinstance(event, ErrorEvent) or finished >= n
                self.send(("events", handle.id, packed(handle.id, batch)))
                if ended:
                    return
        finally:
            with self.pumps_lock:
                if self.pumps.get(handle.id, (None,))[0] is handle:
                    del self.pumps[handle.id]

    def stop(self, call_id: int) -> None:
        try:
            self.engine.stop()  # every open request gets its last event
        except BaseException as exc:
            self.send(("err", call_id, error_payload(exc)))
        else:
            self.stopping.set()
            with self.pumps_lock:
                threads = [thread for _, thread in self.pumps.values()]
            for thread in threads:
                thread.join(_PUMP_JOIN_S)
            self.send(("ret", call_id, None))
        _exit(0)


def child_main(conn: Connection, factory: Callable[[], EngineAPI], parent_pid: int) -> None:
    """The child process: build and start the engine, answer call 0, then serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A llama.cpp abort here (a worker gone: its RPC client aborts) is reported by the parent;
    # ggml's own backtrace would first try to attach gdb, seconds the reply waits for.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    os.set_inheritable(conn.fileno(), False)  # spawn passed it inheritable: no grandchild gets it
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True,
                     name="outrider-parent-watch").start()
    try:
        engine = factory()
        engine.start()
    except BaseException as exc:
        conn.send(("err", 0, error_payload(exc)))
        _exit(1)
    child = _Child(conn, engine)
    child.send(("ret", 0, os.getpid()))
    child.serve()


def _watch_parent(parent_pid: int) -> None:
    """Exit once the parent is gone: its pid is no longer our parent's (we were re-parented)."""
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_CHECK_S)
    _exit(0)


def _exit(code: int) -> None:
    """Leave now: daemon threads and llama.cpp's objects go with the process, and nothing
    waits on a worker stuck in a call."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)
