"""Results and reports from other threads, delivered safely on the GUI thread.

`on_result`: a background job's result, delivered to a page only while the page exists.

    job = services.on_disk(library.scan)
    on_result(job, self, self.show_models, lambda exc: self.status.setText(str(exc)))

A lambda connected straight to `job.done` would still run after its page was deleted (and
touch dead widgets); the outcome checks that the page still exists first.

`Inbox`: reports from plain Python threads (not QThreads), queued and handed over on the
GUI thread, so no Qt signal is ever emitted from a thread Qt does not know.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from app.qt import QtCore, Signal, isValid
from app.services.background import Job


class _Outcome:
    """One job's callbacks. Kept by the job (so alive exactly until its answer), never a child
    of the page: a page's Python side must not be collected, and its callbacks not cleared,
    while an answer for it is still on its way."""

    def __init__(self, owner: QtCore.QObject, done: Callable[[Any], Any] | None,
                 failed: Callable[[Any], Any] | None) -> None:
        self._owner: QtCore.QObject | None = owner
        self._done, self._failed = done, failed

    def _take(self, which: str) -> Callable[[Any], Any] | None:
        call = self._done if which == "done" else self._failed
        owner, self._owner, self._done, self._failed = self._owner, None, None, None
        # The page may have been deleted (closed) while the job ran: then say nothing.
        return call if owner is not None and isValid(owner) else None

    def on_done(self, value: object) -> None:
        call = self._take("done")
        if call is not None:
            call(value)

    def on_failed(self, exc: object) -> None:
        call = self._take("failed")
        if call is not None:
            call(exc)


def on_result(job: Job, owner: QtCore.QObject, done: Callable[[Any], Any] | None = None,
              failed: Callable[[Any], Any] | None = None) -> None:
    """Call `done(result)` or `failed(exception)` on the GUI thread when `job` ends, unless
    `owner` is gone by then (a late answer for a closed page is dropped, not a crash)."""
    outcome = _Outcome(owner, done, failed)
    job.outcome = outcome  # type: ignore[attr-defined]  # the runner keeps the job until it ends
    job.done.connect(outcome.on_done)
    job.failed.connect(outcome.on_failed)


class Inbox(QtCore.QObject):
    """Reports from plain Python threads (download workers, the quantizer's reader) brought to
    the GUI thread without touching Qt signals from those threads.

    `post(item)` may be called from any thread: it appends to a lock-protected list and, when
    the list was empty, posts one event (QCoreApplication.postEvent is thread-safe); the GUI
    thread then emits `received(item)` for each item, in order.

    Signals:
        received(object): one posted item, on the GUI thread.
    """

    received = Signal(object)
    _WAKE = QtCore.QEvent.Type(QtCore.QEvent.registerEventType())

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._closed = False

    def post(self, item: Any) -> None:
        with self._lock:
            if self._closed:
                return
            self._items.append(item)
            if len(self._items) > 1:
                return  # a wake-up is already on its way
        QtCore.QCoreApplication.postEvent(self, QtCore.QEvent(self._WAKE))

    def close(self) -> None:
        """Drop later posts (the owner is going away)."""
        with self._lock:
            self._closed = True
            self._items.clear()

    def event(self, event: QtCore.QEvent) -> bool:
        if event.type() != self._WAKE:
            return super().event(event)
        if "_lock" not in self.__dict__:  # a wake-up for a Python side already torn down
            return True
        with self._lock:
            items, self._items = self._items, []
        for item in items:
            self.received.emit(item)
        return True
