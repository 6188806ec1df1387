"""One face for the sampling and speculative kernels: native C when built, numpy when not.

`runtime._native` (built from `native/` by `python setup.py build_ext --inplace` or the
package build) computes exactly what `runtime.sampling.kernels` and `runtime.sampling.verify` (and
`runtime.speculative.prompt_lookup`, which dispatches itself) compute in numpy, only faster: it reads float32 logits
in place (a numpy view over `llama_get_logits_ith`'s pointer is enough) and selects instead
of sorting. Where the extension is missing or stale, every function here falls back to the
numpy reference, and `native_status()` says so (shown by `outrider info`).

    >>> logits = np.array([2.0, 1.0, 0.0], np.float32)
    >>> p = transform(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    >>> sample(p, 0.5), sample(p, 0.9)
    (0, 1)
    >>> native_status()                                  # doctest: +SKIP
    'native kernels (runtime._native, ABI 2)'
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol, cast

import numpy as np

from runtime.errors import SettingsError
from runtime.sampling import kernels
from runtime.sampling.verify import VerifyMode, VerifyOutcome
from runtime.sampling.verify import verify as verify_numpy

ABI_VERSION = 2  # must equal OR_ABI_VERSION in native/outrider_native.c


class NativeKernels(Protocol):
    """What `runtime._native` offers (see native/outrider_native.c)."""

    LogitsError: type[ValueError]

    def version(self) -> int: ...

    def transform(self, logits: Any, out: Any, temperature: float, top_k: int, top_p: float,
                  min_p: float) -> int: ...

    def sample(self, probs: Any, u: float) -> int: ...

    def verify(self, drafts: Any, p: Any, q: Any, u: Any, mode: str) -> tuple[int, tuple[int, ...]]: ...

    def ngram_lookup(self, tokens: Any, ngram_min: int, ngram_max: int, k: int) -> list[int]: ...


def _load() -> tuple[NativeKernels | None, str]:
    try:
        module: ModuleType = importlib.import_module("runtime._native")
    except ImportError as exc:
        return None, f"numpy fallback (runtime._native not built: {exc})"
    version = int(module.version())
    if version != ABI_VERSION or not hasattr(module, "transform"):
        return None, (f"numpy fallback (runtime._native is ABI {version}, this code needs "
                      f"{ABI_VERSION}: rebuild with `python setup.py build_ext --inplace`)")
    return cast(NativeKernels, module), f"native kernels (runtime._native, ABI {version})"


# Decided once at import; never reassigned.
_NATIVE, _STATUS = _load()


def native_status() -> str:
    """One line for `outrider info`: which kernels this process uses and why."""
    return _STATUS


def native_kernels() -> NativeKernels | None:
    """The extension module, or None where the numpy fallback is in use."""
    return _NATIVE


def transform(
    logits: np.ndarray,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """`runtime.sampling.kernels.transform`, natively when possible. Writes into `out` (float64 or
    float32, as long as the row) when given, else into a new float64 array; returns it.

    Raises SettingsError for NaN logits or when nothing finite is left, like numpy."""
    native = _NATIVE
    if out is None:
        out = np.empty(logits.shape[-1] if logits.ndim else 0, dtype=np.float64)
    if (native is not None and logits.dtype == np.float32 and logits.ndim == 1
            and logits.size > 0 and logits.flags.c_contiguous
            and out.dtype in (np.float32, np.float64) and out.flags.c_contiguous
            and out.flags.writeable):
        try:
            native.transform(logits, out, float(temperature), int(top_k), float(top_p),
                             float(min_p))
        except native.LogitsError as exc:
            raise SettingsError(str(exc)) from None
        return out
    out[...] = kernels.transform(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                 min_p=min_p)
    return out


def sample(probs: np.ndarray, u: float) -> int:
    """`runtime.sampling.kernels.sample`: the inverse-CDF draw for one uniform `u` in [0, 1)."""
    native = _NATIVE
    if (native is not None and probs.ndim == 1 and probs.size > 0
            and probs.dtype in (np.float32, np.float64) and probs.flags.c_contiguous):
        return int(native.sample(probs, float(u)))
    return kernels.sample(probs, float(u))


def verify(
    drafts: Sequence[int] | np.ndarray,
    p: np.ndarray,
    q: np.ndarray | None,
    u: Sequence[float] | np.ndarray | None,
    mode: VerifyMode = "leviathan",
) -> VerifyOutcome:
    """`runtime.sampling.verify.verify`, natively when the arrays allow (C-contiguous float64 or
    float32 `p`, `q` of the same dtype)."""
    native = _NATIVE
    if (native is not None and p.ndim == 2 and p.dtype in (np.float32, np.float64)
            and p.flags.c_contiguous
            and (q is None or (q.dtype == p.dtype and q.flags.c_contiguous))):
        x = np.ascontiguousarray(drafts, dtype=np.int32)
        draws = None if u is None else np.ascontiguousarray(u, dtype=np.float64)
        accepted, tokens = native.verify(x, p, q, draws, mode)
        return VerifyOutcome(int(accepted), tuple(tokens))
    return verify_numpy(drafts, p, q, u, mode)
