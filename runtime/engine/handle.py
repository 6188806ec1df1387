"""The caller's end of one request: its events in order, and a cancel button. The engine
(`runtime.engine.engine`) fills it from its thread; `IsolatedEngine`'s reader thread fills
its subclass (`runtime.engine.isolated_link.IsolatedHandle`) from the child's pipe.

    handle = engine.submit(request)
    for event in handle.events(timeout=60):   # TokenEvent / StepStats / Finished / ErrorEvent
        ...
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable, Iterator

from runtime.events import ErrorEvent, Event, Finished, TokenEvent, TokenRun


class EventQueueHandle:
    """The caller's end of one request: its events, in order, and a cancel button."""

    def __init__(self, request_id: str, n: int, cancel: Callable[[str], None]) -> None:
        self.id = request_id
        self._n = n
        self._queue: queue.SimpleQueue[Event | TokenRun] = queue.SimpleQueue()
        self._run: deque[TokenEvent] = deque()  # the rest of a TokenRun's tokens, to give out
        self._cancel = cancel
        self._finished = 0
        self._ended = False

    def _put(self, event: Event | TokenRun) -> None:  # engine thread
        self._queue.put(event)

    @property
    def ended(self) -> bool:
        """All events were read (every Finished, or the ErrorEvent)."""
        return self._ended

    def get(self, timeout: float | None = None) -> Event | None:
        """Next event; None on timeout or once the stream has ended."""
        if self._run:
            return self._run.popleft()
        if self._ended:
            return None
        try:
            event = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(event, TokenRun):  # (never empty)
            self._run.extend(event.events())
            return self._run.popleft()
        if isinstance(event, Finished):
            self._finished += 1
            self._ended = self._finished >= self._n
        elif isinstance(event, ErrorEvent):
            self._ended = True
        return event

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events until the last Finished or an ErrorEvent. `timeout` bounds each wait and
        raises TimeoutError when it passes."""
        while not self._ended:
            event = self.get(timeout)
            if event is None:
                if self._ended:
                    return
                raise TimeoutError(f"no event from request {self.id} within {timeout} s")
            yield event

    def cancel(self) -> None:
        self._cancel(self.id)
