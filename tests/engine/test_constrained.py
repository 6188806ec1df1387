"""Constrained decoding through the engine on the tiny GGUFs (random weights: the text is
garbage, but it must match the grammar): JSON Schema, regex, GBNF, n > 1, prefix sharing,
lazy triggers, speculative decoding (token-identical at T = 0, lossless at T > 0 by the
method of test_losslessness_engine), bad input, and unconstrained neighbours unaffected."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from runtime.engine.engine import Engine
from runtime.events import (
    ConstraintSpec,
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    SamplingParams,
    StepStats,
    TokenEvent,
)
from runtime.llama.binding import Batch, LlamaContext, LlamaModel
from runtime.llama.params import to_llama_params
from runtime.sampling.constraint import Constraint, ConstraintCompiler
from runtime.sampling.sampler import Sampler
from runtime.sampling.token_mask import TokenMask
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.api import DraftProposal, DraftVerdict, SpecSetup
from runtime.speculative.pacing import CostMemory, Pacer
from runtime.speculative.prompt_lookup import PromptLookup
from runtime.speculative.speculation import NgramDrafter, SamplingVerifier, Speculation
from tests.conftest import tiny_model_path
from tests.engine.test_losslessness_engine import (
    ALPHA,
    LOOKUP_SAMPLING,
    N_TOKENS,
    NEAR_DRAFT,
    PROMPT,
    SAMPLING,
    N,
    chi_square_p,
    settings_for,
)

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 999},
    "ok": {"type": "boolean"}, "kind": {"enum": ["cat", "dog"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2}},
    "required": ["name", "age", "ok", "kind", "tags"], "additionalProperties": False}
JSON_SPEC = ConstraintSpec("json_schema", json.dumps(SCHEMA))
# Keys repeat (prompt lookup has something to find); short strings keep replies short.
ROWS = {"type": "array", "minItems": 3, "maxItems": 3, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
                                     "id": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["name", "id"], "additionalProperties": False}}
ROWS_SPEC = ConstraintSpec("json_schema", json.dumps(ROWS))
WARM = SamplingParams(temperature=0.8, max_tokens=300)
GREEDY = SamplingParams(temperature=0.0, max_tokens=200)
# The tiny target's greedy reply to "Hello" (without a constraint) begins
# f7 16 '9' aa 0f 'a' e1 c3 'f' 18 'f' c6 'er' ...: no "e" or "r" before the token "er".
HELLO_ER = 12


def reply(engine: Engine, request: GenerationRequest) -> tuple[list[list[int]], list[str], list[Finished]]:
    """Tokens, text and the Finished event of each sample."""
    tokens: list[list[int]] = [[] for _ in range(request.n)]
    texts = [""] * request.n
    done: list[Finished] = []
    for event in engine.submit(request).events(timeout=120):
        if isinstance(event, TokenEvent):
            tokens[event.index].append(event.token_id)
            texts[event.index] += event.text
        elif isinstance(event, Finished):
            done.append(event)
        else:
            assert isinstance(event, StepStats), event
    return tokens, texts, sorted(done, key=lambda f: f.index)


def events_of(engine: Engine, request: GenerationRequest) -> list[Event]:
    return list(engine.submit(request).events(timeout=120))


@pytest.fixture(scope="module")
def engine(tiny_target: Path) -> Iterator[Engine]:
    eng = Engine()
    eng.load(settings_for(tiny_target, n_ctx=2048, n_parallel=4))
    yield eng
    eng.stop()


def load(settings: LoadSettings, speculation: Speculation | None = None) -> Iterator[Engine]:
    eng = Engine(speculation=speculation)
    try:
        info = eng.load(settings)
        assert info.draft_refused is None
        yield eng
    finally:
        eng.stop()


# ---- what comes out matches -------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_json_schema_output_validates(engine: Engine, seed: int) -> None:
    sampling = dataclasses.replace(WARM, seed=seed)
    _, texts, done = reply(engine, GenerationRequest(prompt="Hello", sampling=sampling,
                                                     constraint=JSON_SPEC))
    assert done[0].reason == "stop"
    jsonschema.validate(json.loads(texts[0]), SCHEMA)


def test_json_object_is_an_object(engine: Engine) -> None:
    sampling = dataclasses.replace(WARM, seed=7, max_tokens=400)
    _, texts, done = reply(engine, GenerationRequest(prompt="Hi", sampling=sampling,
                                                     constraint=ConstraintSpec("json_object")))
    if done[0].reason == "stop":  # an object may nest deeper than 400 tokens; never invalid
        assert isinstance(json.loads(texts[0]), dict)
    else:
        assert texts[0].startswith("{")


def test_regex_output_matches(engine: Engine) -> None:
    pattern = r"(yes|no)-[0-9]{2}[a-c]?"
    for seed in range(3):
        _, texts, done = reply(engine, GenerationRequest(
            prompt="Answer", sampling=dataclasses.replace(WARM, seed=seed),
            constraint=ConstraintSpec("regex", pattern)))
        assert done[0].reason == "stop" and re.fullmatch(pattern, texts[0]), texts[0]


def test_gbnf_output_matches(engine: Engine) -> None:
    grammar = 'root ::= "[" item ("," item)* "]"\nitem ::= [a-z] [a-z]? [a-z]?'
    for seed in range(3):
        _, texts, done = reply(engine, GenerationRequest(
            prompt="List", sampling=dataclasses.replace(WARM, seed=seed, max_tokens=100),
            constraint=ConstraintSpec("gbnf", grammar)))
        if done[0].reason == "stop":
            assert re.fullmatch(r"\[[a-z]{1,3}(,[a-z]{1,3})*\]", texts[0]), texts[0]
        else:  # the list may go on past max_tokens; what there is still fits
            assert re.fullmatch(r"\[[a-z]{1,3}(,[a-z]{1,3})*,?[a-z]{0,3}", texts[0]), texts[0]


def test_each_of_n_samples_is_valid_and_its_own(engine: Engine) -> None:
    sampling = dataclasses.replace(WARM, seed=11)
    _, texts, done = reply(engine, GenerationRequest(prompt="Hello", sampling=sampling, n=4,
                                                     constraint=JSON_SPEC))
    assert [f.reason for f in done] == ["stop"] * 4
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1  # independent grammar states, not one shared


def test_prefix_sharing_keeps_both_replies_valid(engine: Engine) -> None:
    prompt = "A shared prompt for two requests"
    first = engine.submit(GenerationRequest(prompt=prompt, constraint=JSON_SPEC,
                                            sampling=dataclasses.replace(WARM, seed=1)))
    second = engine.submit(GenerationRequest(prompt=prompt, constraint=JSON_SPEC,
                                             sampling=dataclasses.replace(WARM, seed=2)))
    for handle in (first, second):
        events = list(handle.events(timeout=120))
        text = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert isinstance(events[-1], Finished) and events[-1].reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
    _, texts, done = reply(engine, GenerationRequest(prompt=prompt, constraint=JSON_SPEC,
                                                     sampling=dataclasses.replace(WARM, seed=3)))
    assert done[0].usage.cached_tokens > 0  # the prompt's cells came from the cache
    jsonschema.validate(json.loads(texts[0]), SCHEMA)


def test_unconstrained_neighbours_are_unaffected(engine: Engine) -> None:
    """T = 0: an unconstrained reply batched with constrained ones is token-identical to the
    same reply alone."""
    free = GenerationRequest(prompt="Hello", sampling=GREEDY)
    alone, _, _ = reply(engine, free)
    handles = [engine.submit(GenerationRequest(prompt="Hi", constraint=JSON_SPEC,
                                               sampling=dataclasses.replace(WARM, seed=5))),
               engine.submit(dataclasses.replace(free, id="free-again")),
               engine.submit(GenerationRequest(prompt="Answer", sampling=GREEDY,
                                               constraint=ConstraintSpec("regex", "[0-9]{30}")))]
    results = [list(h.events(timeout=120)) for h in handles]
    assert [e.token_id for e in results[1] if isinstance(e, TokenEvent)] == alone[0]


# ---- lazy constraints --------------------------------------------------------------------------

def test_a_lazy_grammar_engages_at_its_trigger(engine: Engine) -> None:
    free, _, _ = reply(engine, GenerationRequest(prompt="Hello", sampling=GREEDY))
    model = engine._loaded.model if engine._loaded else None
    assert model is not None and model.piece(free[0][HELLO_ER]) == b"er"
    for trigger in ("er", "r"):  # on a token boundary, and from the middle of a token
        spec = ConstraintSpec("lark", f'start: "{trigger}" /[0-9]{{3}}/', trigger=trigger)
        tokens, _, done = reply(engine, GenerationRequest(prompt="Hello", sampling=GREEDY,
                                                              constraint=spec))
        assert tokens[0][:HELLO_ER + 1] == free[0][:HELLO_ER + 1]  # free text until then
        tail = b"".join(model.piece(t) for t in tokens[0][HELLO_ER + 1:])
        assert re.fullmatch(rb"[0-9]{3}", tail), tail
        assert done[0].reason == "stop"


def test_a_constraint_error_mid_reply_fails_that_request_alone(engine: Engine) -> None:
    """The token "er" completes the trigger "e" with an "r" the grammar refuses."""
    spec = ConstraintSpec("lark", 'start: "e" "Z"', trigger="e")
    bad = engine.submit(GenerationRequest(prompt="Hello", sampling=GREEDY, constraint=spec))
    good = engine.submit(GenerationRequest(prompt="Hello", sampling=GREEDY))
    bad_events = list(bad.events(timeout=120))
    assert isinstance(bad_events[-1], ErrorEvent)
    assert bad_events[-1].kind == "ConstraintError"
    assert "after the trigger 'e' does not match" in bad_events[-1].message
    good_events = list(good.events(timeout=120))
    assert isinstance(good_events[-1], Finished)


# ---- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "message"), [
    (ConstraintSpec("json_schema", '{"type": "object",'), "the JSON schema is not valid JSON"),
    (ConstraintSpec("json_schema", json.dumps(
        {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}})),
     "unsupported keyword 'uniqueItems' at /properties/tags"),
    (ConstraintSpec("gbnf", 'root ::= ("a" | "b"'), "the GBNF grammar does not parse"),
    (ConstraintSpec("lark", 'start: "x" start'), "the grammar cannot end"),
    (ConstraintSpec("gbnf", 'root ::= "{" root "}"'), "the grammar cannot end"),
])
def test_bad_constraints_fail_the_request_and_the_engine_serves_on(
        engine: Engine, spec: ConstraintSpec, message: str) -> None:
    events = events_of(engine, GenerationRequest(prompt="Hello", sampling=GREEDY, constraint=spec))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert events[0].kind == "ConstraintError" and events[0].message.startswith(message)
    _, _, done = reply(engine, GenerationRequest(prompt="Hello", sampling=GREEDY,
                                                 constraint=ConstraintSpec("regex", "ok")))
    assert done[0].reason == "stop"


def test_a_grammar_that_never_ends_finishes_with_length(engine: Engine) -> None:
    """No derivation ends, but nothing is forced: llguidance runs it; the end of the text is
    never allowed, so the reply runs to max_tokens (finish reason "length", documented)."""
    sampling = dataclasses.replace(WARM, seed=0, max_tokens=20)
    _, texts, done = reply(engine, GenerationRequest(
        prompt="Hello", sampling=sampling, constraint=ConstraintSpec("gbnf", 'root ::= [xy] root')))
    assert done[0].reason == "length" and re.fullmatch("[xy]{20}", texts[0])


# ---- speculative decoding ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def near_draft() -> Path:
    return tiny_model_path(NEAR_DRAFT)


SPEC_DRAFTS = {
    "draft-model": lambda near, tiny: DraftSettings(kind="model", model_path=near, k=3, p_min=0.0),
    "unrelated-draft": lambda near, tiny: DraftSettings(kind="model", model_path=tiny, k=3,
                                                        p_min=0.0),
    "ngram": lambda near, tiny: DraftSettings(kind="ngram", k=4, ngram_min=1, ngram_max=3),
}


@pytest.mark.parametrize("name", list(SPEC_DRAFTS))
def test_speculative_greedy_is_token_identical_under_a_constraint(
        tiny_target: Path, tiny_draft: Path, near_draft: Path, engine: Engine, name: str) -> None:
    requests = [GenerationRequest(prompt=p, sampling=GREEDY, constraint=c)
                for p, c in (("Hello", ROWS_SPEC), ("Answer", JSON_SPEC))]
    want = [reply(engine, r)[0][0] for r in requests]
    draft = SPEC_DRAFTS[name](near_draft, tiny_draft)
    for spec_engine in load(settings_for(tiny_target, n_parallel=4, draft=draft), Speculation()):
        drafted = accepted = 0
        for request, tokens in zip(requests, want, strict=True):
            got, _, done = reply(spec_engine, request)
            assert got[0] == tokens
            assert done[0].reason == "stop"
            assert done[0].speculative is not None
            drafted += done[0].speculative.drafted
            accepted += done[0].speculative.accepted
        assert drafted > 0 and accepted > 0


# The distribution tests: 4 tokens under a constraint whose mask depends on the position
# (a-m at even bytes, n-z or space at odd ones: "er" fits at even positions, " a" at odd
# ones), so a verifier that masked row i with another state than after x1..xi would be
# caught; and it cannot end within 4 tokens (8 bytes at most), so EOS is never allowed.
LETTERS = ConstraintSpec("regex", "([a-m][n-z ]){10,20}")


def exact_constrained_joint(path: Path, prompt: Sequence[int], params: SamplingParams,
                            spec: ConstraintSpec) -> dict[tuple[int, ...], float]:
    """P(t1..t4) under plain constrained sampling: every prefix evaluated alone, the mask
    from a constraint advanced through that prefix."""
    lp = to_llama_params(settings_for(path), 0)
    model = LlamaModel.load(path, lp)
    ctx = LlamaContext(model, lp)
    batch = Batch(128)
    out: dict[tuple[int, ...], float] = {}

    def expand(generated: tuple[int, ...], prob: float, constraint: Constraint) -> None:
        if len(generated) == N_TOKENS:
            out[generated] = prob
            return
        tokens = [*prompt, *generated]
        ctx.seq_rm(0, 0, -1)
        batch.clear()
        batch.add_tokens(tokens, 0, 0, True)
        assert ctx.decode(batch) == 0
        dist = Sampler(params, 0, constraint).distribution(ctx.logits(1)[0].copy(), tokens)
        for t in np.flatnonzero(dist > 0):
            child = constraint.fork()
            child.advance(int(t))
            expand((*generated, int(t)), prob * float(dist[t]), child)

    try:
        expand((), 1.0, ConstraintCompiler.from_llama(model).start(spec))
    finally:
        ctx.close()
        model.close()
    return out


def sample_constrained(engine: Engine, prompt: Sequence[int], sampling: SamplingParams,
                       spec: ConstraintSpec) -> tuple[Counter[tuple[int, ...]], int, int]:
    request = GenerationRequest(prompt=tuple(prompt), sampling=sampling, n=N, constraint=spec)
    tokens, _, done = reply(engine, request)
    assert {f.reason for f in done} == {"length"}
    drafted = sum(f.speculative.drafted for f in done if f.speculative is not None)
    accepted = sum(f.speculative.accepted for f in done if f.speculative is not None)
    return Counter(tuple(t) for t in tokens), drafted, accepted


def _distribution_run(target: Path, draft: DraftSettings, prompt: Sequence[int],
                      sampling: SamplingParams) -> tuple[Counter[tuple[int, ...]], int, int]:
    speculation = Speculation() if draft.kind != "none" else None
    for eng in load(settings_for(target, n_parallel=16, draft=draft), speculation):
        return sample_constrained(eng, prompt, sampling, LETTERS)
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def looping_letters(tiny_target: Path, engine: Engine) -> tuple[int, ...]:
    """The prompt, then the target's own constrained greedy text: prompt lookup finds its
    n-grams again."""
    tokens, _, done = reply(engine, GenerationRequest(
        prompt=PROMPT, sampling=SamplingParams(temperature=0.0, max_tokens=60),
        constraint=ConstraintSpec("regex", "([a-m][n-z ]){20}")))
    assert done[0].reason == "stop"  # 40 bytes: the sample after it starts at an even byte
    return (*PROMPT, *tokens[0])


def test_plain_constrained_sampling_matches_the_exact_distribution(tiny_target: Path) -> None:
    """The harness: the engine without speculation passes."""
    sampling = dataclasses.replace(SAMPLING, seed=2000)
    counts, _, _ = _distribution_run(tiny_target, DraftSettings(), PROMPT, sampling)
    exact = exact_constrained_joint(tiny_target, PROMPT, sampling, LETTERS)
    assert chi_square_p(counts, exact) > ALPHA


def test_draft_model_speculation_under_a_constraint_is_lossless(
        tiny_target: Path, near_draft: Path) -> None:
    draft = DraftSettings(kind="model", model_path=near_draft, k=2, p_min=0.0)
    counts, drafted, accepted = _distribution_run(tiny_target, draft, PROMPT, SAMPLING)
    assert drafted >= N and 0.1 * drafted < accepted < drafted  # both paths exercised
    exact = exact_constrained_joint(tiny_target, PROMPT, SAMPLING, LETTERS)
    assert chi_square_p(counts, exact) > ALPHA


def test_prompt_lookup_under_a_constraint_is_lossless(
        tiny_target: Path, looping_letters: tuple[int, ...]) -> None:
    draft = DraftSettings(kind="ngram", k=2, ngram_min=1, ngram_max=3)
    counts, drafted, accepted = _distribution_run(tiny_target, draft, looping_letters,
                                                  LOOKUP_SAMPLING)
    assert drafted >= N // 2 and 0.1 * drafted < accepted < drafted  # both paths exercised
    exact = exact_constrained_joint(tiny_target, looping_letters, LOOKUP_SAMPLING, LETTERS)

    assert chi_square_p(counts, exact) > ALPHA


def _pacer() -> Pacer:
    """A fixed k = 4 that drafts from the first round (the plain step time is known)."""
    return Pacer(DraftSettings(kind="ngram", k=4), memory=CostMemory(t_plain=0.01))


def test_prompt_lookup_proposals_stop_at_what_the_grammar_forbids(engine: Engine) -> None:
    """The lookup finds "b1a" after "...1a"; letters only are allowed: "b" is proposed,
    the rest cut at "1" (the masks on the way stay cached, the state as it was)."""
    assert engine._loaded is not None
    model = engine._loaded.model
    constraint = engine._loaded.compiler.start(ConstraintSpec("regex", "[a-z]+"))
    drafter = NgramDrafter(PromptLookup(1, 2), _pacer(), constraint)
    tokens = model.tokenize("ab1ab1a", add_special=False)
    assert PromptLookup(1, 2).propose(tokens, 4) == model.tokenize("b1a", add_special=False)
    proposal = drafter.propose(tokens, 4)
    assert proposal.tokens == tuple(model.tokenize("b", add_special=False))
    assert constraint.allowed() is not None and not constraint.done
    free = NgramDrafter(PromptLookup(1, 2), _pacer())
    assert len(free.propose(tokens, 4).tokens) == 3


class _FrozenMask:
    """Biased: masks every verify row with the state before the drafts (it ignores the
    drafts' own steps through the grammar)."""

    def __init__(self, constraint: Constraint) -> None:
        self.frozen = constraint.mask()

    def mask(self) -> TokenMask | None:
        return self.frozen

    def try_advance(self, token: int) -> bool:
        return True

    def rollback(self, n: int) -> None:
        pass


class _FrozenVerifier(SamplingVerifier):
    def verify(self, proposal: DraftProposal, rows: np.ndarray, sampler: Sampler,
               history: Sequence[int]) -> DraftVerdict:
        real = sampler.constraint
        assert real is not None
        sampler.constraint = _FrozenMask(real)  # type: ignore[assignment]
        try:
            return super().verify(proposal, rows, sampler, history)
        finally:
            sampler.constraint = real


class _BiasedSpeculation(Speculation):
    def attach(self, model: Any, settings: LoadSettings) -> SpecSetup | None:
        setup = super().attach(model, settings)
        assert setup is not None
        return dataclasses.replace(setup, verifier=_FrozenVerifier())


def test_the_same_test_fails_a_verifier_that_masks_with_the_wrong_state(
        tiny_target: Path, near_draft: Path) -> None:
    """Its corrections break the grammar (the request fails) or its counts miss the exact
    distribution: either way the harness sees it."""
    draft = DraftSettings(kind="model", model_path=near_draft, k=2, p_min=0.0)
    for eng in load(settings_for(tiny_target, n_parallel=16, draft=draft), _BiasedSpeculation()):
        request = GenerationRequest(prompt=PROMPT, sampling=SAMPLING, n=N, constraint=LETTERS)
        events = list(eng.submit(request).events(timeout=300))
        if isinstance(events[-1], ErrorEvent):
            assert events[-1].kind == "ConstraintError"
            return
        tokens: dict[int, list[int]] = {i: [] for i in range(N)}
        for event in events:
            if isinstance(event, TokenEvent):
                tokens[event.index].append(event.token_id)
        counts = Counter(tuple(t) for t in tokens.values())
        exact = exact_constrained_joint(tiny_target, PROMPT, SAMPLING, LETTERS)
        assert chi_square_p(counts, exact) < 1e-9
