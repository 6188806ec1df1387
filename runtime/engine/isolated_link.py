"""The parent's end of an `IsolatedEngine`'s pipe: `ChildLink` sends calls and waits for
their answers, its reader thread hands each answer to its caller and each batch of events
to its request's `IsolatedHandle`, and when the child dies it answers everything still
open with `EngineCrashed` (the messages: `runtime.engine.isolated_child`).

    link = ChildLink(process, conn, "engine")   # a started process and the parent's end
    link.reader.start(); link.watcher.start()
    link.wait(link.pending[0])                  # call 0: the child's engine has started
    link.call("status")                         # EngineStatus(...)
    handle = link.open_handle(request)          # its events arrive as the child sends them
    os.kill(process.pid, signal.SIGKILL)
    handle.get(5)                               # ErrorEvent(id, "EngineCrashed", "the engine
                                                #   process of engine stopped (signal 9,
                                                #   SIGKILL); the next request loads it again")
    link.call("status")                         # raises EngineCrashed, and so does every call

Thread-safe: one lock around the pipe's writes (a message is pickled before it is taken),
one around the tables of waiting calls and open handles.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from runtime.engine.handle import EventQueueHandle
from runtime.engine.isolated_child import rebuilt_error, unpacked
from runtime.errors import (
    EngineCrashed,
    NoModelLoaded,
    OutriderError,
    SettingsError,
    WorkerError,
    WorkerLost,
    shown,
)
from runtime.events import ErrorEvent, Event, Finished, GenerationRequest
from runtime.planner.workers import probe_worker

_WATCH_S = 0.5  # how often a waiting caller checks that the reader still runs
REAP_S = 2.0  # after its pipe ended: how long the child may take to exit before it is killed
LOST_WORKER_TIMEOUT_S = 1.0  # after a crash, per worker: does it still answer?


class IsolatedHandle(EventQueueHandle):
    """The caller's end of one request in the child: `EventQueueHandle`, filled by the reader
    thread from the child's batches of events."""

    def __init__(self, request_id: str, n: int, cancel: Callable[[str], None]) -> None:
        super().__init__(request_id, n, cancel)
        self._delivered = 0  # Finished events handed in by the reader
        self._closed = False  # the reader has handed in the last event

    def _deliver(self, events: Sequence[Event]) -> bool:
        """Reader thread: queue `events`; True once the last one is in (nothing follows it)."""
        for event in events:
            if self._closed:
                break
            self._queue.put(event)
            if isinstance(event, Finished):
                self._delivered += 1
                self._closed = self._delivered >= self._n
            elif isinstance(event, ErrorEvent):
                self._closed = True
        return self._closed


