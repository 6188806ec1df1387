"""A grammar's token mask at one position, in the form the sampler applies cheaply.

llguidance writes a mask as a bitmask (one bit per token, 1536 int32 words for SmolLM2's
49,152 tokens). JSON masks are of two kinds: structure allows a handful of tokens (1 to ~120
of 49k: a quote, a key, a digit) and the inside of a string allows nearly all of them
(48,784 of 49,152). A `TokenMask` keeps the short list of either: `ids` (the allowed ids,
ascending) when at most half the vocabulary is allowed, else `banned` (the refused ids,
ascending); the other is None. The sampler gathers the few allowed logits, or sets the few
refused ones to -inf in a copy of the row — where gathering 48.8k logits by a 48.8k index
array cost ~95 µs a token and finding the index ~60 µs, on top of the mask itself.

    >>> m = TokenMask(np.array([0b1010], np.int32), n_vocab=32)
    >>> m.allows(1), m.allows(2), m.count, m.ids.tolist(), m.banned
    (True, False, 2, [1, 3], None)
    >>> m = TokenMask(np.array([-1 ^ 0b100], np.int32), n_vocab=32)   # all but token 2
    >>> m.ids, m.banned.tolist(), m.allowed_ids()[:4].tolist()
    (None, [2], [0, 1, 3, 4])

The native decode step (native/step.h) takes the same short list, as `step_form`:
(True, ids, n_vocab) or (False, banned, n_vocab) — built once with the mask, so handing it
over costs a tuple lookup per token:

    >>> allows, listed, n = m.step_form
    >>> allows, listed.tolist(), n
    (False, [2], 32)

Masks repeat (every position inside a JSON string has the same one, every record of a list
the same structural ones), so a `MaskTable` (one per vocabulary) maps a bitmask's bytes to
its `TokenMask`: after the first record a mask costs llguidance's fill and a dict lookup.
Everything here is read-only once built, and shared between positions and sequences.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

__all__ = ["TABLE_SIZE", "MaskTable", "TokenMask"]

TABLE_SIZE = 512  # distinct masks kept per vocabulary (a few MB at most)


class TokenMask:
    """One position's allowed tokens (see the module docstring). `bits` is llguidance's
    bitmask row (int32 words, bit t % 32 of word t // 32 for token t); tokens at or past
    `n_vocab` are never allowed."""

    __slots__ = ("_all_ids", "_bool", "banned", "bits", "count", "ids", "n_vocab", "step_form")

    def __init__(self, bits: np.ndarray, n_vocab: int) -> None:
        self.bits = np.array(bits, dtype=np.int32).reshape(-1)
        self.bits.flags.writeable = False
        self.n_vocab = n_vocab
        allowed = np.unpackbits(self.bits.view(np.uint8), bitorder="little",
                                count=n_vocab).view(np.bool_)
        self.count = int(np.count_nonzero(allowed))
        self.ids: np.ndarray | None = None
        self.banned: np.ndarray | None = None
        if 2 * self.count <= n_vocab:
            self.ids = _frozen(np.flatnonzero(allowed))
            listed = self.ids
        else:
            self.banned = _frozen(np.flatnonzero(~allowed))
            listed = self.banned
        # (allows, ascending int64 ids, n_vocab): what the native step masks a row with
        self.step_form: tuple[bool, np.ndarray, int] = (self.ids is not None, listed, n_vocab)
        self._bool: np.ndarray | None = None
        self._all_ids: np.ndarray | None = self.ids

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (a bit test, no array built)."""
        if not 0 <= token < self.n_vocab:
            return False
        return bool((int(self.bits[token >> 5]) >> (token & 31)) & 1)

    def as_bool(self) -> np.ndarray:
        """Bool array (n_vocab,), True where allowed; built on first use, read-only."""
        if self._bool is None:
            self._bool = _frozen(np.unpackbits(self.bits.view(np.uint8), bitorder="little",
                                               count=self.n_vocab).view(np.bool_))
        return self._bool

    def allowed_ids(self) -> np.ndarray:
        """The allowed ids, ascending (built from `as_bool` for a mask kept as `banned`;
        `ids` stays None for it, so the sampler keeps applying it as `banned`)."""
        if self._all_ids is None:
            self._all_ids = _frozen(np.flatnonzero(self.as_bool()))
        return self._all_ids


class MaskTable:
    """Bitmask bytes → `TokenMask`, least recently used dropped past `size`. Thread-safe."""

    def __init__(self, n_vocab: int, size: int = TABLE_SIZE) -> None:
        self.n_vocab = n_vocab
        self.size = size
        self._lock = threading.Lock()
        self._masks: OrderedDict[bytes, TokenMask] = OrderedDict()

    def get(self, bits: np.ndarray) -> TokenMask:
        """The mask of `bits` (copied when new; `bits` may be reused by the caller)."""
        key = bits.tobytes()
        with self._lock:
            mask = self._masks.get(key)
            if mask is not None:
                self._masks.move_to_end(key)
                return mask
        mask = TokenMask(bits, self.n_vocab)
        with self._lock:
            self._masks[key] = mask
            while len(self._masks) > self.size:
                self._masks.popitem(last=False)
        return mask

    def __len__(self) -> int:
        return len(self._masks)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
