"""The native step's masked rows (native/step.h, `or_sample_masked`) against `Sampler` with
the same mask: over a fake llama.cpp whose `llama_decode` answers rows that depend only on
(token, position), each constrained entry goes in with `TokenMask.step_form` and must give
the token `Sampler.sample` gives for that row under a constraint whose mask is the same —
greedy and seeded (the same generator, draw for draw), allowed lists and refused lists, a
grammar vocabulary narrower than the row — and the same error where nothing can be sampled.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import cast

import llama_cpp.llama_cpp as L
import numpy as np
import pytest

from runtime.errors import ConstraintError, InvalidLogits
from runtime.events import SamplingParams
from runtime.llama.stepper import ERR_CONSTRAINT, ERR_INVALID, STEP_ABI
from runtime.sampling.constraint import Constraint
from runtime.sampling.sampler import NOTHING_ALLOWED, Sampler
from runtime.sampling.step_config import step_config, step_error
from runtime.sampling.token_mask import TokenMask

native = pytest.importorskip("runtime._native")
if getattr(native, "STEP_ABI", 0) != STEP_ABI:
    pytest.skip("runtime._native has no native step of this version", allow_module_level=True)

V = 256  # vocabulary: wide enough for top-k 40 to cut inside an allowed list
CAP = 8
_DECODE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, L.llama_batch)
_LOGITS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def row(token: int, pos: int) -> np.ndarray:
    rng = np.random.default_rng(token * 7919 + pos)
    return (rng.normal(size=V) * 3.0).astype(np.float32)


class FakeLlama:
    """Answers `row(token, pos)` for each token of a batch; `edits` overwrite a row's
    logits (token, pos) -> {id: value} (NaN, -inf) before the step samples it."""

    def __init__(self) -> None:
        self.out = np.zeros((CAP, V), np.float32)
        self.edits: dict[tuple[int, int], dict[int, float]] = {}

        @_DECODE
        def decode(_ctx: int, b: L.llama_batch) -> int:
            r = 0
            for i in range(b.n_tokens):
                if b.logits[i]:
                    self.out[r] = self.row(int(b.token[i]), int(b.pos[i]))
                    r += 1
            return 0

        @_LOGITS
        def logits(_ctx: int) -> int:
            return int(self.out.ctypes.data)

        self._keep = (decode, logits)
        self.stepper = native.Stepper(1, V, CAP, ctypes.cast(decode, ctypes.c_void_p).value,
                                      ctypes.cast(logits, ctypes.c_void_p).value, bytes(V))

    def row(self, token: int, pos: int) -> np.ndarray:
        x = row(token, pos)
        for t, v in self.edits.get((token, pos), {}).items():
            x[t] = v
        return x


class FixedMask:
    """A constraint stand-in: `mask()` is whatever the test set last (what Sampler reads)."""

    def __init__(self) -> None:
        self.current: TokenMask | None = None

    def mask(self) -> TokenMask | None:
        return self.current


def masked_sampler(params: SamplingParams, seed: int, masks: FixedMask) -> Sampler:
    """The Python reference: a Sampler whose constraint's mask is `masks.current`."""
    return Sampler(params, seed, cast(Constraint, masks))


def mask_of(allowed: np.ndarray, n_vocab: int = V) -> TokenMask:
    """The TokenMask allowing `allowed` (bool, n_vocab long), as llguidance writes it."""
    padded = np.zeros(32 * ((n_vocab + 31) // 32), bool)
    padded[:n_vocab] = allowed
    return TokenMask(np.packbits(padded, bitorder="little").view(np.int32), n_vocab)


@pytest.fixture
def llama() -> Iterator[FakeLlama]:
    yield FakeLlama()


SETTINGS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8),
            SamplingParams(temperature=1.3, top_k=0, top_p=0.9, min_p=0.0),
            SamplingParams(temperature=0.7, top_k=5, top_p=1.0, min_p=0.1),
            SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)]


def _masks(rng: np.random.Generator) -> Iterator[TokenMask]:
    """Few allowed (a structural position), most allowed (inside a string), one token, and
    a grammar vocabulary 20 tokens short of the row."""
    while True:
        yield mask_of(rng.random(V) < 0.1)
        yield mask_of(rng.random(V) < 0.95)
        yield mask_of(np.arange(V) == rng.integers(V))
        yield mask_of(rng.random(V - 20) < 0.9, n_vocab=V - 20)
        yield mask_of(rng.random(V - 20) < 0.3, n_vocab=V - 20)


@pytest.mark.parametrize("params", SETTINGS,
                         ids=["greedy", "default", "top_p", "top_k_min_p", "plain"])
