"""Prompt lookup: longest n-gram first, most recent match, up to k continuation tokens; the
native kernel and the numpy reference agree (tests/unit/sampling/test_native_kernels.py fuzzes that)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from runtime.errors import SettingsError
from runtime.speculative.prompt_lookup import PromptLookup, ngram_lookup_reference

Lookup = Callable[[list[int], int, int, int], list[int]]
LOOKUPS: list[Lookup] = [ngram_lookup_reference,
           lambda t, lo, hi, k: PromptLookup(ngram_min=lo, ngram_max=hi).propose(t, k)]


@pytest.mark.parametrize("lookup", LOOKUPS, ids=["reference", "drafter"])
def test_docstring_example(lookup: Lookup) -> None:
    seq = [5, 6, 7, 9, 5, 6, 7, 8, 1, 5, 6, 7]
    assert lookup(seq, 2, 3, 3) == [8, 1, 5]
    assert lookup(seq, 2, 3, 10) == [8, 1, 5, 6, 7]  # the continuation runs to the end
    assert lookup([1, 2, 3], 2, 3, 3) == []


@pytest.mark.parametrize("lookup", LOOKUPS, ids=["reference", "drafter"])
def test_longest_ngram_wins_over_a_more_recent_shorter_one(lookup: Lookup) -> None:
    # "3 4" occurs recently followed by 9, but "2 3 4" (longer) occurred earlier followed by 7
    seq = [2, 3, 4, 7, 7, 3, 4, 9, 0, 2, 3, 4]
    assert lookup(seq, 2, 3, 2) == [7, 7]
    assert lookup(seq, 2, 2, 2) == [9, 0]  # only bigrams allowed: the most recent one


@pytest.mark.parametrize("lookup", LOOKUPS, ids=["reference", "drafter"])
def test_most_recent_occurrence_wins(lookup: Lookup) -> None:
    seq = [1, 2, 10, 1, 2, 20, 1, 2]
    assert lookup(seq, 2, 2, 1) == [20]
    # a self-overlapping run: the latest earlier start leaves one token to propose
    assert lookup([4, 4, 4, 4], 1, 1, 5) == [4]


@pytest.mark.parametrize("lookup", LOOKUPS, ids=["reference", "drafter"])
def test_edges(lookup: Lookup) -> None:
    assert lookup([], 1, 3, 4) == []
    assert lookup([7], 1, 1, 4) == []
    assert lookup([7, 7], 1, 1, 4) == [7]
    assert lookup([1, 2, 1, 2], 2, 4, 0) == []


def test_drafter_takes_numpy_arrays_and_validates() -> None:
    drafter = PromptLookup(ngram_min=1, ngram_max=2)
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 9], dtype=np.int32)
    assert drafter.propose(tokens, 3) == [2, 6, 5]
    assert drafter.propose(tokens.astype(np.int64), 3) == [2, 6, 5]
    with pytest.raises(SettingsError):
        PromptLookup(ngram_min=0, ngram_max=2)
    with pytest.raises(SettingsError):
        PromptLookup(ngram_min=3, ngram_max=2)
    with pytest.raises(SettingsError):
        drafter.propose(tokens, -1)
