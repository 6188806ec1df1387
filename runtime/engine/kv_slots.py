"""Who holds which KV cells: the slot table behind continuous batching and prefix sharing.

llama.cpp's unified KV cache is a pool of `n_cells` cells; each cell holds one position of
one or more sequence ids (`seq_cp` adds an id to a cell instead of copying it). The context
has `n_slots` sequence ids. This table mirrors, per slot, which tokens its cells hold
(positions 0..len−1), with a reference count per cell so that shared cells are counted once
and freed only when their last holder lets go — the PagedAttention idea at cell granularity.

A slot is *busy* (a running sequence owns it) or *idle*. An idle slot keeps the cells of
the sequence that finished in it: that is the prefix cache, evicted least recently used
first when cells run short. A new sequence takes an idle slot and reuses the longest
prefix any slot holds (live or idle):

    slot 0 (busy)  holds [sys, prompt A …]
    new prompt     [sys, prompt B …]          common prefix with slot 0: len(sys)
    → take idle slot 1, seq_cp(0 → 1, [0, len(sys))), evaluate only prompt B

At least the last prompt token is always evaluated again: llama.cpp only returns logits
for tokens evaluated in the current batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Memory(Protocol):
    """The two cache operations the table needs (runtime.llama.binding.LlamaContext has them)."""

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists.

        >>> common_prefix([1, 2, 3, 4], [1, 2, 9])
        2
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


class KvSlots:
    """The slot table. Every cache change goes through it so the ledger stays exact."""

    def __init__(self, memory: Memory, n_slots: int, n_cells: int, *, sharing: bool = True) -> None:
        self.memory = memory
        self.sharing = sharing  # False: no prefix reuse, no cache kept (recurrent / SWA models)
        self.n_slots = n_slots
        self.n_cells = n_cells
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        self._cells: list[list[int]] = [[] for _ in range(n_slots)]
        self._refs: dict[int, int] = {}
        self._ids = itertools.count()
        self.busy = [False] * n_slots
        self._last_use = [0] * n_slots
        self._tick = itertools.count(1)
        self.used = 0

    # ---- queries --------------------------------------------------------------------------

    @property
    def free(self) -> int:
        return self.n_cells - self.used

    def idle_slots(self) -> list[int]:
        return [s for s in range(self.n_slots) if not self.busy[s]]

    def best_match(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(slot, length) of the longest prefix of `tokens` held by any slot; (-1, 0) if none."""
        best, best_len = -1, 0
        if not self.sharing:
            return best, best_len
        for slot in range(self.n_slots):
            held = self.tokens[slot]
            if not held or held[0] != tokens[0]:
                continue
            n = common_prefix(held, tokens)
            if n > best_len:
                best, best_len = slot, n
        return best, best_len

    def cached_cells(self) -> int:
        """Cells held only by idle slots (the prefix cache), counted once."""
        idle_refs: dict[int, int] = {}
        for slot in self.idle_slots():
            for cell in self._cells[slot]:
                idle_refs[cell] = idle_refs.get(cell, 0) + 1
        return sum(1 for cell, n in idle_refs.items() if self._refs[cell] == n)

    # ---- changes --------------------------------------------------------------------------

    def acquire(self, tokens: Sequence[int]) -> tuple[int, int] | None:
        """Give a new sequence an idle slot holding the longest reusable prefix of `tokens`
        (at most len(tokens) − 1). Returns (slot, reused tokens) or None when every slot
        is busy."""
        idle = self.idle_slots()
        if not idle:
            return None
        src, match = self.best_match(tokens) if tokens and self.sharing else (-1, 0)
        match = min(match, len(tokens) - 1)
        if match > 0 and not self.busy[src]:
            slot = src  # reuse the idle slot in place
            self.truncate(slot, match)
        else:
            # The idle slot whose cache is worth least: empty first, then least recently used.
            slot = min(idle, key=lambda s: (len(self.tokens[s]) > 0, self._last_use[s]))
            self.truncate(slot, 0)
            if match > 0:
                self.memory.seq_cp(src, slot, 0, match)
                shared = self._cells[src][:match]
                for cell in shared:
                    self._refs[cell] += 1
                self._cells[slot] = list(shared)
                self.tokens[slot] = list(tokens[:match])
            else:
                match = 0
        self.busy[slot] = True
        self._last_use[slot] = next(self._tick)
        return slot, match

    def release(self, slot: int, keep: bool) -> None:
        """The sequence in `slot` is done. keep=True leaves its cells as prefix cache."""
        if not keep or not self.sharing:
            self.truncate(slot, 0)
        self.busy[slot] = False
        self._last_use[slot] = next(self._tick)

    def append(self, slot: int, tokens: Sequence[int]) -> None:
        """Record that `tokens` were evaluated into `slot` at the next positions."""
        cells = self._cells[slot]
        for _ in tokens:
            cell = next(self._ids)
            self._refs[cell] = 1
            cells.append(cell)
        self.tokens[slot].extend(tokens)
        self.used += len(tokens)

    def truncate(self, slot: int, n: int) -> int:
        """Keep only positions < n of `slot` (seq_rm [n, ∞)); returns cells freed."""
        if n >= len(self.tokens[slot]):
            return 0
        self.memory.seq_rm(slot, n, -1)
        freed = 0
        for cell in self._cells[slot][n:]:
            left = self._refs[cell] - 1
            if left:
                self._refs[cell] = left
            else:
                del self._refs[cell]
                freed += 1
        del self._cells[slot][n:]
        del self.tokens[slot][n:]
        self.used -= freed
        return freed

    def evict_idle(self, keep: int = -1) -> int:
        """Drop the least recently used idle slot's cache (not slot `keep`); cells freed,
        or -1 when no idle slot holds anything."""
        candidates = [s for s in self.idle_slots() if self.tokens[s] and s != keep]
        if not candidates:
            return -1
        slot = min(candidates, key=lambda s: self._last_use[s])
        return self.truncate(slot, 0)

    def clear(self) -> None:
        """Forget everything (the context's memory is cleared by the caller)."""
        for slot in range(self.n_slots):
            self.tokens[slot] = []
            self._cells[slot] = []
            self.busy[slot] = False
        self._refs.clear()
        self.used = 0