class ChildLink:
    """One child process and everything that talks to it; dead for good once it ends."""

    def __init__(self, process: Any, conn: Connection, name: str) -> None:
        self.process = process
        self.conn = conn
        self.name = name
        self.model_name: str | None = None  # the model it holds, for the crash message
        self.workers: tuple[str, ...] = ()  # the workers holding part of it (a crash asks them)
        self.lost_worker: str | None = None
        self.lock = threading.Lock()  # pending, handles, dead
        self.send_lock = threading.Lock()
        self.ids = itertools.count(1)
        self.pending: dict[int, queue.SimpleQueue[tuple[str, Any]]] = {0: queue.SimpleQueue()}
        self.handles: dict[str, IsolatedHandle] = {}
        self.stopping = False
        self.dead: str | None = None  # why it ended
        self.crashed = False
        self.reader = threading.Thread(target=self._read, daemon=True,
                                       name=f"outrider-{name}-reader")
        self.watcher = threading.Thread(target=self._watch, daemon=True,
                                        name=f"outrider-{name}-watcher")

    def dead_error(self) -> OutriderError:
        if self.crashed and self.lost_worker is not None:
            return WorkerLost(self.dead or "a worker stopped answering", self.lost_worker)
        if self.crashed:
            return EngineCrashed(self.dead or "the engine process stopped")
        return NoModelLoaded(self.dead or "the engine stopped")

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise SettingsError(f"{message[2] if message[0] == 'call' else message[0]}: its "
                                f"arguments cannot be sent to the engine process ({exc})") from None
        try:
            with self.send_lock:
                self.conn.send_bytes(data)
        except (OSError, ValueError):  # the child is gone: the reader is about to say how
            self.reader.join(REAP_S + 1.0)
            raise self.dead_error() from None

    def call(self, method: str, *args: Any, on_progress: Callable[[float], None] | None = None,
             timeout: float | None = None) -> Any:
        answers: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        with self.lock:
            if self.dead is not None:
                raise self.dead_error()
            call_id = next(self.ids)
            self.pending[call_id] = answers
        try:
            self.send(("call", call_id, method, args))
        except BaseException:
            with self.lock:
                self.pending.pop(call_id, None)
            raise
        return self.wait(answers, on_progress, timeout)

    def wait(self, answers: queue.SimpleQueue[tuple[str, Any]],
             on_progress: Callable[[float], None] | None = None,
             timeout: float | None = None) -> Any:
        """The call's answer; its progress goes to `on_progress` on the caller's thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                kind, value = answers.get(timeout=_WATCH_S)
            except queue.Empty:
                if not self.reader.is_alive() and answers.empty():
                    raise self.dead_error() from None
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the engine process of {shown(self.model_name or self.name)}"
                                       f" did not answer within {timeout:.0f} s") from None
                continue
            if kind == "progress":
                if on_progress is not None:
                    on_progress(value)
                continue
            if kind == "ret":
                return value
            raise value

    def open_handle(self, request: GenerationRequest) -> IsolatedHandle:
        handle = IsolatedHandle(request.id, request.n, self.cancel)
        with self.lock:
            if self.dead is not None:
                raise self.dead_error()
            if request.id in self.handles:
                handle._deliver([ErrorEvent(request.id, "SettingsError",
                                            f"a request with id {request.id!r} is already running")])
                return handle
            self.handles[request.id] = handle
        try:
            self.call("submit", request)
        except BaseException:
            with self.lock:
                if self.handles.get(request.id) is handle:
                    del self.handles[request.id]
            raise
        return handle

    def cancel(self, request_id: str) -> None:
        if self.dead is None:
            with contextlib.suppress(OutriderError):  # died: the handle has its ErrorEvent
                self.send(("cancel", request_id))

    # ---- the reader thread ---------------------------------------------------------------------

    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):  # the child's end closed: it exited or was killed
                    return
                self._dispatch(message)
        finally:
            self._end()

    def _watch(self) -> None:
        """The backstop: once the process has exited its pipe must end within `REAP_S`.
        If it does not (a grandchild forked without exec holds the child's end), shut the
        socket down so the reader wakes. Not in the reader's loop: a select per message
        costs more than the rest of its reading."""
        wait([self.process.sentinel])
        self.reader.join(REAP_S)
        if self.reader.is_alive():
            with contextlib.suppress(OSError, ValueError), \
                    socket.socket(fileno=os.dup(self.conn.fileno())) as end:
                end.shutdown(socket.SHUT_RDWR)

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "events":
            handle = self.handles.get(message[1])
            if handle is not None and handle._deliver(unpacked(message[1], message[2])):
                with self.lock:
                    if self.handles.get(message[1]) is handle:
                        del self.handles[message[1]]
            return
        call_id, value = message[1], message[2]
        with self.lock:
            answers = self.pending.get(call_id) if kind == "progress" else self.pending.pop(call_id, None)
        if answers is not None:
            answers.put((kind, rebuilt_error(*value) if kind == "err" else value))

    def _end(self) -> None:
        """The child is gone (or going): reap it, then answer every waiting call and end
        every open handle."""
        self.process.join(REAP_S)
        if self.process.exitcode is None:  # its pipe ended but it lives on: end it
            self.process.kill()
            self.process.join(REAP_S)
        crashed = not self.stopping
        lost = lost_worker(self.workers) if crashed and self.workers else None
        with self.lock:
            self.crashed = crashed
            self.lost_worker = lost[0] if lost else None
            if lost:
                self.dead = (f"worker {lost[0]} stopped answering ({lost[1]}), and the model "
                             f"{shown(self.model_name or self.name)} was unloaded with it: "
                             "start the worker again, or load the model without it")
            else:
                self.dead = (crash_message(self.model_name or self.name, self.process.exitcode)
                             if crashed else "the engine stopped")
            pending, self.pending = list(self.pending.values()), {}
            handles, self.handles = list(self.handles.values()), {}
        kind = ("WorkerLost" if lost else "EngineCrashed") if crashed else "NoModelLoaded"
        for answers in pending:
            answers.put(("err", self.dead_error()))
        for handle in handles:
            handle._deliver([ErrorEvent(handle.id, kind, self.dead)])
        self.conn.close()


def lost_worker(workers: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of `workers` that no longer answers, and why, asked after an engine process
    holding part of a model on them died (llama.cpp's RPC client aborts its process when a
    worker's connection breaks). None: every worker answers, the crash was something else."""
    for endpoint in workers:
        try:
            probe_worker(endpoint, timeout_s=LOST_WORKER_TIMEOUT_S)
        except WorkerError as exc:
            text = str(exc)
            if "cannot be reached (" in text:  # "... (connection refused): start ..."
                return endpoint, text.split("(", 1)[1].split(")", 1)[0]
            return endpoint, f"no answer within {LOST_WORKER_TIMEOUT_S:g} s"
    return None


def crash_message(model: str, exitcode: int | None) -> str:
    """What a person is told when the process died.

    >>> crash_message("tiny-target", -9)
    'the engine process of tiny-target stopped (signal 9, SIGKILL); the next request loads it again'
    """
    return (f"the engine process of {shown(model)} stopped ({how_it_ended(exitcode)}); "
            f"the next request loads it again")


def how_it_ended(exitcode: int | None) -> str:
    """A process's end in words: "signal 9, SIGKILL", "exit code 1"."""
    if exitcode is None:
        return "its pipe closed"
    if exitcode < 0:
        try:
            return f"signal {-exitcode}, {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
