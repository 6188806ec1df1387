"""The draft model's per-token helpers, on a fake llama context: the one-token draft step
(its batch entry, the eviction retry) and the draft's confidence (`_top_probability`)."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from runtime.speculative import draft_model
from runtime.speculative.draft_model import DraftContext, _top_probability

N_VOCAB = 5


class FakeContext:
    """Records every decoded batch; answers with scripted return codes (0 when none left)."""

    n_batch = 8
    n_seq_max = 2

    def __init__(self, codes: list[int] | None = None) -> None:
        self.codes = list(codes or [])
        self.decoded: list[list[tuple[int, int, int, bool]]] = []
        self.removed: list[tuple[int, int, int]] = []
        self.rows = np.arange(N_VOCAB, dtype=np.float32)[None, :]

    def decode(self, batch) -> int:
        n = batch.n_tokens
        self.decoded.append([(int(batch.token[i]), int(batch.pos[i]), int(batch.seq_id[i, 0]),
                              bool(batch.logits[i])) for i in range(n)])
        return self.codes.pop(0) if self.codes else 0

    def logits(self, n_outputs: int) -> np.ndarray:
        return self.rows[:n_outputs]

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self.removed.append((seq_id, p0, p1))
        return True


def _context(codes: list[int] | None = None) -> tuple[DraftContext, FakeContext]:
    fake = FakeContext(codes)
    return DraftContext(model=None, ctx=fake), fake  # type: ignore[arg-type]


def test_step_decodes_one_token_at_the_next_position_with_logits() -> None:
    ctx, fake = _context()
    slot = ctx.acquire([1, 2, 3])
    assert slot is not None
    synced = ctx.sync(slot, [1, 2, 3])
    assert synced is not None and synced[1] == 3
    assert fake.decoded == [[(1, 0, slot, False), (2, 1, slot, False),
                                        (3, 2, slot, True)]]
    out = ctx.step(slot, 7)
    assert out is not None and out.tolist() == fake.rows[0].tolist()
    assert fake.decoded[-1] == [(7, 3, slot, True)]
    assert ctx._seen[slot] == [1, 2, 3, 7]
    # the next round starts where the cache ends: only the new token is decoded
    ctx.sync(slot, [1, 2, 3, 7, 9], known=4)
    assert fake.decoded[-1] == [(9, 4, slot, True)]


def test_step_without_room_evicts_idle_caches_and_retries_once() -> None:
    ctx, fake = _context()
    idle = ctx.acquire([5, 6])
    assert idle is not None
    ctx.sync(idle, [5, 6])
    slot = ctx.acquire([1, 2])
    assert slot is not None and slot != idle
    ctx.sync(slot, [1, 2])
    ctx.release(idle)  # its cells stay as a prefix cache
    fake.codes = [draft_model._NO_KV_SLOT]  # full once; the retry succeeds
    assert ctx.step(slot, 3) is not None
    assert fake.removed == [(idle, 0, -1)] and ctx._seen[idle] == []
    assert fake.decoded[-2] == fake.decoded[-1] == [(3, 2, slot, True)]
    assert ctx._seen[slot] == [1, 2, 3]


def test_step_that_cannot_decode_returns_none_and_keeps_the_cache_ledger() -> None:
    ctx, fake = _context()
    slot = ctx.acquire([1, 2])
    assert slot is not None
    ctx.sync(slot, [1, 2])
    fake.codes = [draft_model._NO_KV_SLOT]  # full, and no idle cache to drop
    assert ctx.step(slot, 3) is None
    assert ctx._seen[slot] == [1, 2] and fake.removed == []
    fake.codes = [-1]  # an error is not retried
    n = len(fake.decoded)
    assert ctx.step(slot, 3) is None and len(fake.decoded) == n + 1


def _exact_top(logits: np.ndarray) -> float:
    x = logits.astype(np.float64)
    return float(np.max(np.exp(x - x.max()) / np.exp(x - x.max()).sum()))


def test_top_probability_matches_the_float64_softmax() -> None:
    rng = np.random.default_rng(0)
    for scale in (0.5, 3.0, 10.0):  # flat to peaked rows, 49k wide like SmolLM2's vocabulary
        row = (rng.standard_normal(49152) * scale).astype(np.float32)
        row[123] += 15.0
        assert _top_probability(row) == pytest.approx(_exact_top(row), rel=1e-6)


def test_top_probability_edges() -> None:
    assert _top_probability(np.array([0.0, -np.inf, 0.0], np.float32)) == pytest.approx(0.5)
    assert _top_probability(np.full(4, -np.inf, np.float32)) == 0.0
    assert _top_probability(np.array([1.0, np.nan], np.float32)) == 0.0
    assert _top_probability(np.array([3.0], np.float32)) == 1.0


def test_docstring_examples() -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(_top_probability, "_top_probability",
                            globs={"np": np, "_top_probability": _top_probability}):
        runner.run(test)
    assert runner.failures == 0
