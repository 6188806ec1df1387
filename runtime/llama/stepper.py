"""The native step over one llama context: batch, `llama_decode`, logits rows and sampling
in one C call (`runtime._native.Stepper`, built from native/step.h and native/stepper.c).

The extension is built without llama.cpp's headers or libraries: the functions it calls
are the ones llama-cpp-python has already loaded, handed over as addresses, so one build
works with CPU, CUDA and Metal wheels.

    stepper = Stepper.for_context(ctx)      # None: the extension is missing, or switched off
    rc, results = stepper.step([(slot, pos, token, cfg, None)])
    token = results[0]                      # greedy when cfg[0] == 0
    rc, results = stepper.step([(slot, pos, token, cfg, None, mask.step_form)])
    token = results[0]                      # one the grammar allows (a TokenMask)

`OUTRIDER_NATIVE_STEP=0` in the environment switches the native step off (checked at each
model load): the engine then runs the pure-Python reference path, which CI runs too.
`native_step_status()` says which path a load would take and why.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from dataclasses import dataclass
from typing import Any, Protocol, cast

import llama_cpp.llama_cpp as L

from runtime.llama.binding import LlamaContext

STEP_ABI = 3  # must equal the STEP_ABI native/stepper.c registers
ENV_SWITCH = "OUTRIDER_NATIVE_STEP"

# The entry and result shapes of `step` (native/stepper.c says it in full):
#   entry  (slot, pos, fed, cfg, q[, mask]): fed a token, or (t, x1..xk) to verify; cfg
#          None (the caller samples) or (mode, temperature, top_k, top_p, min_p, rng
#          capsule); mask None or, for one fed token, a constraint's (allows, ids,
#          n_vocab) (runtime.sampling.token_mask.TokenMask.step_form)
#   result None, a token, (accepted, tokens) or a negative error code
StepEntry = tuple[Any, ...]

# Negative results: which kernel check refused the rows (sampling.h, verify.h, step.h).
ERR_NAN = -1
ERR_ALL_INF = -2
ERR_NOMEM = -3
ERR_ZERO_Q = -10
ERR_INVALID = -20
ERR_CONSTRAINT = -30


class NativeStepper(Protocol):
    """What `runtime._native.Stepper` offers."""

    def step(self, entries: list[StepEntry]) -> tuple[int, list[Any] | None]: ...

    def run(self, entries: list[tuple[int, int, int, Any, int, bool]], max_steps: int,
            max_seconds: float, stop_on_finish: bool, doorbell: int = 0,
            ) -> tuple[int, int, list[tuple[tuple[int, ...], int]]]: ...

    def draft(self, slot: int, pos: int, k: int, cfg: tuple[Any, ...], greedy: bool,
              p_min: float, stop_on_eog: bool, q_out: Any,
              feed: tuple[int, ...]) -> tuple[tuple[int, ...], int, int, int]: ...

    def profile(self, on: bool) -> None: ...

    def timings(self) -> tuple[float, float, float, int]: ...


@dataclass(frozen=True)
class StepTimings:
    """Seconds the native step spent while profiling (`Stepper.profile`): in `llama_decode`
    with `llama_get_logits` (where a GPU host waits), wall and the calling thread's CPU,
    and in sampling (wall: short, and on the CPU throughout); and how many decodes ran."""

    decode_wall: float = 0.0
    decode_cpu: float = 0.0
    sample_wall: float = 0.0
    decodes: int = 0


def _extension() -> tuple[Any | None, str]:
    try:
        module = importlib.import_module("runtime._native")
    except ImportError as exc:
        return None, f"runtime._native is not built ({exc})"
    if int(getattr(module, "STEP_ABI", 0)) != STEP_ABI or not hasattr(module, "Stepper"):
        return None, ("runtime._native has no native step of this version: rebuild it with "
                      "`python setup.py build_ext --inplace`")
    return module, "native step (runtime._native)"


class Doorbell:
    """A flag another thread raises to end a native run after its current step: the engine
    rings it with each command it posts (a request, a cancel, a load), so a run may go on
    for many steps without keeping a newcomer waiting. `Stepper.run` reads it at `address`
    after each decode (native/stepper.c); the engine thread lowers it before it looks at
    its inbox, so a command posted after that look always ends the run that follows.

        >>> bell = Doorbell()
        >>> bell.rung, bell.ring(), bell.rung, bell.clear(), bell.rung
        (False, None, True, None, False)
    """

    def __init__(self) -> None:
        self._flag = ctypes.c_int32(0)
        self.address = ctypes.addressof(self._flag)

    @property
    def rung(self) -> bool:
        return bool(self._flag.value)

    def ring(self) -> None:
        self._flag.value = 1

    def clear(self) -> None:
        self._flag.value = 0


def native_step_status() -> str:
    """One line: the path the next model load takes for each decode step, and why."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "off", "false", "no"):
        return f"Python step ({ENV_SWITCH}=0)"
    module, why = _extension()
    return why if module is not None else f"Python step ({why})"


def native_step_enabled() -> bool:
    return native_step_status().startswith("native")


def _address(fn: Any) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


class Stepper:
    """`runtime._native.Stepper` over one `LlamaContext` (same thread rules: the engine's).

    `step` and `draft` are the C methods themselves (no Python frame between). `eog` is the
    model's end-of-generation flag per token, for a draft round's early stop."""

    def __init__(self, ctx: LlamaContext, native: Any) -> None:
        model = ctx.model
        eog = bytes(model.is_eog(t) for t in range(ctx.n_vocab))
        # int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch);
        # float * llama_get_logits(struct llama_context * ctx);
        self._c = cast(NativeStepper, native.Stepper(
            ctx.ptr, ctx.n_vocab, ctx.n_batch, _address(L.llama_decode),
            _address(L.llama_get_logits), eog))
        self.ctx = ctx
        self.step = self._c.step
        self.run = self._c.run
        self.draft = self._c.draft
        self.raw_timings = self._c.timings  # the tuple StepTimings is made of

    @classmethod
    def for_context(cls, ctx: Any) -> Stepper | None:
        """A stepper for `ctx`, or None where the native step is off or not built, or `ctx`
        is no llama.cpp context (a test's stand-in)."""
        if not isinstance(ctx, LlamaContext) or not native_step_enabled():
            return None
        module, _ = _extension()
        return cls(ctx, module) if module is not None else None

    def profile(self, on: bool) -> None:
        """Keep the decode and sampling clocks (`timings`) from now on; off by default, for
        a thread's CPU clock is a system call."""
        self._c.profile(on)

    def timings(self) -> StepTimings:
        return StepTimings(*self._c.timings())
