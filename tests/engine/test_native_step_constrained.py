"""Constrained sequences through the native decode step (runtime.engine.native_step) against
the Python step (OUTRIDER_NATIVE_STEP=0), the reference: the same tokens for a JSON schema
and a GBNF grammar, greedy and seeded at T = 0.8, alone, batched with a free sequence, and
with prompt lookup; the native path samples every plain constrained token in C (Python's
sampler never sees one); and a mask that leaves nothing to sample, or that cannot be
computed, ends the request with the same error on both paths while its neighbour carries on
unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.engine.engine import Engine
from runtime.engine.native_step import NativeStep
from runtime.errors import ConstraintError
from runtime.events import (
    ConstraintSpec,
    ErrorEvent,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.llama.stepper import ENV_SWITCH
from runtime.sampling.constraint import Constraint
from runtime.sampling.sampler import NOTHING_ALLOWED, Sampler
from runtime.sampling.token_mask import TokenMask
from runtime.settings.load import DraftSettings
from runtime.speculative.speculation import Speculation
from tests.engine.test_constrained import JSON_SPEC
from tests.engine.test_losslessness_engine import settings_for

# five items at least: greedy stops at the first "]" it may write
GBNF_SPEC = ConstraintSpec("gbnf", 'root ::= "[" item ("," item)* "]"\n'
                                   'item ::= [a-z] [a-z]? [a-z]? "," [a-z]+ "," [0-9]+ "," [a-z]+')
GREEDY = SamplingParams(temperature=0.0, max_tokens=300)
WARM = SamplingParams(temperature=0.8, max_tokens=300, seed=4)
FREE = SamplingParams(temperature=0.8, max_tokens=60, seed=9)


@dataclass(frozen=True)
class Case:
    requests: tuple[GenerationRequest, ...]
    draft: DraftSettings = field(default_factory=DraftSettings)


def _req(prompt: str, sampling: SamplingParams, spec: ConstraintSpec | None = None,
         ) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, sampling=sampling, constraint=spec)


CASES = {
    "json greedy": Case((_req("Hello", GREEDY, JSON_SPEC),)),
    "json sampled": Case((_req("Hello", WARM, JSON_SPEC),)),
    "gbnf greedy": Case((_req("List", GREEDY, GBNF_SPEC),)),
    "gbnf sampled": Case((_req("List", replace(WARM, seed=2), GBNF_SPEC),)),
    # continuous batching: constrained and free sequences in one step
    "batched": Case((_req("Hello", WARM, JSON_SPEC), _req("the cat went", FREE),
                     _req("List", GREEDY, GBNF_SPEC),
                     _req("Hi", replace(WARM, seed=6), JSON_SPEC))),
    # prompt lookup's rounds are verified in Python, its plain tokens sampled in C
    "json with prompt lookup": Case((_req("Hello", GREEDY, JSON_SPEC),),
                                    DraftSettings(kind="ngram", k=3, ngram_min=1, ngram_max=3)),
}


def _run(requests: tuple[GenerationRequest, ...], target: Path, native: bool,
         monkeypatch: pytest.MonkeyPatch, draft: DraftSettings | None = None,
         ) -> tuple[list[list[int]], list[Any], int, int]:
    """Each request's tokens and last event, the native step's decodes, and how many
    constrained tokens `Sampler.sample` drew (Python's sampler)."""
    monkeypatch.setenv(ENV_SWITCH, "1" if native else "0")
    python_samples = 0
    real_sample = Sampler.sample

    def counted(self: Sampler, row: np.ndarray, history: Any) -> int:
        nonlocal python_samples
        python_samples += self.constraint is not None
        return real_sample(self, row, history)

    monkeypatch.setattr(Sampler, "sample", counted)
    engine = Engine(speculation=Speculation())
    try:
        info = engine.load(settings_for(target, n_ctx=1024, n_parallel=len(requests),
                                        draft=draft or DraftSettings()))
        assert info.draft_refused is None
        handles = [engine.submit(r) for r in requests]
        tokens, last = [], []
        for handle in handles:
            events = list(handle.events(timeout=120))
            tokens.append([e.token_id for e in events if isinstance(e, TokenEvent)])
            last.append(events[-1])
        loaded = engine._loaded
        assert loaded is not None
        step = loaded.scheduler.native
        decodes = step.timings().decodes if isinstance(step, NativeStep) else 0
        return tokens, last, decodes, python_samples
    finally:
        engine.stop()
        monkeypatch.setattr(Sampler, "sample", real_sample)


@pytest.mark.parametrize("name", list(CASES))
def test_constrained_tokens_are_the_same_on_both_paths(name: str, tiny_target: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    native, native_last, decodes, in_python = _run(case.requests, tiny_target, True,
                                                   monkeypatch, case.draft)
    python, python_last, none, reference = _run(case.requests, tiny_target, False,
                                                monkeypatch, case.draft)
    assert decodes > 0 and none == 0  # each path really ran
    assert native == python
    for a, b in zip(native_last, python_last, strict=True):
        assert isinstance(a, Finished) and isinstance(b, Finished)
        assert a.reason == b.reason
    assert reference > 0
    constrained = [t for t, r in zip(native, case.requests, strict=True) if r.constraint]
    assert all(len(t) > 3 for t in constrained)
    if case.draft.kind == "none":  # C sampled every constrained token but those sampled in
        # a step that evaluated a prompt (Python's): each reply's first, and in the batch a
        # few whose step admitted another request
        assert in_python <= 2 * len(case.requests) < sum(map(len, constrained)) // 4


EMPTY_AT = 3  # the constrained reply's token at which the patched mask gives out


def _mask_that_gives_out(kind: str) -> Any:
    real_mask = Constraint.mask

    def mask(self: Constraint) -> TokenMask | None:
        m = real_mask(self)
        if len(self._tokens) < EMPTY_AT or m is None:
            return m
        if kind == "raises":
            raise ConstraintError("the grammar allows no token here")
        return TokenMask(np.zeros_like(m.bits), m.n_vocab)  # refuses every token

    return mask


@pytest.mark.parametrize("kind", ["refuses all", "raises"])
def test_a_mask_that_leaves_nothing_fails_that_request_alike_on_both_paths(
        kind: str, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler's ConstraintError (a mask refusing everything: the C step's
    ERR_CONSTRAINT) and the constraint's own (a mask that cannot be computed: raised
    before the native step's decode, after the Python step's): the same tokens before it,
    the same error event, and the free neighbour's reply unchanged."""
    monkeypatch.setattr(Constraint, "mask", _mask_that_gives_out(kind))
    requests = (_req("Hello", WARM, JSON_SPEC), _req("the cat went", FREE))
    native, native_last, decodes, _ = _run(requests, tiny_target, True, monkeypatch)
    python, python_last, _, _ = _run(requests, tiny_target, False, monkeypatch)
    assert decodes > 0
    assert native == python and len(native[0]) == EMPTY_AT
    for last in (native_last[0], python_last[0]):
        assert isinstance(last, ErrorEvent) and last.kind == "ConstraintError"
    assert native_last[0].message == python_last[0].message
    if kind == "refuses all":
        assert native_last[0].message == NOTHING_ALLOWED
    assert isinstance(native_last[1], Finished) and isinstance(python_last[1], Finished)
    assert len(native[1]) == FREE.max_tokens or native_last[1].reason == "stop"
