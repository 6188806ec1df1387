"""Per-sequence sampling (runtime.sampling.sampler): greedy, seeds, penalties, and the candidate
fast path agreeing exactly with the reference kernels on the full row."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.errors import InvalidLogits
from runtime.events import SamplingParams
from runtime.sampling import kernels
from runtime.sampling.sampler import Sampler

VOCAB = 4000


def row(seed: int, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(VOCAB) * scale).astype(np.float32)


def reference(params: SamplingParams, logits: np.ndarray, history: list[int]) -> np.ndarray:
    x = kernels.apply_penalties(logits, history, repeat_penalty=params.repeat_penalty,
                                frequency_penalty=params.frequency_penalty,
                                presence_penalty=params.presence_penalty,
                                last_n=params.penalty_last_n)
    return kernels.transform(x, temperature=params.temperature, top_k=params.top_k,
                             top_p=params.top_p, min_p=params.min_p)


def test_greedy_is_argmax_lowest_id_on_ties() -> None:
    s = Sampler(SamplingParams(temperature=0.0), seed=None)
    assert s.sample(np.array([0.0, 3.0, 3.0, 1.0], np.float32), []) == 1


def test_greedy_with_penalties_uses_the_penalised_row() -> None:
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0), seed=None)
    logits = np.array([0.0, 3.0, 2.0], np.float32)
    assert s.sample(logits, [1]) == 2  # 3.0 / 2 < 2.0


PARAMS = [
    SamplingParams(),  # the defaults: top-k 40, top-p 0.95, min-p 0.05
    SamplingParams(temperature=1.3, top_k=5, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=0, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=0.8, top_k=50, repeat_penalty=1.3, frequency_penalty=0.2,
                   presence_penalty=0.1, penalty_last_n=16),
]


@pytest.mark.parametrize("params", PARAMS)
def test_distribution_equals_the_full_row_reference(params: SamplingParams) -> None:
    history = [3, 17, 17, 99, 3000]
    for seed in range(5):
        logits = row(seed)
        got = Sampler(params, seed=0).distribution(logits, history)
        want = reference(params, logits, history)
        assert got.shape == (VOCAB,)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_distribution_keeps_every_tie_at_the_top_k_boundary() -> None:
    logits = np.zeros(VOCAB, np.float32)
    logits[[10, 20, 30]] = 5.0  # three-way tie for top-2: the two lowest ids stay
    p = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0), 0).distribution(logits, [])
    assert np.flatnonzero(p).tolist() == [10, 20]


@pytest.mark.parametrize("params", PARAMS)
def test_sample_draws_what_the_reference_would_draw(params: SamplingParams) -> None:
    logits = row(7)
    a = Sampler(params, seed=123)
    draws = [a.sample(logits, [1, 2]) for _ in range(50)]
    b = np.random.default_rng(123)
    p = reference(params, logits, [1, 2])
    assert draws == [kernels.sample(p, float(b.random())) for _ in range(50)]


def test_seeded_sampling_is_reproducible_and_seeds_differ() -> None:
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    logits = row(1, scale=0.5)
    runs = [[Sampler(params, seed).sample(logits, []) for _ in range(1)] for seed in (1, 1)]
    assert runs[0] == runs[1]
    s1, s2 = Sampler(params, 1), Sampler(params, 2)
    assert [s1.sample(logits, []) for _ in range(20)] != [s2.sample(logits, []) for _ in range(20)]


def test_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), seed=5)
    counts = np.bincount([s.sample(logits, []) for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.2], atol=0.03)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_logits_are_a_clear_error(temperature: float, bad: float) -> None:
    logits = row(0)
    logits[5] = bad
    with pytest.raises(InvalidLogits, match=r"^the model produced invalid numbers \(NaN\)$"):
        Sampler(SamplingParams(temperature=temperature), 0).sample(logits, [])


def test_a_top_k_beyond_the_vocabulary_means_off() -> None:
    """2**64 used to overflow the native kernel's C int and fail the whole batched step."""
    logits = row(1)
    params = SamplingParams(temperature=1.0, top_k=2**31 - 1, top_p=1.0, min_p=0.0)
    off = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    np.testing.assert_allclose(Sampler(params, 0).distribution(logits, []),
                               Sampler(off, 0).distribution(logits, []))


def test_logits_view_is_not_modified() -> None:
    logits = row(3)
    before = logits.copy()
    s = Sampler(SamplingParams(repeat_penalty=1.5, presence_penalty=0.5), 0)
    s.sample(logits, [1, 2, 3])
    s.distribution(logits, [1, 2, 3])
    np.testing.assert_array_equal(logits, before)
