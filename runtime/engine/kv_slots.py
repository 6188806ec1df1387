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

A sliding-window cache (`window` > 0, llama.cpp's `swa_full` off) holds fewer cells on its
window layers than the ledger counts: a cell that slid out of a sequence's window is
reused, and llama.cpp then drops every older position of that sequence too, so a sequence
always holds exactly [seq_pos_min, seq_pos_max] there. A token at position n attends to
positions > n − window, so a prefix of length n is reused only while the source still
holds position max(0, n − window + 1); otherwise the prompt is computed again, as
llama-server does when it has no checkpoint ("forcing full prompt re-processing"):

    window 32, slot 0 holds 0..299 on the full layers but only 240..299 on window layers
    new prompt shares 280 tokens  → needs 249..279: held, reuse 280
    new prompt shares 100 tokens  → needs  69..99:  dropped, compute all of it

There a prefix is only ever reused in place, by taking over the idle slot that holds it,
never copied to another sequence (`seq_cp`): llama.cpp reuses a window cell only while
one sequence holds it, and one sequence may hold every window cell (it frees them lazily),
so cells shared by two sequences could pin the whole window cache and stop both.

With a `store` (runtime.engine.kv_store), the prefix cache reaches past the slots: a slot
that went idle is saved to disk once the engine has nothing else to do (`save_next_idle`,
called by the engine thread between requests), and at the latest just before its cells are
dropped (`_spill`); a prompt whose saved prefix is longer than anything a slot holds gets it
back (`acquire_stored`). Saving when idle is what makes a conversation resume after the
user switched away, closed the window or the engine was killed: nothing has to say "this
chat is idle now" — a finished reply is that signal.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from runtime.engine.kv_store import StoredMatch


class Memory(Protocol):
    """The two cache operations the table needs (runtime.llama.binding.LlamaContext has them)."""

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_pos_min(self, seq_id: int) -> int: ...


class SavedPrefixes(Protocol):
    """Prefixes kept on disk (runtime.engine.kv_store.KvStore)."""

    def save(self, slot: int, tokens: Sequence[int], *, supersede: bool = False) -> None: ...

    def find(self, tokens: Sequence[int], live: int, *, whole: bool) -> StoredMatch | None: ...

    def restore(self, match: StoredMatch, slot: int) -> float | None: ...


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

    def __init__(self, memory: Memory, n_slots: int, n_cells: int, *, sharing: bool = True,
                 store: SavedPrefixes | None = None, window: int = 0) -> None:
        self.memory = memory
        self.store = store
        self.sharing = sharing  # False: no prefix reuse, no cache kept (recurrent models)
        self.window = window  # sliding window of the cache in tokens; 0: all cells kept
        self.n_slots = n_slots
        self.n_cells = n_cells
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        self._cells: list[list[int]] = [[] for _ in range(n_slots)]
        # Slots holding each shared cell beyond the first (a cell absent here has one): a
        # token appended is one id, never a dict entry, so a run's cells cost a list extend.
        self._extra: dict[int, int] = {}
        self._next_id = 0  # cell ids, never reused
        self.busy = [False] * n_slots
        self._saved = [True] * n_slots  # an idle slot's cells, as they are, are in the store
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
        """(slot, length) of the longest prefix of `tokens` held by any slot; (-1, 0) if none.
        With a sliding window, only prefixes whose window is still held count."""
        best, best_len = -1, 0
        if not self.sharing:
            return best, best_len
        for slot in range(self.n_slots):
            held = self.tokens[slot]
            if not held or held[0] != tokens[0] or (self.window and self.busy[slot]):
                continue
            n = common_prefix(held, tokens)
            if n > best_len and self.window_held(slot, min(n, len(tokens) - 1)):
                best, best_len = slot, n
        return best, best_len

    def window_held(self, slot: int, n: int) -> bool:
        """Whether `slot` still holds every cell a token at position `n` attends to: always
        without a sliding window; with one, positions max(0, n − window + 1) .. n − 1.

        One C call (llama_memory_seq_pos_min); exact because llama.cpp drops a sequence's
        window cells oldest first and all older ones with them.
        """
        if self.window <= 0 or n <= 0:
            return True
        return 0 <= self.memory.seq_pos_min(slot) <= max(0, n - self.window + 1)

    def cached_cells(self) -> int:
        """Cells held only by idle slots (the prefix cache), counted once."""
        idle_refs: dict[int, int] = {}
        for slot in self.idle_slots():
            for cell in self._cells[slot]:
                idle_refs[cell] = idle_refs.get(cell, 0) + 1
        extra = self._extra
        return sum(1 for cell, n in idle_refs.items() if extra.get(cell, 0) + 1 == n)

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
                extra = self._extra
                for cell in shared:
                    extra[cell] = extra.get(cell, 0) + 1
                self._cells[slot] = list(shared)
                self.tokens[slot] = list(tokens[:match])
            else:
                match = 0
        self.busy[slot] = True
        self._last_use[slot] = next(self._tick)
        return slot, match

    def stored_match(self, tokens: Sequence[int], live: int) -> StoredMatch | None:
        """A saved prefix of `tokens` longer than the `live` tokens a slot could share."""
        if self.store is None or not tokens:
            return None
        return self.store.find(tokens, live, whole=not self.sharing)

    def acquire_stored(self, tokens: Sequence[int],
                       match: StoredMatch) -> tuple[int, int, float] | None:
        """Like `acquire`, restoring the saved prefix `match` into the slot: (slot, reused
        tokens, seconds the restore took), or None when the file could not be used (nothing
        changed but the choice of slot; the caller goes on with `acquire`)."""
        idle = self.idle_slots()
        if self.store is None or not idle:
            return None
        slot = min(idle, key=lambda s: (len(self.tokens[s]) > 0, self._last_use[s]))
        self.truncate(slot, 0)
        self.busy[slot] = True  # from here on its cells are no idle cache to save
        seconds = self.store.restore(match, slot)
        if seconds is None:
            self.busy[slot] = False
            return None
        # The file's cells past the common part hold other tokens: ledgered, then cut.
        restored = list(tokens[:match.usable])
        self.append(slot, restored + [-1] * (match.n_tokens - len(restored)))
        self.truncate(slot, match.usable)
        if not self.window_held(slot, match.usable):  # the file's window ends too late
            self.truncate(slot, 0)
            self.busy[slot] = False
            return None
        self._last_use[slot] = next(self._tick)
        return slot, match.usable, seconds

    def release(self, slot: int, keep: bool) -> None:
        """The sequence in `slot` is done. keep=True leaves its cells as prefix cache (or,
        where cells cannot be shared, saves them to the store before freeing them)."""
        self._saved[slot] = not keep
        if keep and not self.sharing:
            self._spill(slot)
        if not keep or not self.sharing:
            self.truncate(slot, 0)
        self.busy[slot] = False
        self._last_use[slot] = next(self._tick)

    def append(self, slot: int, tokens: Sequence[int]) -> None:
        """Record that `tokens` were evaluated into `slot` at the next positions."""
        new = range(self._next_id, self._next_id + len(tokens))
        self._next_id = new.stop
        self._cells[slot].extend(new)
        self.tokens[slot].extend(tokens)
        self.used += len(tokens)
        self._saved[slot] = False

    def truncate(self, slot: int, n: int) -> int:
        """Keep only positions < n of `slot` (seq_rm [n, ∞)); returns cells freed."""
        if n >= len(self.tokens[slot]):
            return 0
        if not self.busy[slot]:
            self._spill(slot)  # an idle cache about to lose cells: keep them on disk
        self.memory.seq_rm(slot, n, -1)
        extra = self._extra
        freed = 0
        for cell in self._cells[slot][n:]:
            others = extra.pop(cell, 0)
            if others > 1:
                extra[cell] = others - 1
            elif not others:
                freed += 1  # its last holder
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

    def save_idle(self) -> None:
        """Save every idle slot's cache to the store (the engine is unloading)."""
        for slot in self.idle_slots():
            self._spill(slot)

    def save_next_idle(self) -> bool:
        """Save one idle slot not saved since it went idle (most recently used first: the
        conversation just left); False when there is none — or no store — and nothing was
        done. The engine thread calls this while its inbox is empty, one slot at a time."""
        if self.store is None:
            return False
        waiting = [s for s in self.idle_slots() if not self._saved[s] and self.tokens[s]]
        if not waiting:
            return False
        self._spill(max(waiting, key=lambda s: self._last_use[s]))
        return True

    def _spill(self, slot: int) -> None:
        """Save `slot`'s cells unless they are saved already. A failed write counts as done
        (the store said so once): retrying would only hammer a full disk."""
        if self.store is not None and self.tokens[slot] and not self._saved[slot]:
            # A longer prefix makes the older files of it useless where cells can be cut
            # anywhere; a window or recurrent cache restores only whole files, so keep them.
            self.store.save(slot, self.tokens[slot], supersede=self.sharing and not self.window)
        self._saved[slot] = True

    def clear(self) -> None:
        """Forget everything (the context's memory is cleared by the caller)."""
        for slot in range(self.n_slots):
            self.tokens[slot] = []
            self._cells[slot] = []
            self.busy[slot] = False
            self._saved[slot] = True
        self._extra.clear()
        self.used = 0
