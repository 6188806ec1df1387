"""Streamed answers of the engine server, parsed as they arrive: a chat reply, a model load,
the metrics feed. Each wraps one `QNetworkReply`, turns its server-sent events into the
dataclasses of `app.engine.wire` and emits them as signals; `EngineClient` creates them.
"""

from __future__ import annotations

import collections
import json
import time

from app.engine.wire import (
    ReplyError,
    ReplyFinished,
    SseEvent,
    SseParser,
    TextDelta,
    WireError,
    parse_chat_chunk,
    parse_error_body,
    parse_metrics,
    parse_model,
)
from app.qt import QtCore, QtNetwork, Signal
from runtime.events import StepStats

_Req = QtNetwork.QNetworkRequest
_NetErr = QtNetwork.QNetworkReply.NetworkError
DRAIN_BUDGET_S = 0.008  # longest slice of stream handling between two event-loop turns
READ_CHUNK = 32 * 1024  # bytes parsed at a time, so one huge readyRead is no long stall
_NOT_ENDED = object()  # the stream is still open
_EOF = object()  # the stream closed normally


class _SseCall(QtCore.QObject):
    """One streamed HTTP answer, parsed as server-sent events while it arrives.

    Subclasses handle events in `_on_event` and the end in `_on_end`; each call ends once.
    Events are handled in slices of at most `DRAIN_BUDGET_S`, yielding to the event loop
    between slices: a fast engine can deliver hundreds of chunks in one `readyRead`, and
    handling them all at once would freeze the window. The end of the stream (or a lost
    connection) is handled after every event that arrived before it.
    """

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._reply: QtNetwork.QNetworkReply | None = None
        self._parser = SseParser()
        self._queue: collections.deque[SseEvent] = collections.deque()
        self._end_after: object = _NOT_ENDED  # or _EOF, or the ReplyError to end with
        self._drain_timer = QtCore.QTimer(self, singleShot=True, interval=0)
        self._drain_timer.timeout.connect(self._drain)
        self._error_body = b""
        self._done = False
        self._cancelled = False

    def attach(self, reply: QtNetwork.QNetworkReply) -> None:
        self._reply = reply
        reply.readyRead.connect(self._on_ready_read)
        reply.finished.connect(self._on_finished)

    def cancel(self) -> None:
        """Stop listening; the server notices the closed connection and stops the work."""
        self._cancelled = True
        if self._reply is not None and not self._done:
            self._reply.abort()
        elif self._reply is None:
            self._end(None)

    def _status(self) -> int:
        if self._reply is None:
            return 0
        value = self._reply.attribute(_Req.Attribute.HttpStatusCodeAttribute)
        return int(value) if value is not None else 0

    def _on_ready_read(self) -> None:
        reply = self._reply
        if reply is None or self._done:
            return
        if self._status() >= 400:
            self._error_body += bytes(reply.readAll().data())
            return
        if not self._drain_timer.isActive():
            self._drain()

    def _read_some(self) -> bool:
        """Parse the next piece of what has arrived; False when nothing is waiting."""
        reply = self._reply
        if reply is None or reply.bytesAvailable() <= 0 or self._status() >= 400:
            return False
        self._queue.extend(self._parser.feed(bytes(reply.read(READ_CHUNK).data())))
        return True

    def _drain(self) -> None:
        deadline = time.perf_counter() + DRAIN_BUDGET_S
        while not self._done and (self._queue or self._read_some()):
            if not self._queue:
                continue
            event = self._queue.popleft()
            try:
                self._on_event(event)
            except (WireError, ValueError, KeyError, TypeError) as exc:
                self._end(ReplyError("ProtocolError", f"The engine sent something unreadable: {exc}"))
            more = self._queue or (self._reply is not None and self._reply.bytesAvailable() > 0)
            if more and time.perf_counter() > deadline:
                self._drain_timer.start()
                return
        if not self._queue and not self._done and self._end_after is not _NOT_ENDED:
            if isinstance(self._end_after, ReplyError):
                self._end(self._end_after)
            else:
                self._on_eof()

    def _on_finished(self) -> None:
        reply = self._reply
        if reply is None:
            return
        if not self._done:
            if self._cancelled:
                self._end(None)
            elif self._status() >= 400:
                self._error_body += bytes(reply.readAll().data())
                self._end(parse_error_body(self._error_body, self._status()))
            else:
                failed = reply.error() != _NetErr.NoError
                self._end_after = _network_error(reply) if failed else _EOF
                # What arrived before the end is still handled, in slices, before the end.
                self._queue.extend(self._parser.feed(bytes(reply.readAll().data())))
        reply.deleteLater()
        self._reply = None
        self._drain()

    def _end(self, error: ReplyError | None) -> None:
        if self._done:
            return
        self._done = True
        self._queue.clear()
        self._drain_timer.stop()
        self._on_end(error)
        if self._reply is not None and not self._reply.isFinished():
            self._reply.abort()

    # -- for subclasses ----------------------------------------------------------------

    def _on_event(self, event: SseEvent) -> None:
        raise NotImplementedError

    def _on_eof(self) -> None:
        self._end(ReplyError("ConnectionLost", "The engine closed the stream before it ended."))

    def _on_end(self, error: ReplyError | None) -> None:
        raise NotImplementedError


