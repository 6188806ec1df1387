"""Reports from plain Python threads, handed over on the GUI thread.

    inbox = Inbox(parent=page)
    inbox.received.connect(page.show_progress)
    threading.Thread(target=download, args=(inbox.post,)).start()   # post from any thread

`post(item)` appends to a locked list and, when the list was empty, rings a doorbell: a Qt
signal emitted on the posting thread and delivered to the GUI thread through a queued
connection, which Qt documents as thread-safe. The GUI thread then takes the whole list and
emits `received(item)` for each item, in order.

Nothing made in Python crosses the thread: the queued call is an event Qt creates and deletes
itself (a Python-made `QEvent` handed to `postEvent` is owned by two heaps at once). The lock
also closes the inbox: `close()`, and the destruction of the inbox's C++ object, take it before
anything is torn down, so a thread that posts late finds the inbox closed and touches no Qt
object at all.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from app.qt import QtCore, Signal, Slot


class _Doorbell(QtCore.QObject):
    """Rung on any thread; its queued connection runs the inbox's delivery on the GUI thread."""

    rang = Signal()


class _Mailbox:
    """The items between the posting threads and the GUI thread; plain Python, so a posting
    thread that outlives the inbox holds no Qt object."""

    def __init__(self, doorbell: _Doorbell) -> None:
        self._lock = threading.Lock()
        self._doorbell: _Doorbell | None = doorbell
        self._items: list[Any] = []

    def post(self, item: Any) -> None:
        with self._lock:
            if self._doorbell is None:
                return  # closed: dropped
            self._items.append(item)
            if len(self._items) == 1:  # otherwise a ring is already on its way
                # Under the lock, so closing (which takes it) waits until the ring is out.
                # RuntimeError: PySide has already let go of the doorbell, as the inbox's C++
                # object is being deleted on the GUI thread; nobody will receive the item.
                with contextlib.suppress(RuntimeError):
                    self._doorbell.rang.emit()

    def take(self) -> list[Any]:
        with self._lock:
            items, self._items = self._items, []
        return items

    def close(self) -> None:
        with self._lock:
            self._doorbell = None
            self._items.clear()


class Inbox(QtCore.QObject):
    """Items posted from any thread, received on the GUI thread in order.

    Signals:
        received(object): one posted item, on the GUI thread.
    """

    received = Signal(object)

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        doorbell = _Doorbell(self)
        self._mailbox = _Mailbox(doorbell)
        doorbell.rang.connect(self._deliver, QtCore.Qt.ConnectionType.QueuedConnection)
        # Deleted without close() (its page went away): ~QObject emits destroyed before it
        # deletes the doorbell, and closing waits for a ring in progress. A lambda, not the
        # bound method: PySide keeps a bound method of a plain object only weakly, and called
        # one on a freed mailbox here (tests/gui/background_stress.py).
        mailbox = self._mailbox
        self.destroyed.connect(lambda *_: mailbox.close())

    def post(self, item: Any) -> None:
        """Any thread: `received(item)` follows on the GUI thread, unless closed by then."""
        self._mailbox.post(item)

    def close(self) -> None:
        """Drop what is waiting and every later post (the owner is going away)."""
        self._mailbox.close()

    @Slot()
    def _deliver(self) -> None:
        for item in self._mailbox.take():
            self.received.emit(item)
