"""The constraint's state through speculative rounds (runtime.speculative.speculation):
after any mix of proposals, verdicts and rollbacks, a sequence's Constraint must mask exactly
like a fresh one fed only the accepted tokens, and every verify row must be masked with the
state after the drafts before it. Random rounds on a toy byte-level vocabulary, no model.

(A T = 0 reply under a schema that differs between plain decoding and prompt lookup is not
this: see benchmarks/constrained_speed.py — ggml's flash attention sums a single-token
decode's attention in another order than a verify batch's once the KV view reaches 512
cells, so the logits differ, not the masks.)"""

from __future__ import annotations

import json

import llguidance
import numpy as np
import pytest

from runtime.events import ConstraintSpec, SamplingParams
from runtime.sampling.constraint import Constraint, ConstraintCompiler
from runtime.sampling.sampler import Sampler
from runtime.settings.load import DraftSettings
from runtime.speculative.api import DraftProposal
from runtime.speculative.pacing import CostMemory, Pacer
from runtime.speculative.prompt_lookup import PromptLookup
from runtime.speculative.speculation import (
    NgramDrafter,
    SamplingVerifier,
    allowed_prefix,
    target_distributions,
)


class ToyTokenizer:
    """256 byte tokens, a few JSON-ish merges and an end token."""

    MERGES = (b'{"', b'":', b'", "', b"ab", b"true", b"12")

    def __init__(self) -> None:
        self.tokens = [bytes([b]) for b in range(256)] + list(self.MERGES) + [b"\xff<eos>"]
        self.eos_token_id = len(self.tokens) - 1
        self.bos_token_id = None
        self.special_token_ids = [self.eos_token_id]

    def __call__(self, data: bytes | str) -> list[int]:
        raw = data.encode() if isinstance(data, str) else data
        merges = sorted(((t, 256 + n) for n, t in enumerate(self.MERGES)), key=lambda m: -len(m[0]))
        out, i = [], 0
        while i < len(raw):
            for text, token in merges:
                if raw.startswith(text, i):
                    out.append(token)
                    i += len(text)
                    break
            else:
                out.append(raw[i])
                i += 1
        return out


