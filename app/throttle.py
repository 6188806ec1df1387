"""Coalesce bursts of calls into at most one per interval (after qutebrowser's misc/throttle).

Tokens can arrive thousands of times a second; repainting the transcript for each would
stall the event loop. `Throttle` runs its function on the next event-loop turn when idle
(never inside the caller, which may be in the middle of handling a burst), then at most once
per `interval_ms` while calls keep coming, and always once more after the last call so the
final state is drawn.

    throttle = Throttle(view.flush, 40, parent=view)
    stream.delta.connect(lambda _: throttle())
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.qt import QtCore


class Throttle(QtCore.QObject):
    def __init__(self, func: Callable[[], None], interval_ms: int,
                 parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._func = func
        self._interval = interval_ms
        self._last = 0.0
        self._timer = QtCore.QTimer(self, singleShot=True)
        self._timer.timeout.connect(self._fire)

    def __call__(self) -> None:
        if self._timer.isActive():
            return  # a run is already scheduled and will see this call's changes
        elapsed_ms = (time.monotonic() - self._last) * 1000
        self._timer.start(max(0, int(self._interval - elapsed_ms)))

    def flush(self) -> None:
        """Run now if a run is pending (before a rebuild, or when closing)."""
        if self._timer.isActive():
            self._timer.stop()
            self._fire()

    def cancel(self) -> None:
        self._timer.stop()

    def _fire(self) -> None:
        self._last = time.monotonic()
        self._func()
