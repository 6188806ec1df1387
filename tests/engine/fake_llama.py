"""A strict stand-in for a llama context, for scheduler tests that need no model.

It keeps real cells (position, token, set of sequence ids) like llama.cpp's unified KV
cache, enforces its rules (a sequence's new tokens continue at its last position + 1; a
batch that does not fit in the free cells returns 1 and changes nothing) and computes
"logits" from exactly the tokens a sequence can see in the cache. So a scheduler bug —
a wrong prefix shared, a position skipped, a cell freed too early — changes the output.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

VOCAB = 64
EOS = 0


@dataclass
class Cell:
    pos: int
    token: int
    seqs: set[int] = field(default_factory=set)


class FakeBatch:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[tuple[int, int, int, bool]] = []
        self.n_tokens = 0
        self.n_outputs = 0

    def clear(self) -> None:
        self.items = []
        self.n_tokens = 0
        self.n_outputs = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        assert self.n_tokens < self.capacity
        self.items.append((token, pos, seq_id, logits))
        self.n_tokens += 1
        if logits:
            self.n_outputs += 1
            return self.n_outputs - 1
        return -1

    def add_tokens(self, tokens: Sequence[int], pos0: int, seq_id: int, logits_last: bool) -> int:
        row = -1
        for i, t in enumerate(tokens):
            row = self.add(t, pos0 + i, seq_id, logits_last and i == len(tokens) - 1)
        return row

    def add_tokens_all_logits(self, tokens: Sequence[int], pos0: int, seq_id: int) -> int:
        first = self.n_outputs
        for i, t in enumerate(tokens):
            self.add(t, pos0 + i, seq_id, True)
        return first


def logits_for(history: Sequence[int]) -> np.ndarray:
    """Deterministic pseudo-logits of everything a sequence has seen. EOS is made unlikely
    so replies run to max_tokens unless a test wants otherwise."""
    digest = hashlib.sha256(np.asarray(history, dtype=np.int32).tobytes()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    row = rng.standard_normal(VOCAB).astype(np.float32) * 3
    row[EOS] = -50.0
    return row


class FakeContext:
    def __init__(self, n_ctx: int, n_seq_max: int) -> None:
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.cells: list[Cell | None] = [None] * n_ctx
        self.decodes = 0
        self.tokens_evaluated = 0
        self._out = np.zeros((0, VOCAB), dtype=np.float32)

    # -- memory ---------------------------------------------------------------------------
    def used(self) -> int:
        return sum(1 for c in self.cells if c is not None)

    def seq_cells(self, seq: int) -> list[Cell]:
        return sorted((c for c in self.cells if c is not None and seq in c.seqs), key=lambda c: c.pos)

    def seq_pos_max(self, seq: int) -> int:
        cells = self.seq_cells(seq)
        return cells[-1].pos if cells else -1

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        hi = p1 if p1 >= 0 else 1 << 30
        lo = max(p0, 0)
        for i, c in enumerate(self.cells):
            if c is not None and seq_id in c.seqs and lo <= c.pos < hi:
                c.seqs.discard(seq_id)
                if not c.seqs:
                    self.cells[i] = None
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        hi = p1 if p1 >= 0 else 1 << 30
        lo = max(p0, 0)
        for c in self.cells:
            if c is not None and src in c.seqs and lo <= c.pos < hi:
                c.seqs.add(dst)

    # -- compute --------------------------------------------------------------------------
    def decode(self, batch: FakeBatch) -> int:
        free = [i for i, c in enumerate(self.cells) if c is None]
        if len(free) < batch.n_tokens:
            return 1
        expected: dict[int, int] = {}
        for _token, pos, seq, _ in batch.items:
            assert 0 <= seq < self.n_seq_max
            want = expected.get(seq, self.seq_pos_max(seq) + 1)
            assert pos == want, f"seq {seq}: position {pos}, expected {want}"
            expected[seq] = pos + 1
        rows = []
        for (token, pos, seq, logits), slot in zip(batch.items, free, strict=False):
            self.cells[slot] = Cell(pos, token, {seq})
            if logits:
                seen = self.seq_cells(seq)
                assert [c.pos for c in seen] == list(range(pos + 1)), "hole in the sequence"
                rows.append(logits_for([c.token for c in seen]))
        self.decodes += 1
        self.tokens_evaluated += batch.n_tokens
        self._out = np.array(rows, dtype=np.float32).reshape(-1, VOCAB)
        return 0

    def logits(self, n_outputs: int) -> np.ndarray:
        assert n_outputs == len(self._out)
        return self._out


class FakeVocab:
    def piece(self, token: int) -> bytes:
        return bytes([97 + token % 26])  # "a".."z"

    def is_eog(self, token: int) -> bool:
        return token == EOS
