"""runtime.sampling.token_mask, and the sampler applying a mask either way it is kept: the
allowed ids (few allowed) or the refused ones (most allowed) must give what the full row with
every refused logit at -inf gives — the same token, distribution and logprobs."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.errors import ConstraintError
from runtime.events import SamplingParams
from runtime.sampling.sampler import Sampler
from runtime.sampling.token_mask import MaskTable, TokenMask

N = 300


def bits_of(allowed: np.ndarray) -> np.ndarray:
    """llguidance's layout: bit t % 32 of int32 word t // 32."""
    padded = np.zeros(-(-allowed.size // 32) * 32, dtype=bool)
    padded[:allowed.size] = allowed
    return np.packbits(padded, bitorder="little").view(np.int32)


class Fixed:
    """A constraint that stays at one mask (what the sampler reads of a Constraint)."""

    def __init__(self, mask: TokenMask) -> None:
        self._mask = mask

    def mask(self) -> TokenMask:
        return self._mask


def random_allowed(rng: np.random.Generator, share: float) -> np.ndarray:
    allowed = rng.random(N) < share
    allowed[int(rng.integers(N))] = True
    return allowed


@pytest.mark.parametrize("share", [0.01, 0.3, 0.7, 0.99])
def test_a_mask_reads_back_what_it_was_given(share: float) -> None:
    rng = np.random.default_rng(int(share * 100))
    allowed = random_allowed(rng, share)
    mask = TokenMask(bits_of(allowed), N)
    assert mask.count == allowed.sum()
    assert np.array_equal(mask.as_bool(), allowed)
    assert np.array_equal(mask.allowed_ids(), np.flatnonzero(allowed))
    assert [mask.allows(t) for t in range(N)] == allowed.tolist()
    assert not mask.allows(-1) and not mask.allows(N) and not mask.allows(N + 5)
    if 2 * mask.count <= N:
        assert mask.banned is None and mask.ids is not None
    else:
        assert mask.ids is None  # still, after allowed_ids()
        assert mask.banned is not None and np.array_equal(mask.banned, np.flatnonzero(~allowed))
    assert not mask.as_bool().flags.writeable and not mask.bits.flags.writeable


def test_the_table_shares_equal_masks_and_forgets_the_oldest() -> None:
    table = MaskTable(N, size=2)
    rng = np.random.default_rng(1)
    a, b, c = (bits_of(random_allowed(rng, 0.5)) for _ in range(3))
    first = table.get(a)
    assert table.get(a.copy()) is first  # same bytes, same object
    table.get(b)
    table.get(c)  # a is the least recently used: dropped
    assert len(table) == 2
    assert table.get(a) is not first


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8),  # top-k 40, top-p 0.95, min-p 0.05
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=0.7, top_k=0, top_p=0.9, min_p=0.0),
    SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=500, top_p=1.0, min_p=0.0),  # k over the allowed
    SamplingParams(temperature=0.8, repeat_penalty=1.3, penalty_last_n=8),
]


@pytest.mark.parametrize("share", [0.05, 0.95])
@pytest.mark.parametrize("params", PARAMS)
def test_either_form_of_a_mask_samples_like_the_row_at_minus_inf(
        share: float, params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    history = [3, 5, 5, 9]
    for _ in range(10):
        allowed = random_allowed(rng, share)
        row = rng.normal(scale=3.0, size=N).astype(np.float32)
        row[int(rng.integers(N))] = row.max() + 0.5  # a clear best, allowed or not
        reference = row.copy()
        reference[~allowed] = -np.inf
        seed = int(rng.integers(1 << 30))
        masked = Sampler(params, seed, Fixed(TokenMask(bits_of(allowed), N)))  # type: ignore[arg-type]
        free = Sampler(params, seed)
        before = row.copy()
        assert masked.sample(row, history) == free.sample(reference, history)
        np.testing.assert_allclose(masked.distribution(row, history),
                                   free.distribution(reference, history), rtol=1e-12, atol=0)
        token = int(np.flatnonzero(allowed)[0])
        got, top = masked.logprobs(row, history, token, 5)
        want, want_top = free.logprobs(reference, history, token, 5)
        assert got == pytest.approx(want, abs=1e-9)
        assert [t for t, _ in top] == [t for t, _ in want_top]
        assert np.array_equal(row, before)  # the logits themselves are never written


@pytest.mark.parametrize("share", [0.05, 0.95])
def test_rows_narrower_or_wider_than_the_vocabulary(share: float) -> None:
    """A draft model's row may be shorter than the grammar's vocabulary (its ids past the
    row are dropped), a padded row longer (its extra ids are never allowed)."""
    rng = np.random.default_rng(3)
    allowed = random_allowed(rng, share)
    mask = TokenMask(bits_of(allowed), N)
    greedy = Sampler(SamplingParams(temperature=0.0), 0, Fixed(mask))  # type: ignore[arg-type]
    short = rng.normal(size=N - 50).astype(np.float32)
    assert allowed[greedy.sample(short, [])]
    wide = rng.normal(size=N + 20).astype(np.float32)
    wide[N:] = 100.0
    assert greedy.sample(wide, []) < N and allowed[greedy.sample(wide, [])]


def test_every_allowed_token_at_minus_inf_is_a_constraint_error() -> None:
    allowed = np.ones(N, dtype=bool)
    allowed[:3] = False
    row = np.full(N, -np.inf, dtype=np.float32)
    row[:3] = 1.0  # only refused tokens are finite
    mask = TokenMask(bits_of(allowed), N)
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)):
        with pytest.raises(ConstraintError):
            Sampler(params, 0, Fixed(mask)).sample(row, [])  # type: ignore[arg-type]
