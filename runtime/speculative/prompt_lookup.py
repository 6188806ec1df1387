"""Prompt-lookup drafting: propose what followed the sequence's own last n tokens earlier.

Chat replies quote their prompt (code being edited, names, a document being summarised),
so the tokens that followed an earlier occurrence of the last few tokens are a free draft.
Longest n-gram first (ngram_max down to ngram_min); for each n the most recent earlier
occurrence wins; up to k continuation tokens.

    >>> seq = [5, 6, 7, 9, 5, 6, 7, 8, 1, 5, 6, 7]
    >>> PromptLookup(ngram_min=2, ngram_max=3).propose(seq, k=3)   # [5 6 7] last seen at 4
    [8, 1, 5]
    >>> PromptLookup(ngram_min=2, ngram_max=3).propose([1, 2, 3], k=3)   # nothing repeats
    []

The drafter is deterministic: its q is a point mass on each proposal, so the verifier gets
`q=None` and accepts each token with the target's own probability p(x).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from runtime.errors import SettingsError
from runtime.sampling.native import native_kernels


def ngram_lookup_reference(tokens: Sequence[int] | np.ndarray, ngram_min: int,
                           ngram_max: int, k: int) -> list[int]:
    """The numpy reference of the native `ngram_lookup` (same arguments, same answer)."""
    _check(ngram_min, ngram_max, k)
    t = np.asarray(tokens, dtype=np.int64)
    size = t.size
    if k == 0:
        return []
    for n in range(ngram_max, ngram_min - 1, -1):
        if size < n + 1:
            continue
        pattern = t[size - n:]
        # windows starting at 0 .. size-n-1: each is followed by at least one token
        windows = np.lib.stride_tricks.sliding_window_view(t[:size - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return [int(v) for v in t[start:start + k]]
    return []


@dataclass(frozen=True)
class PromptLookup:
    """The n-gram drafter. `propose(tokens, k)` takes the sequence's prompt and output so
    far (a list or, cheaper, an int32 numpy array) and returns up to k draft tokens."""

    ngram_min: int = 2
    ngram_max: int = 4

    def __post_init__(self) -> None:
        _check(self.ngram_min, self.ngram_max, 0)

    def propose(self, tokens: Sequence[int] | np.ndarray, k: int) -> list[int]:
        if k < 0:
            raise SettingsError(f"draft length must be 0 or more, not {k}")
        native = native_kernels()
        if native is None:
            return ngram_lookup_reference(tokens, self.ngram_min, self.ngram_max, k)
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        return list(native.ngram_lookup(arr, self.ngram_min, self.ngram_max, k))


def _check(ngram_min: int, ngram_max: int, k: int) -> None:
    if not 1 <= ngram_min <= ngram_max:
        raise SettingsError("ngram sizes need 1 <= ngram_min <= ngram_max")
    if k < 0:
        raise SettingsError(f"draft length must be 0 or more, not {k}")
