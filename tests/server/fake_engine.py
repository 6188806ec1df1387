"""A small deterministic engine implementing `EngineAPI`, for fast tests of the HTTP layer.

Tokens are the prompt's UTF-8 bytes; replies are letters chosen from the prompt, the seed and
the choice index, one token per step for every active sequence in turn (a cartoon of
continuous batching). It keeps KV-cell accounting (prompt + generated per live sequence) and
a prefix cache of earlier prompts, so usage and `/api/status` have something real to show.

    >>> engine = FakeEngine(); engine.start()
    >>> engine.load(LoadSettings(model_path=gguf_file))
    >>> [e.text for e in engine.submit(GenerationRequest(prompt="hi")).events()][:3]
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.engine.api import Embeddings, EngineMetrics, EngineStatus, LoadedModel
from runtime.errors import ContextOverflow, ModelNotFound, NoModelLoaded, NotAGGUF, SettingsError
from runtime.events import (
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    StepStats,
    Timings,
    TokenEvent,
    Usage,
)
from runtime.settings.load import LoadSettings

FAIL_MARKER = "<<fail>>"  # a prompt containing it makes the engine report an internal error


class FakeHandle:
    def __init__(self, request: GenerationRequest) -> None:
        self.id = request.id
        self.request = request
        self.queue: queue.Queue[Event] = queue.Queue()
        self.cancelled = threading.Event()
        self._ended = False

    def get(self, timeout: float | None = None) -> Event | None:
        if self._ended:
            return None
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        done: set[int] = set()
        while True:
            event = self.queue.get(timeout=timeout)
            yield event
            if isinstance(event, Finished):
                done.add(event.index)
            if isinstance(event, ErrorEvent) or len(done) == self.request.n:
                return

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class _Sequence:
    handle: FakeHandle
    index: int
    prompt: tuple[int, ...]
    cached: int
    started: float = field(default_factory=time.monotonic)
    generated: list[int] = field(default_factory=list)
    text: str = ""


class FakeEngine:
    """Deterministic stand-in for `runtime.engine.engine.Engine`. `step_s` slows each step down."""

    def __init__(self, n_ctx: int = 2048, step_s: float = 0.0) -> None:
        self.n_ctx = n_ctx
        self.step_s = step_s
        self.load_gate: threading.Event | None = None  # when set by a test, load waits on it
        self.model: LoadedModel | None = None
        self.submitted: list[FakeHandle] = []
        self._incoming: queue.Queue[FakeHandle | None] = queue.Queue()
        self._active: list[_Sequence] = []
        self._cache: list[tuple[int, ...]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # EngineAPI --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._incoming.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def load(self, settings: LoadSettings,
             on_progress: Callable[[float], None] | None = None) -> LoadedModel:
        path = Path(settings.model_path)
        if not path.is_file():
            raise ModelNotFound(f"no model file at {path}")
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise NotAGGUF(f"{path.name} is not a GGUF file")
        for fraction in (0.0, 0.5, 1.0):
            if on_progress is not None:
                on_progress(fraction)
            if fraction == 0.5 and self.load_gate is not None:
                self.load_gate.wait(timeout=30)
        self.model = LoadedModel(
            path=path, name=path.stem, architecture="fake", n_params=1000,
            size_bytes=path.stat().st_size, quant="F32", n_ctx=settings.n_ctx,
            n_ctx_train=settings.n_ctx, n_vocab=256, settings=settings,
            chat_template_source="fallback", flash_attn=False,
            allocated={"CPU KV buffer": 1024})
        self.n_ctx = settings.n_ctx
        return self.model

    def unload(self) -> None:
        self.model = None

    def submit(self, request: GenerationRequest) -> FakeHandle:
        if self.model is None:
            raise NoModelLoaded("no model is loaded")
        handle = FakeHandle(request)
        self.submitted.append(handle)
        self._incoming.put(handle)
        return handle

    def status(self) -> EngineStatus:
        with self._lock:
            used = sum(len(s.prompt) + len(s.generated) for s in self._active)
            active = len(self._active)
        return EngineStatus("ready" if self.model else "empty", self.model, active,
                            self._incoming.qsize(), used, self.n_ctx)

    def metrics(self) -> EngineMetrics:
        status = self.status()
        return EngineMetrics(100.0, 1000.0, None, None, None, None, status.kv_cells_used,
                             status.kv_cells_total, status.active_sequences,
                             status.waiting_sequences)

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        if self.model is None:
            raise NoModelLoaded("no model is loaded")
        return list(text.encode())  # the fake's tokens are UTF-8 bytes

    def embed(self, inputs: Any) -> Embeddings:
        """Tokens are UTF-8 bytes (ids used as given); each vector counts byte values mod 8,
        normalised. Over `n_ctx` tokens, empty, or an id past 255: the real engine's errors."""
        if self.model is None:
            raise NoModelLoaded("no model is loaded")
        if not inputs:
            raise SettingsError("input: give at least one text to embed")
        vectors, counts = [], []
        for i, item in enumerate(inputs):
            ids = list(item.encode()) if isinstance(item, str) else list(item)
            if not ids or any(not 0 <= t < 256 for t in ids):
                raise SettingsError(f"input {i} is empty or has a token id outside 0..255")
            if len(ids) > self.n_ctx:
                raise ContextOverflow(f"input {i} has {len(ids)} tokens; at most {self.n_ctx}")
            v = np.bincount(np.asarray(ids) % 8, minlength=8).astype(np.float32)
            vectors.append(v / np.linalg.norm(v))
            counts.append(len(ids))
        return Embeddings(tuple(vectors), tuple(counts), "mean")

    def render_chat(self, messages: Any, *, tools: Any = (), extra: Any = None) -> str:
        return "".join(f"<{m.role}>{m.content}\n" for m in messages) + "<assistant>"

    # the loop ---------------------------------------------------------------------------
    def _admit(self, handle: FakeHandle) -> None:
        request = handle.request
        text = request.prompt if isinstance(request.prompt, str) else None
        if request.messages is not None:
            text = self.render_chat(request.messages)
        prompt = tuple(text.encode()) if text is not None else tuple(request.prompt or ())
        if FAIL_MARKER.encode() in bytes(p % 256 for p in prompt):
            handle.queue.put(ErrorEvent(handle.id, "RuntimeError", "the fake engine failed"))
            return
        if len(prompt) + 1 > self.n_ctx:
            error = ContextOverflow(f"the prompt has {len(prompt)} tokens; the context {self.n_ctx}")
            handle.queue.put(ErrorEvent(handle.id, type(error).__name__, str(error)))
            return
        cached = max((_common(prompt, old) for old in self._cache), default=0)
        self._cache.append(prompt)
        with self._lock:
            for index in range(request.n):
                self._active.append(_Sequence(handle, index, prompt, cached if index == 0
                                              else len(prompt)))

    def _next_token(self, seq: _Sequence) -> int:
        sampling = seq.handle.request.sampling
        salt = 0 if sampling.greedy else (sampling.seed or 0) + 1
        k = len(seq.generated)
        if k % 5 == 4:
            return ord(" ")
        return ord("a") + (sum(seq.prompt) + 3 * k + 7 * seq.index + salt) % 26

    def _step(self, seq: _Sequence) -> bool:
        """Emit one token; True when the sequence is done."""
        handle = seq.handle
        sampling = handle.request.sampling
        if handle.cancelled.is_set():
            self._finish(seq, "cancelled")
            return True
        token = self._next_token(seq)
        seq.generated.append(token)
        piece = chr(token)
        seq.text += piece
        hit = next((stop for stop in sampling.stop if stop in seq.text), None)
        if hit is not None:
            keep = seq.text.index(hit)
            emitted = len(seq.text) - len(piece)
            if keep > emitted:
                handle.queue.put(TokenEvent(handle.id, seq.index, token, seq.text[emitted:keep]))
            self._finish(seq, "stop", stop_sequence=hit)
            return True
        handle.queue.put(TokenEvent(handle.id, seq.index, token, piece,
                                    from_draft=len(seq.generated) % 3 == 0))
        if len(seq.generated) % 4 == 0:
            rounds = len(seq.generated) // 4
            handle.queue.put(StepStats(handle.id, seq.index, drafted=4, accepted=3,
                                       reply_drafted=4 * rounds, reply_accepted=3 * rounds, k=4,
                                       acceptance_rate=0.75, mean_accepted_length=4.0,
                                       predicted_speedup=1.5, measured_speedup=1.2))
        if len(seq.generated) >= sampling.max_tokens:
            self._finish(seq, "length")
            return True
        return False

    def _finish(self, seq: _Sequence, reason: str, stop_sequence: str | None = None) -> None:
        elapsed = max(time.monotonic() - seq.started, 1e-6)
        seq.handle.queue.put(Finished(
            seq.handle.id, seq.index, reason,  # type: ignore[arg-type]
            Usage(len(seq.prompt), len(seq.generated), seq.cached),
            Timings(elapsed / 2, 1000.0, 100.0, elapsed), stop_sequence=stop_sequence))

    def _loop(self) -> None:
        while True:
            try:
                handle = self._incoming.get(block=not self._active, timeout=None)
            except queue.Empty:
                handle = None
            else:
                if handle is None:
                    return
                self._admit(handle)
                continue
            for seq in list(self._active):
                if self._step(seq):
                    with self._lock:
                        self._active.remove(seq)
            if self.step_s:
                time.sleep(self.step_s)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