TOY = ToyTokenizer()
VOCAB = len(TOY.tokens)
SCHEMA = {"type": "object", "properties": {
    "ab": {"type": "string", "maxLength": 6}, "n": {"type": "integer"},
    "ok": {"type": "boolean"},
    "xs": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
    "required": ["ab", "n", "ok", "xs"], "additionalProperties": False}
SPEC = ConstraintSpec("json_schema", json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def compiler() -> ConstraintCompiler:
    return ConstraintCompiler(llguidance.LLTokenizer(llguidance.TokenizerWrapper(TOY)))


def fresh(compiler: ConstraintCompiler, tokens: list[int]) -> Constraint:
    c = compiler.start(SPEC)
    for t in tokens:
        c.advance(t)
    return c


def walk(c: Constraint, rng: np.random.Generator, n: int) -> list[int]:
    """Up to n tokens the grammar allows from c's state (c left as it was)."""
    out: list[int] = []
    try:
        for _ in range(n):
            ids = c.allowed_ids()
            assert ids is not None
            ids = ids[ids != TOY.eos_token_id]
            if not ids.size or c.done:
                break
            t = int(rng.choice(ids))
            c.advance(t)
            out.append(t)
    finally:
        c.rollback(len(out))
    return out


def proposal_for(c: Constraint, rng: np.random.Generator) -> list[int]:
    """A draft: a valid continuation, sometimes with a token the grammar refuses in it."""
    drafts = walk(c, rng, int(rng.integers(1, 6)))
    if drafts and rng.random() < 0.4:
        drafts[int(rng.integers(len(drafts)))] = int(rng.integers(VOCAB - 1))
    return drafts


def rows_for(drafts: list[int], rng: np.random.Generator) -> np.ndarray:
    """Random logits where each draft is often the best (so rounds accept some)."""
    rows = rng.normal(size=(len(drafts) + 1, VOCAB)).astype(np.float32)
    for i, t in enumerate(drafts):
        if rng.random() < 0.7:
            rows[i, t] = 10.0
    return rows


def masked_argmax(row: np.ndarray, c: Constraint) -> int:
    ids = c.allowed_ids()
    assert ids is not None
    return int(ids[np.argmax(row[ids])])


@pytest.mark.parametrize("seed", range(8))
def test_greedy_rounds_leave_the_state_of_the_accepted_tokens(compiler: ConstraintCompiler,
                                                              seed: int) -> None:
    rng = np.random.default_rng(seed)
    c = compiler.start(SPEC)
    sampler = Sampler(SamplingParams(temperature=0.0), 0, c)
    verifier = SamplingVerifier()
    accepted: list[int] = []
    for _ in range(60):
        if c.done:
            break
        drafts = proposal_for(c, rng)
        if rng.random() < 0.5:  # the drafter's own pass over the drafts (prompt lookup)
            assert allowed_prefix(c, drafts) == drafts[:len(allowed_prefix(c, drafts))]
        rows = rows_for(drafts, rng)
        verdict = verifier.verify(DraftProposal(tuple(drafts)), rows, sampler, accepted)
        # The reference: row i masked by a fresh constraint fed accepted + drafts[:i].
        ref = fresh(compiler, accepted)
        want: list[int] = []
        for i in range(len(drafts) + 1):
            best = masked_argmax(rows[i], ref)
            want.append(best)
            if i == len(drafts) or best != drafts[i]:
                break
            ref.advance(drafts[i])
        assert list(verdict.tokens) == want
        for t in verdict.tokens:  # what the scheduler does with the verdict
            c.advance(t)
            accepted.append(t)
            if c.done:
                break
        assert np.array_equal(c.allowed(), fresh(compiler, accepted).allowed())
    assert len(accepted) > 10


@pytest.mark.parametrize("seed", range(4))
def test_each_sampled_row_is_masked_with_the_state_after_its_drafts(
        compiler: ConstraintCompiler, seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    c = compiler.start(SPEC)
    sampler = Sampler(params, seed, c)
    accepted: list[int] = []
    for _ in range(25):
        if c.done:
            break
        drafts = proposal_for(c, rng)
        rows = rows_for(drafts, rng)
        before = c.allowed()
        p = target_distributions(rows, sampler, accepted, drafts)
        assert np.array_equal(c.allowed(), before)  # rolled back
        ref = fresh(compiler, accepted)
        for i in range(len(drafts) + 1):
            expected = Sampler(params, 0, ref).distribution(rows[i], [])
            np.testing.assert_allclose(p[i], expected, rtol=0, atol=1e-12)
            if i == len(drafts) or not ref.try_advance(drafts[i]):
                break
        n_ok = len(allowed_prefix(c, drafts))
        take = drafts[:int(rng.integers(n_ok + 1))]
        for t in [*take, masked_argmax(rows[len(take)], fresh(compiler, accepted + take))]:
            c.advance(t)
            accepted.append(t)
            if c.done:
                break
        assert np.array_equal(c.allowed(), fresh(compiler, accepted).allowed())


def test_a_fork_mid_reply_verifies_on_its_own(compiler: ConstraintCompiler) -> None:
    """n > 1: the other sample's rounds never move this one's state."""
    rng = np.random.default_rng(7)
    c = compiler.start(SPEC)
    for t in TOY('{"ab": "a'):
        c.advance(t)
    twin = c.fork()
    sampler = Sampler(SamplingParams(temperature=0.0), 0, twin)
    drafts = walk(twin, rng, 4)
    verdict = SamplingVerifier().verify(DraftProposal(tuple(drafts)), rows_for(drafts, rng),
                                        sampler, [])
    for t in verdict.tokens:
        twin.advance(t)
    assert np.array_equal(c.allowed(), fresh(compiler, TOY('{"ab": "a')).allowed())


def test_prompt_lookup_drafts_the_forced_tokens_first(compiler: ConstraintCompiler) -> None:
    """After `{"ab": "x", "n": 1, "` the key "ok" is forced: those tokens lead the draft,
    and the lookup continues from after them ("ok" was seen before: `": true` follows)."""
    seen = TOY('{"ab": "x", "n": 1, "ok": true, "xs": []}')
    c = fresh(compiler, TOY('{"ab": "x", "n": 1, "'))
    assert b"".join(TOY.tokens[t] for t in c.forced()) == b"ok"
    pacer = Pacer(DraftSettings(kind="ngram", k=6), memory=CostMemory(t_plain=0.01))
    drafter = NgramDrafter(PromptLookup(1, 2), pacer, c)
    history = [*seen, *TOY('{"ab": "x", "n": 1, "')]
    proposal = drafter.propose(history, 6)
    text = b"".join(TOY.tokens[t] for t in proposal.tokens)
    assert text.startswith(b'ok": true')
    assert np.array_equal(c.allowed(), fresh(compiler, TOY('{"ab": "x", "n": 1, "')).allowed())
    assert fresh(compiler, TOY("{")).forced() == []  # whitespace may follow: nothing forced
