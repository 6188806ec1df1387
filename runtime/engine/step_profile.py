"""Where a decode step's time goes, per generated token: Python, `llama_decode`, sampling.

`outrider run --profile` prints it after the reply, so a change that puts Python back on
the per-token path shows as a number:

    profile (native step): 511 tokens in 43 engine steps (511 decodes) · per token: Python
    9.8 µs CPU, 8.1 µs wall (median step) · llama_decode 402.3 µs CPU · sampling 0.4 µs ·
    wall 421.7 µs

A step's period runs from the start of one engine step to the start of the next while the
engine stays busy, so the engine loop between steps (its inbox, metrics, events) counts as
Python too; only decode steps count (one that evaluated prompt tokens is left out). One
engine step of the native path may run several decodes back to back (runtime.engine.
native_step), hence both counts. Decode
and sampling come from the native step's own clocks (native/step.h) — llama_decode with
llama_get_logits, where a GPU host waits for the device — and Python is the rest. On the
Python path (`OUTRIDER_NATIVE_STEP=0`) the decode is timed around the context's `decode`
and `logits`, and sampling, being Python there, is part of "Python" (so are a draft model's
decodes there; on the native path its rounds' decodes and sampling are counted).

"CPU" is the engine thread's CPU time (what other work on the machine disturbs least;
with several llama.cpp threads, the decode's figure is the engine thread's share of it);
"median step" is the median over steps of each step's Python wall time per token, which
a step preempted now and then does not move. Profiling costs about 2 µs a step (reading a
thread's CPU clock is a system call), counted in "Python CPU".
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.engine.native_step import NativeStep
from runtime.llama.binding import LlamaContext
from runtime.llama.stepper import Stepper
from runtime.units import fmt_latency

Clocks = tuple[float, float, float, int]  # decode wall, decode cpu, sample wall, decodes
_KEEP = 100_000  # steps whose Python time the median is taken over (the latest)


@dataclass(frozen=True)
class StepProfile:
    """Totals over the profiled decode steps (seconds), and the median step's Python wall
    time per token."""

    path: str  # "native step" or "Python step"
    steps: int = 0
    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    decode_wall: float = 0.0
    decode_cpu: float = 0.0
    sample_wall: float = 0.0
    python_wall_median: float = 0.0  # per token
    decodes: int = 0  # llama_decode calls (a native step may run several back to back)

    def per_token(self, seconds: float) -> float:
        return seconds / self.tokens if self.tokens else 0.0

    @property
    def python_cpu(self) -> float:
        """Engine-thread CPU outside llama_decode and sampling."""
        return max(0.0, self.cpu - self.decode_cpu - self.sample_wall)

    def line(self) -> str:
        """The one-line summary `outrider run --profile` prints."""
        if not self.tokens:
            return f"profile ({self.path}): no decode steps"
        sampling = (f"sampling {_us(self.per_token(self.sample_wall))}"
                    if self.path == "native step" else "sampling inside Python")
        return (f"profile ({self.path}): {self.tokens} tokens in {self.steps} engine steps "
                f"({self.decodes} decodes) · "
                f"per token: Python {_us(self.per_token(self.python_cpu))} CPU, "
                f"{_us(self.python_wall_median)} wall (median step) · llama_decode "
                f"{_us(self.per_token(self.decode_cpu))} CPU · {sampling} · "
                f"wall {_us(self.per_token(self.wall))}")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else fmt_latency(seconds)


class TimedContext:
    """A `LlamaContext` whose `decode` and `logits` are timed (the Python path's clocks);
    everything else passes through."""

    def __init__(self, ctx: LlamaContext) -> None:
        self._ctx = ctx
        self._wall = self._cpu = 0.0
        self._n = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def decode(self, batch: Any) -> int:
        w, c = time.perf_counter(), time.thread_time()
        try:
            return self._ctx.decode(batch)
        finally:
            self._wall += time.perf_counter() - w
            self._cpu += time.thread_time() - c
            self._n += 1

    def logits(self, n_outputs: int) -> np.ndarray:
        w = time.perf_counter()
        try:
            return self._ctx.logits(n_outputs)
        finally:
            elapsed = time.perf_counter() - w
            self._wall += elapsed
            self._cpu += elapsed  # a view: no time off the CPU in it

    def clocks(self) -> Clocks:
        return (self._wall, self._cpu, 0.0, self._n)


class StepProfiler:
    """Adds up the engine's decode steps (see the module doc). `begin` at the start of each
    engine step; `end` after it with its tokens, whether it only decoded, and whether work
    is left (its period then runs on to the next `begin`)."""

    def __init__(self, clocks: Callable[[], Clocks], path: str) -> None:
        self._clocks = clocks
        self._path = path
        self._open: tuple[float, float, Clocks] | None = None
        self._tokens = 0
        self._counted = False
        self._sums = [0.0] * 5  # wall, cpu, decode wall, decode cpu, sample wall
        self._steps = 0
        self._n_tokens = 0
        self._decodes = 0
        self._python: deque[float] = deque(maxlen=_KEEP)  # per step: Python wall per token

    def begin(self) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        if self._open is not None:
            self._close(wall, cpu)
        self._open = (wall, cpu, self._clocks())

    def end(self, tokens: int, decode_only: bool, busy: bool) -> None:
        self._tokens, self._counted = tokens, decode_only and tokens > 0
        if not busy:
            self._close(time.perf_counter(), time.thread_time())

    def _close(self, wall: float, cpu: float) -> None:
        opened, self._open = self._open, None
        if opened is None or not self._counted:
            return
        w0, c0, k0 = opened
        k1 = self._clocks()
        parts = (wall - w0, cpu - c0, k1[0] - k0[0], k1[1] - k0[1], k1[2] - k0[2])
        for i, v in enumerate(parts):
            self._sums[i] += v
        self._steps += 1
        self._n_tokens += self._tokens
        self._decodes += k1[3] - k0[3]
        # Python's wall time in the period: all of it but decoding and sampling.
        self._python.append(max(0.0, parts[0] - parts[2] - parts[4]) / self._tokens)

    def snapshot(self) -> StepProfile:
        median = statistics.median(self._python) if self._python else 0.0
        wall, cpu, decode_wall, decode_cpu, sample_wall = self._sums
        return StepProfile(self._path, self._steps, self._n_tokens, wall, cpu, decode_wall,
                           decode_cpu, sample_wall, median, self._decodes)


def profiled(ctx: LlamaContext, native: NativeStep | None,
             draft: Stepper | None = None) -> tuple[Any, StepProfiler]:
    """The context the scheduler should use and a profiler over it: the native step's own
    clocks, or `TimedContext`'s on the Python path; a draft model's native rounds (`draft`)
    add theirs, so its decodes count as llama_decode, not Python."""
    used: Any = ctx
    if native is not None:
        native.stepper.profile(True)
        clocks = native.stepper.raw_timings
        path = "native step"
    else:
        timed = TimedContext(ctx)
        used, clocks, path = timed, timed.clocks, "Python step"
    if draft is None:
        return used, StepProfiler(clocks, path)
    draft.profile(True)
    target, rounds = clocks, draft.raw_timings

    def both() -> Clocks:
        a, b = target(), rounds()
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])

    return used, StepProfiler(both, path)