def test_a_masked_row_is_sampled_as_the_sampler_samples_it(llama: FakeLlama,
                                                           params: SamplingParams) -> None:
    """Beside an unmasked native entry and one left to the caller, in one batch; the
    generators of both sides are drawn from in step (the results must agree each step)."""
    constraint = FixedMask()
    ours, theirs = Sampler(params, seed=3), masked_sampler(params, 3, constraint)
    free_ours, free_theirs = Sampler(params, seed=8), Sampler(params, seed=8)
    cfg = step_config(ours, "leviathan", masks=True)
    free_cfg = step_config(free_ours, "leviathan")
    assert cfg is not None and free_cfg is not None
    masks = _masks(np.random.default_rng(0))
    seen = {"ids": 0, "banned": 0}
    for step in range(60):
        mask = next(masks)
        seen["ids" if mask.ids is not None else "banned"] += 1
        constraint.current = mask
        pos, tokens = 10 + step, [(7 * s + step) % V for s in range(3)]
        rc, results = llama.stepper.step([
            (0, pos, tokens[0], free_cfg, None, None),
            (1, pos, tokens[1], cfg, None, mask.step_form),
            (2, pos, tokens[2], None, None)])
        assert rc == 0 and results is not None
        assert results[1] == theirs.sample(row(tokens[1], pos), [])
        assert mask.allows(results[1])
        assert results[0] == free_theirs.sample(row(tokens[0], pos), [])
        assert results[2] is None
    assert min(seen.values()) > 0


def test_a_mask_with_nothing_to_sample_is_the_samplers_constraint_error(
        llama: FakeLlama) -> None:
    """A mask that refuses every token, and one whose allowed tokens are all at -inf: the
    step's code is the ConstraintError `Sampler` raises, greedy and sampled; no uniform is
    drawn for them (the generator stays in step with Python's)."""
    for params in SETTINGS[:2]:
        constraint = FixedMask()
        ours = Sampler(params, seed=1)
        theirs = masked_sampler(params, 1, constraint)
        cfg = step_config(ours, "leviathan", masks=True)
        nothing = mask_of(np.zeros(V, bool))
        some = mask_of(np.isin(np.arange(V), (5, 9)))
        dead = mask_of(np.arange(V) > 3)  # a refused list: every token above 3
        llama.edits = {(4, 0): {5: -np.inf, 9: -np.inf}, (6, 0): {t: -np.inf for t in range(4, V)}}
        for mask, token in ((nothing, 2), (some, 4), (dead, 6)):
            constraint.current = mask
            rc, results = llama.stepper.step([(0, 0, token, cfg, None, mask.step_form)])
            assert rc == 0 and results == [ERR_CONSTRAINT]
            with pytest.raises(ConstraintError) as python:
                theirs.sample(llama.row(token, 0), [])
            native_error = step_error(ERR_CONSTRAINT)
            assert isinstance(native_error, ConstraintError)
            assert str(native_error) == str(python.value) == NOTHING_ALLOWED
        assert ours.rng.random() == theirs.rng.random()  # neither drew


def test_nan_among_the_allowed_is_invalid_and_among_the_refused_is_not(
        llama: FakeLlama) -> None:
    """As `Sampler.prepared`: the mask comes first, so a NaN the mask refuses is never read."""
    for params in SETTINGS[:2]:
        constraint = FixedMask()
        ours = Sampler(params, seed=2)
        theirs = masked_sampler(params, 2, constraint)
        cfg = step_config(ours, "leviathan", masks=True)
        llama.edits = {(4, 0): {3: np.nan}}
        ids = np.arange(V)
        for mask, fails in ((mask_of(ids < 50), True), (mask_of(ids > 10), False),
                            (mask_of(ids != 3), False), (mask_of(ids != 7), True)):
            constraint.current = mask
            rc, results = llama.stepper.step([(0, 0, 4, cfg, None, mask.step_form)])
            assert rc == 0 and results is not None
            if fails:
                assert results == [ERR_INVALID]
                with pytest.raises(InvalidLogits):
                    theirs.sample(llama.row(4, 0), [])
            else:
                assert results == [theirs.sample(llama.row(4, 0), [])]


def test_a_mask_goes_with_one_fed_token_and_a_cfg(llama: FakeLlama) -> None:
    cfg = step_config(Sampler(SamplingParams(temperature=0.0), seed=1), "greedy")
    form = mask_of(np.arange(V) < 3).step_form
    with pytest.raises(ValueError, match="one fed token"):
        llama.stepper.step([(0, 0, (4, 5), cfg, None, form)])
    with pytest.raises(ValueError, match="one fed token"):
        llama.stepper.step([(0, 0, 4, None, None, form)])
    with pytest.raises(TypeError, match="int64"):
        llama.stepper.step([(0, 0, 4, cfg, None, (True, np.arange(3, dtype=np.int32), V))])


def test_a_constrained_sampler_goes_native_only_where_the_masks_are_given() -> None:
    """A draft model's round gets no masks: its constrained sampler stays Python's."""
    sampler = masked_sampler(SamplingParams(temperature=0.5), 1, FixedMask())
    assert step_config(sampler, "leviathan") is None
    cfg = step_config(sampler, "leviathan", masks=True)
    assert cfg is not None and cfg[:5] == (1, 0.5, 40, 0.95, 0.05)
    penalised = masked_sampler(SamplingParams(repeat_penalty=1.2), 1, FixedMask())
    assert step_config(penalised, "leviathan", masks=True) is None