def _network_error(reply: QtNetwork.QNetworkReply) -> ReplyError:
    code = reply.error()
    if code in (_NetErr.RemoteHostClosedError, _NetErr.ConnectionRefusedError):
        return ReplyError("ConnectionLost", "Lost the connection to the engine.")
    return ReplyError("NetworkError", reply.errorString())


class ReplyStream(_SseCall):
    """A streaming chat completion.

    Signals:
        delta(TextDelta): new text (and its tokens) as it arrives.
        step(StepStats): speculative statistics of a round.
        finished(ReplyFinished): the reply ended (stop, length, or cancelled by `cancel()`).
        errored(ReplyError): the request failed; emitted instead of `finished`.
    """

    delta = Signal(object)
    step = Signal(object)
    finished = Signal(object)
    errored = Signal(object)

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._result: ReplyFinished | None = None

    def _on_event(self, event: SseEvent) -> None:
        if event.data.strip() == "[DONE]":
            self._end(None)
            return
        payload = json.loads(event.data)
        if isinstance(payload, dict) and "error" in payload:
            self._end(parse_error_body(event.data.encode(), 500))
            return
        for item in parse_chat_chunk(payload):
            if isinstance(item, TextDelta):
                self.delta.emit(item)
            elif isinstance(item, StepStats):
                self.step.emit(item)
            else:
                self._result = item
        if self._result is not None:
            self._end(None)

    def _on_end(self, error: ReplyError | None) -> None:
        if error is not None:
            self.errored.emit(error)
        elif self._result is not None:
            self.finished.emit(self._result)
        elif self._cancelled:
            self.finished.emit(ReplyFinished("cancelled"))
        else:
            self.errored.emit(ReplyError("ConnectionLost", "The reply ended without finishing."))


class LoadJob(_SseCall):
    """A model load (`POST /api/load`).

    Signals:
        plan(dict): the memory plan, before loading starts.
        progress(float): 0.0 … 1.0 while loading.
        loaded(ServedModel): done; `plan` and `measured` filled for planned-vs-measured.
        failed(ReplyError): the load failed or the engine went away.
    """

    plan = Signal(object)
    progress = Signal(float)
    loaded = Signal(object)
    failed = Signal(object)

    def _on_event(self, event: SseEvent) -> None:
        data = json.loads(event.data) if event.data else {}
        if event.event == "plan":
            self.plan.emit(data)
        elif event.event == "progress":
            self.progress.emit(float(data.get("fraction", 0.0)))
        elif event.event == "loaded":
            model = parse_model(data.get("model"), data.get("plan"), data.get("measured"))
            if model is None:
                raise WireError("loaded event without a model")
            self._model = model
            self._end(None)
        elif event.event == "error":
            kind = str(data.get("kind", "LoadError"))
            self._end(ReplyError(kind, str(data.get("message", "the model did not load")),
                                 str(data.get("code") or "")))

    def _on_end(self, error: ReplyError | None) -> None:
        model = getattr(self, "_model", None)
        if error is None and model is not None:
            self.loaded.emit(model)
        else:
            self.failed.emit(error or ReplyError("LoadCancelled", "Loading was cancelled."))


class MetricsFeed(_SseCall):
    """`GET /api/metrics/stream`. Signals: snapshot(MetricsSnapshot), ended()."""

    snapshot = Signal(object)
    ended = Signal()

    def _on_event(self, event: SseEvent) -> None:
        if event.event == "metrics":
            self.snapshot.emit(parse_metrics(json.loads(event.data)))

    def _on_end(self, error: ReplyError | None) -> None:
        self.ended.emit()
