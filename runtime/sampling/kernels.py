"""The per-row sampling math: penalties and the distribution transform, in numpy.

`transform` turns one row of raw logits into the *final sampling distribution* p: the one a
token is drawn from, and the one the speculative verifier compares (min(1, p/q)). Same order
as llama.cpp's default sampler chain, so settings behave as users know them there:

    penalties → top-k → top-p → min-p (on the T=1 softmax) → temperature → softmax

Temperature 0 is greedy: a point mass on the argmax (ties: the lowest id).

    >>> p = transform(np.array([2.0, 1.0, 0.0], np.float32), temperature=1.0, top_k=0,
    ...               top_p=1.0, min_p=0.0)
    >>> np.round(p, 3).tolist()
    [0.665, 0.245, 0.09]

The speculative work adds a native (C) implementation of the same functions; this module is
the reference it is tested against and the fallback where the extension is missing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.errors import SettingsError


def apply_penalties(
    logits: np.ndarray,
    history: Sequence[int],
    *,
    repeat_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    last_n: int = 64,
) -> np.ndarray:
    """Return logits penalised for the last `last_n` tokens of `history` (a new array).

    Repeat penalty as llama.cpp: positive logits are divided, negative ones multiplied.
    Frequency and presence as OpenAI: logit -= count * frequency + (count > 0) * presence.
    """
    if (repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0) \
            or last_n == 0 or not history:
        return logits
    recent = np.asarray(history[-last_n:], dtype=np.int64)
    recent = recent[recent >= 0]  # an image's positions (negative placeholders) are no tokens
    ids, counts = np.unique(recent, return_counts=True)
    out = logits.copy()
    values = out[ids]
    if repeat_penalty != 1.0:
        values = np.where(values > 0, values / repeat_penalty, values * repeat_penalty)
    values = values - counts * frequency_penalty - presence_penalty
    out[ids] = values
    return out


def transform(
    logits: np.ndarray,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
) -> np.ndarray:
    """Final sampling distribution (float64, sums to 1) of one row of float32 logits."""
    if logits.ndim != 1 or logits.size == 0:
        raise SettingsError("logits must be one non-empty row")
    if np.isnan(logits).any():
        raise SettingsError("the model produced NaN logits; the weights or the context are broken")
    n = logits.size
    x = logits.astype(np.float64)
    if temperature == 0.0:
        out = np.zeros(n)
        out[int(np.argmax(x))] = 1.0
        return out
    keep = np.isfinite(x)
    if not keep.any():
        raise SettingsError("every logit is -inf: nothing can be sampled")
    if 0 < top_k < n:
        # Keep exactly top_k: ties at the boundary broken by lower id (stable sort).
        order = np.argsort(-x, kind="stable")
        mask = np.zeros(n, dtype=bool)
        mask[order[:top_k]] = True
        keep &= mask
    if top_p < 1.0 or min_p > 0.0:
        probs = _softmax(np.where(keep, x, -np.inf))
        if top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            # Smallest prefix whose mass reaches top_p (at least one token).
            cut = int(np.searchsorted(cum, top_p, side="left")) + 1
            mask = np.zeros(n, dtype=bool)
            mask[order[:cut]] = True
            keep &= mask
        if min_p > 0.0:
            keep &= probs >= min_p * probs.max()
    scaled = np.where(keep, x / temperature, -np.inf)
    return _softmax(scaled)


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    e = np.exp(x - m)
    return e / e.sum()


def sample(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw with one uniform `u` in [0, 1): deterministic given u, so the native
    and numpy paths (and replays) pick the same token."""
    cum = np.cumsum(probs)
    idx = int(np.searchsorted(cum, u * cum[-1], side="right"))
    idx = min(idx, probs.size - 1)
    while probs[idx] == 0.0 and idx > 0:  # never land on a filtered token through rounding
        idx -= 1
    return idx
