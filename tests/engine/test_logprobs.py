"""Logprobs through the engine on the tiny GGUFs: each token's logprob is the one of the
distribution it was sampled from (runtime.sampling.sampler's definition), checked against
every prefix evaluated alone; top lists are sorted, finite and sum to at most 1; greedy uses
the T = 1 log-softmax of the penalised, masked logits; tokens accepted from a draft carry
them too; nothing is computed when nothing was asked."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from runtime.engine.engine import Engine
from runtime.events import (
    ConstraintSpec,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.llama.binding import Batch, LlamaContext, LlamaModel
from runtime.llama.params import to_llama_params
from runtime.sampling import kernels
from runtime.sampling.constraint import ConstraintCompiler
from runtime.sampling.sampler import Sampler
from runtime.settings.load import DraftSettings
from runtime.speculative.speculation import Speculation
from tests.engine.test_losslessness_engine import settings_for

PROMPT = "The cat sat on"
FILTERED = SamplingParams(temperature=0.8, top_k=6, top_p=0.9, min_p=0.02, repeat_penalty=1.2,
                          max_tokens=24, ignore_eos=True, seed=3)
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.1, max_tokens=24, ignore_eos=True)


class Reference:
    """The target evaluated from scratch for every prefix, on its own context."""

    def __init__(self, path: Path) -> None:
        lp = to_llama_params(settings_for(path), 0)
        self.model = LlamaModel.load(path, lp)
        self.ctx = LlamaContext(self.model, lp)
        self.batch = Batch(256)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        self.ctx.seq_rm(0, 0, -1)
        self.batch.clear()
        self.batch.add_tokens(list(tokens), 0, 0, True)
        assert self.ctx.decode(self.batch) == 0
        return self.ctx.logits(1)[0].copy()

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


@pytest.fixture(scope="module")
def reference(tiny_target: Path) -> Iterator[Reference]:
    ref = Reference(tiny_target)
    yield ref
    ref.close()


@pytest.fixture(scope="module")
def engine(tiny_target: Path) -> Iterator[Engine]:
    eng = Engine()
    eng.load(settings_for(tiny_target, n_parallel=2))
    yield eng
    eng.stop()


def token_events(engine: Engine, request: GenerationRequest) -> list[TokenEvent]:
    events = list(engine.submit(request).events(timeout=120))
    assert isinstance(events[-1], Finished), events[-1]
    return [e for e in events if isinstance(e, TokenEvent)]


def check_top_list(event: TokenEvent, n: int) -> None:
    top = event.top_logprobs
    assert 1 <= len(top) <= n
    values = [t.logprob for t in top]
    assert all(math.isfinite(v) and v <= 0.0 for v in values)
    assert values == sorted(values, reverse=True)
    assert sum(math.exp(v) for v in values) <= 1.0 + 1e-9
    assert len({t.token_id for t in top}) == len(top)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x[np.isfinite(x)].max()
    return x - (m + math.log(float(np.exp(x - m).sum())))


# ---- the definition --------------------------------------------------------------------------

def test_logprobs_at_temperature_are_those_of_the_final_distribution(
        engine: Engine, reference: Reference) -> None:
    events = token_events(engine, GenerationRequest(prompt=PROMPT, sampling=FILTERED,
                                                    logprobs=5))
    tokens = reference.model.tokenize(PROMPT)
    sampler = Sampler(FILTERED, 0)
    for event in events:
        assert event.logprob is not None and event.logprob.token_id == event.token_id
        check_top_list(event, 5)
        dist = sampler.distribution(reference.logits(tokens), tokens)
        assert event.logprob.logprob == pytest.approx(math.log(dist[event.token_id]), abs=1e-5)
        kept = np.flatnonzero(dist > 0)  # what top-k/top-p/min-p left: nothing else listed
        assert {t.token_id for t in event.top_logprobs} <= set(kept.tolist())
        best = sorted(kept.tolist(), key=lambda t: (-dist[t], t))[:5]
        assert [t.token_id for t in event.top_logprobs] == best
        for t in event.top_logprobs:
            assert t.logprob == pytest.approx(math.log(dist[t.token_id]), abs=1e-5)
        tokens.append(event.token_id)


def test_greedy_logprobs_are_the_t1_log_softmax_of_the_penalised_logits(
        engine: Engine, reference: Reference) -> None:
    events = token_events(engine, GenerationRequest(prompt=PROMPT, sampling=GREEDY, logprobs=3))
    tokens = reference.model.tokenize(PROMPT)
    for event in events:
        row = kernels.apply_penalties(reference.logits(tokens), tokens,
                                      repeat_penalty=GREEDY.repeat_penalty,
                                      last_n=GREEDY.penalty_last_n)
        want = log_softmax(row)
        assert event.logprob is not None
        assert event.logprob.logprob == pytest.approx(want[event.token_id], abs=1e-5)
        assert event.top_logprobs[0].token_id == event.token_id  # the argmax
        check_top_list(event, 3)
        assert [t.logprob for t in event.top_logprobs] == pytest.approx(
            sorted(want, reverse=True)[:3], abs=1e-5)
        tokens.append(event.token_id)


def test_logprobs_under_a_constraint_are_over_the_masked_distribution(
        engine: Engine, reference: Reference) -> None:
    """Ten digits allowed: the top 20 list holds exactly them, and their mass is all of it."""
    request = GenerationRequest(prompt=PROMPT, sampling=dataclasses.replace(GREEDY, ignore_eos=False),
                                logprobs=20, constraint=ConstraintSpec("regex", "[0-9]{6}"))
    events = token_events(engine, request)
    assert "".join(e.text for e in events).isdigit()
    digits = set(b"0123456789")
    compiler = ConstraintCompiler.from_llama(reference.model)
    constraint = compiler.start(ConstraintSpec("regex", "[0-9]{6}"))
    tokens = reference.model.tokenize(PROMPT)
    for event in events:
        assert {t.piece for t in event.top_logprobs} == {bytes([d]) for d in digits}
        assert sum(math.exp(t.logprob) for t in event.top_logprobs) == pytest.approx(1.0, abs=1e-6)
        mask = constraint.allowed()
        assert mask is not None
        row = kernels.apply_penalties(reference.logits(tokens), tokens,
                                      repeat_penalty=GREEDY.repeat_penalty,
                                      last_n=GREEDY.penalty_last_n)
        want = log_softmax(np.where(mask, row, -np.inf))
        assert event.logprob is not None
        assert event.logprob.logprob == pytest.approx(want[event.token_id], abs=1e-5)
        constraint.advance(event.token_id)
        tokens.append(event.token_id)


def test_pieces_are_the_tokens_bytes(engine: Engine, reference: Reference) -> None:
    """The text piece; for a control token (which prints as nothing) its vocabulary text."""
    model = reference.model
    events = token_events(engine, GenerationRequest(prompt=PROMPT, sampling=FILTERED, logprobs=4))
    seen_control = False
    for event in events:
        assert event.logprob is not None
        for t in (event.logprob, *event.top_logprobs):
            if model.piece(t.token_id):
                assert t.piece == model.piece(t.token_id)
            else:
                seen_control = True
                assert t.piece == model.token_text(t.token_id).encode() != b""
    assert seen_control  # this prompt meets <|im_end|> (ignore_eos keeps it going)


def test_zero_asks_for_the_sampled_token_only_and_none_for_nothing(engine: Engine) -> None:
    only = token_events(engine, GenerationRequest(prompt=PROMPT, sampling=FILTERED, logprobs=0))
    assert all(e.logprob is not None and e.top_logprobs == () for e in only)
    off = token_events(engine, GenerationRequest(prompt=PROMPT, sampling=FILTERED))
    assert all(e.logprob is None and e.top_logprobs == () for e in off)
    assert [e.token_id for e in only] == [e.token_id for e in off]  # asking changes nothing


# ---- tokens accepted from a draft ------------------------------------------------------------

@pytest.mark.parametrize("draft_kind", ["model", "ngram"])
def test_tokens_accepted_from_a_draft_carry_their_logprobs(
        tiny_target: Path, reference: Reference, draft_kind: str) -> None:
    """The target drafting for itself (or prompt lookup over a repetitive prompt) at T > 0:
    drafts are accepted, and each emitted token's logprob is that of the verify row it was
    judged by — the same as evaluating its prefix alone."""
    if draft_kind == "model":
        draft = DraftSettings(kind="model", model_path=tiny_target, k=3, p_min=0.0)
        prompt = PROMPT
    else:
        draft = DraftSettings(kind="ngram", k=3, ngram_min=1, ngram_max=2)
        prompt = "ab ab ab ab ab ab ab ab ab ab ab ab a"
    sampling = dataclasses.replace(FILTERED, repeat_penalty=1.0, max_tokens=40)
    eng = Engine(speculation=Speculation())
    try:
        eng.load(settings_for(tiny_target, n_parallel=2, draft=draft))
        events = token_events(eng, GenerationRequest(prompt=prompt, sampling=sampling,
                                                     logprobs=2))
    finally:
        eng.stop()
    assert any(e.from_draft for e in events)
    tokens = reference.model.tokenize(prompt)
    sampler = Sampler(sampling, 0)
    for event in events:
        assert event.logprob is not None
        check_top_list(event, 2)
        dist = sampler.distribution(reference.logits(tokens), tokens)
        assert event.logprob.logprob == pytest.approx(math.log(dist[event.token_id]), abs=1e-5)
        tokens.append(event.token_id)
