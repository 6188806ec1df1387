"""The native step's C code (native/step.h, native/stepper.c) against the Python it replaces,
over a fake llama.cpp: `llama_decode` and `llama_get_logits` are ctypes callbacks that
record each batch and answer rows that depend only on (token, position), so the Python
reference (`Sampler`, `SamplingVerifier`, DraftModel's loop) can be given the same rows.
Seeded sampling is compared draw for draw: both read the same numpy generator."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator

import llama_cpp.llama_cpp as L
import numpy as np
import pytest

from runtime.errors import InvalidLogits
from runtime.events import SamplingParams
from runtime.llama.stepper import ERR_ALL_INF, ERR_INVALID, STEP_ABI, Doorbell
from runtime.sampling import native as kernels
from runtime.sampling.sampler import Sampler
from runtime.sampling.step_config import step_config, step_error
from runtime.speculative.api import DraftProposal
from runtime.speculative.speculation import SamplingVerifier

native = pytest.importorskip("runtime._native")
if getattr(native, "STEP_ABI", 0) != STEP_ABI:
    pytest.skip("runtime._native has no native step of this version", allow_module_level=True)

V = 64  # vocabulary
CAP = 32  # batch capacity
_DECODE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, L.llama_batch)
_LOGITS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def row(token: int, pos: int) -> np.ndarray:
    """The fake model's logits after `token` at `pos`: peaked enough that drafts of its
    own argmax are often right."""
    rng = np.random.default_rng(token * 7919 + pos)
    return (rng.normal(size=V) * 3.0).astype(np.float32)


class FakeLlama:
    """Records every batch [(token, pos, seq, logits flag)] and answers `row` for each."""

    def __init__(self, eog: tuple[int, ...] = ()) -> None:
        self.out = np.zeros((CAP, V), np.float32)
        self.batches: list[list[tuple[int, int, int, int]]] = []
        self.fail_at: int | None = None  # the decode (0-based) that returns 1
        self.poison: set[tuple[int, int]] = set()  # (token, pos) whose row holds a NaN
        self.on_decode: Callable[[int], None] | None = None  # called with the decode count

        @_DECODE
        def decode(_ctx: int, b: L.llama_batch) -> int:
            if self.fail_at is not None and len(self.batches) == self.fail_at:
                return 1
            items = [(b.token[i], b.pos[i], b.seq_id[i][0], b.logits[i]) for i in range(b.n_tokens)]
            self.batches.append(items)
            if self.on_decode is not None:
                self.on_decode(len(self.batches))
            r = 0
            for token, pos, _seq, out in items:
                if out:
                    self.out[r] = row(token, pos)
                    if (token, pos) in self.poison:
                        self.out[r, 3] = np.nan
                    r += 1
            return 0

        @_LOGITS
        def logits(_ctx: int) -> int:
            return int(self.out.ctypes.data)

        self._keep = (decode, logits)
        flags = bytes(1 if t in eog else 0 for t in range(V))
        self.stepper = native.Stepper(1, V, CAP, ctypes.cast(decode, ctypes.c_void_p).value,
                                      ctypes.cast(logits, ctypes.c_void_p).value, flags)


@pytest.fixture
def llama() -> Iterator[FakeLlama]:
    yield FakeLlama(eog=(0,))


SETTINGS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8),
            SamplingParams(temperature=1.3, top_k=0, top_p=0.9, min_p=0.0),
            SamplingParams(temperature=0.7, top_k=5, top_p=1.0, min_p=0.1)]


@pytest.mark.parametrize("params", SETTINGS, ids=["greedy", "default", "top_p", "top_k_min_p"])
def test_a_step_samples_each_sequence_as_its_sampler_does(llama: FakeLlama,
                                                          params: SamplingParams) -> None:
    ours, theirs = Sampler(params, seed=3), Sampler(params, seed=3)
    cfg = step_config(ours, "leviathan")
    assert cfg is not None
    for step in range(30):
        entries = [(s, 10 + step, (7 * s + step) % V, cfg if s == 1 else None, None)
                   for s in range(3)]
        rc, results = llama.stepper.step(entries)
        assert rc == 0 and results is not None
        assert llama.batches[-1] == [(e[2], e[1], e[0], 1) for e in entries]
        assert results[0] is None and results[2] is None  # the caller's to sample
        assert results[1] == theirs.sample(row(entries[1][2], 10 + step), [])


@pytest.mark.parametrize("params", SETTINGS[:3], ids=["greedy", "default", "top_p"])
@pytest.mark.parametrize("rule", ["leviathan", "greedy_match"])
@pytest.mark.parametrize("with_q", [False, True])
def test_a_round_is_verified_as_the_python_verifier_does(llama: FakeLlama, params: SamplingParams,
                                                         rule: str, with_q: bool) -> None:
    ours, theirs = Sampler(params, seed=9), Sampler(params, seed=9)
    draws = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), seed=1)
    verifier = SamplingVerifier(rule)  # type: ignore[arg-type]
    cfg = step_config(ours, verifier.mode(ours))
    assert cfg is not None
    accepted = set()
    for r in range(40):
        k = 1 + r % 4
        t, pos = (5 * r) % V, 20 + r
        # drafts: the fake model's own argmax two times in three, else another token
        drafts, q_rows, prev = [], [], t
        for i in range(k):
            q = draws.distribution(row(prev, pos + i) + 0.5, [])
            x = (int(np.argmax(q)) if (i + r) % 3 != 2
                 else int(np.flatnonzero(q)[r % np.count_nonzero(q)]))
            drafts.append(x)
            q_rows.append(q)
            prev = x
        q = np.stack(q_rows) if with_q and rule == "leviathan" and not params.greedy else None
        fed = (t, *drafts)
        rc, results = llama.stepper.step([(2, pos, fed, cfg, q)])
        assert rc == 0 and results is not None
        rows = np.stack([row(x, pos + i) for i, x in enumerate(fed)])
        want = verifier.verify(DraftProposal(tuple(drafts), q), rows, theirs, [])
        assert results[0] == (want.n_accepted, want.tokens)
        accepted.add(want.n_accepted)
    assert len(accepted) > 1  # both acceptances and rejections were met


def test_broken_rows_are_the_errors_the_sampler_raises(llama: FakeLlama) -> None:
    greedy = step_config(Sampler(SamplingParams(temperature=0.0), seed=1), "greedy")
    hot = step_config(Sampler(SamplingParams(temperature=0.8), seed=1), "leviathan")
    llama.poison = {(4, 0)}
    rc, results = llama.stepper.step([(0, 0, 4, greedy, None), (1, 0, 4, hot, None),
                                      (2, 0, 5, greedy, None)])
    assert rc == 0 and results is not None
    assert results[:2] == [ERR_INVALID, ERR_INVALID] and results[2] >= 0
    assert isinstance(step_error(ERR_INVALID), InvalidLogits)
    assert "-inf" in str(step_error(ERR_ALL_INF))


def test_a_refused_decode_is_its_code_and_nothing_else(llama: FakeLlama) -> None:
    llama.fail_at = 0
    cfg = step_config(Sampler(SamplingParams(temperature=0.0), seed=1), "greedy")
    assert llama.stepper.step([(0, 0, 4, cfg, None)]) == (1, None)


def test_a_run_feeds_each_token_back_until_eog_or_its_last(llama: FakeLlama) -> None:
    """Greedy chains of the fake model: the run must equal step-by-step argmax, stop a
    sequence at token 0 (end of generation) or at its `remaining`, and never decode a
    sequence after it stopped."""
    cfg = step_config(Sampler(SamplingParams(temperature=0.0), seed=1), "greedy")

    def chain(token: int, pos: int, n: int, stop_eog: bool) -> list[int]:
        out = []
        for i in range(n):
            token = int(np.argmax(row(token, pos + i)))
            out.append(token)
            if stop_eog and token == 0:
                break
        return out

    starts = [(0, 5, 11, 20, True), (1, 9, 13, 3, True), (2, 2, 17, 20, False)]
    entries = [(slot, pos, tok, cfg, remaining, eog) for slot, pos, tok, remaining, eog in starts]
    rc, steps, results = llama.stepper.run(entries, 12, 10.0, False)
    assert rc == 0
    for (_slot, pos, tok, remaining, eog), (tokens, err) in zip(starts, results, strict=True):
        assert err == 0
        assert list(tokens) == chain(tok, pos, min(remaining, steps), eog)
    assert steps == max(len(t) for t, _ in results) <= 12
    fed_by_slot: dict[int, list[int]] = {}
    for batch in llama.batches:
        for token, _pos, seq, _out in batch:
            fed_by_slot.setdefault(seq, []).append(token)
    for (slot, _pos, tok, _r, _e), (tokens, _) in zip(starts, results, strict=True):
        assert fed_by_slot[slot] == [tok, *tokens[:-1]]  # what it sampled, fed back


def test_a_run_ends_at_the_first_finish_when_asked(llama: FakeLlama) -> None:
    cfg = step_config(Sampler(SamplingParams(temperature=0.0), seed=1), "greedy")
    rc, steps, results = llama.stepper.run([(0, 0, 3, cfg, 2, True), (1, 0, 4, cfg, 20, True)],
                                           12, 10.0, True)
    assert rc == 0 and steps == 2 and [len(t) for t, _ in results] == [2, 2]


def test_a_draft_round_is_the_python_drafters_loop(llama: FakeLlama) -> None:
    """DraftModel._draft: greedy with p_min, then sampled with its q rows and one draw per
    token from the draft's generator."""
    for params, p_min in [(SamplingParams(temperature=0.0), 0.0),
                          (SamplingParams(temperature=0.0), 0.6),
                          (SamplingParams(temperature=0.9), 0.0),
                          (SamplingParams(temperature=0.9), 0.2)]:
        ours, theirs = Sampler(params, seed=4), Sampler(params, seed=4)
        cfg = step_config(ours, "leviathan")
        assert cfg is not None
        q_out = np.zeros((6, V))
        tokens, n_eval, rc, err = llama.stepper.draft(3, 40, 6, cfg, False, p_min, True, q_out,
                                                      (21, 22))
        assert (rc, err) == (0, 0)
        want, q_want, x, pos, evaluated = [], [], 22, 41, 2  # the feed, decoded first
        for i in range(6):
            logits = row(x, pos + i)
            if params.greedy:
                t = theirs.sample(logits, [])
                e = np.exp(logits.astype(np.float64) - logits.max())
                top = 1.0 / e.sum()
            else:
                q = theirs.distribution(logits, [])
                t = kernels.sample(q, theirs.uniform())
                top = q.max()
                q_want.append(q)
            if not top >= p_min:
                break
            want.append(t)
            if t == 0 or i == 5:  # end of generation, or the last one: not evaluated
                break
            evaluated += 1
            x = t
        assert list(tokens) == want and n_eval == evaluated
        if not params.greedy:
            np.testing.assert_allclose(q_out[:len(tokens)], np.stack(q_want[:len(tokens)]),
                                       rtol=1e-12, atol=1e-15)



def test_a_run_ends_after_the_step_in_which_its_doorbell_rang(llama: FakeLlama) -> None:
    """The engine rings its doorbell with each command it posts: the run stops after the
    decode in progress (here the third), not at its step or time limit; a doorbell rung
    before the run lets one step through; one never rung changes nothing."""
    cfg = step_config(Sampler(SamplingParams(temperature=0.0), seed=1), "greedy")
    bell = Doorbell()
    llama.on_decode = lambda n: bell.ring() if n == 3 else None  # during the third decode
    rc, steps, results = llama.stepper.run([(0, 0, 3, cfg, 50, False)], 40, 10.0, False,
                                           bell.address)
    assert (rc, steps, len(results[0][0])) == (0, 3, 3)
    llama.on_decode = None
    rc, steps, _ = llama.stepper.run([(0, 10, 3, cfg, 50, False)], 40, 10.0, False, bell.address)
    assert (rc, steps) == (0, 1)
    bell.clear()
    rc, steps, _ = llama.stepper.run([(0, 20, 3, cfg, 50, False)], 40, 10.0, False, bell.address)
    assert (rc, steps) == (0, 40)
