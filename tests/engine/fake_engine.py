"""A fake engine for `IsolatedEngine`'s child process: no llama_cpp import (a child starts in
a fraction of a second), and behaviours a real engine will not show on demand — a call that
never returns, a stop that hangs, a start that fails, an exception class only this module has.

    IsolatedEngine(functools.partial(FakeEngine, hang_on_stop=True), stop_timeout_s=1)
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

from runtime.engine.api import Embeddings, EngineMetrics, EngineStatus, LoadedModel
from runtime.errors import NoModelLoaded, SettingsError
from runtime.events import Event, GenerationRequest
from runtime.settings.load import LoadSettings


class FakeOnlyError(Exception):
    """A class the parent cannot rebuild (not runtime's): it must come back as EngineError."""


class FakeHandle:
    def __init__(self, request_id: str) -> None:
        self.id = request_id
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def get(self, timeout: float | None = None) -> Event | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        while (event := self.get(timeout)) is not None:
            yield event

    def cancel(self) -> None:
        pass


class FakeEngine:
    """Accepts every request and never answers it; `embed` blocks forever."""

    def __init__(self, *, hang_on_stop: bool = False, fail_on_start: bool = False) -> None:
        self._hang_on_stop = hang_on_stop
        self._fail_on_start = fail_on_start
        self._never = threading.Event()

    def start(self) -> None:
        if self._fail_on_start:
            raise SettingsError("the fake engine was told not to start")

    def stop(self) -> None:
        if self._hang_on_stop:
            self._never.wait()

    def load(self, settings: LoadSettings, on_progress: Any = None) -> LoadedModel:
        raise NoModelLoaded("the fake engine loads nothing")

    def unload(self) -> None:
        pass

    def submit(self, request: GenerationRequest) -> FakeHandle:
        return FakeHandle(request.id)

    def status(self) -> EngineStatus:
        return EngineStatus("empty", None, 0, 0, 0, 0)

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(0.0, 0.0, None, None, None, None, 0, 0, 0, 0)

    def embed(self, inputs: Any) -> Embeddings:
        self._never.wait()
        raise NoModelLoaded("never reached")

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        raise NoModelLoaded("the fake engine has no tokenizer")

    def render_chat(self, messages: Any, *, tools: Any = (), extra: Any = None) -> str:
        if messages == "value":
            raise ValueError("a builtin error keeps its class")
        raise FakeOnlyError("a class of the fake's own")


def exit_at_once() -> FakeEngine:
    """A factory whose process dies before its engine exists (a broken install, say)."""
    os._exit(3)
