"""Speculative decoding on the real default model (SmolLM2-135M-Instruct Q4_1): at
temperature 0 the output is token-identical to plain greedy decoding for 256 tokens on
several prompts, with every drafter — prompt lookup and a draft model (the model drafting for
itself, so every draft must also be accepted). The F32-target / Q4_1-draft pair of the
benchmark is checked there (`benchmarks/speculative.py` prints whether each T = 0 run
matches plain decoding), as it is too slow for the test suite on two cores.

One sequence at a time, as in plain decoding. With several sequences in flight llama.cpp's
CPU flash attention (F16 accumulation) gives a sequence slightly different logits depending
on where the *other* sequences' cells lie in the unified cache — plain decoding of three
prompts together already differs from decoding them alone after ~50 tokens, and rollbacks
move cells around — so greedy identity is only defined for the same cache layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.engine.engine import Engine
from runtime.events import ChatMessage, Finished, GenerationRequest, SamplingParams, TokenEvent
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.speculation import Speculation

pytestmark = pytest.mark.e2e

N_TOKENS = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
QUESTIONS = (
    "Explain how a bicycle works, part by part.",
    "Write a short story about a lighthouse keeper and a storm.",
    "Repeat this list and then describe each item: apple, river, mountain, apple, river.",
)


def settings(model: Path, **kw: Any) -> LoadSettings:
    # One thread: on a shared two-core machine a second one mostly waits at barriers.
    return LoadSettings(model_path=model, n_ctx=1024, n_threads=1, **kw)


def generate(engine: Engine) -> list[tuple[list[int], Finished]]:
    out = []
    for q in QUESTIONS:
        handle = engine.submit(GenerationRequest(
            messages=(ChatMessage("system", "You are a helpful assistant."),
                      ChatMessage("user", q)),
            sampling=GREEDY))
        events = list(handle.events(timeout=600))
        done = events[-1]
        assert isinstance(done, Finished)
        out.append(([e.token_id for e in events if isinstance(e, TokenEvent)], done))
    return out


def run(model: Path, draft: DraftSettings | None = None) -> list[tuple[list[int], Finished]]:
    engine = Engine(speculation=Speculation() if draft else None)
    try:
        info = engine.load(settings(model, draft=draft or DraftSettings()))
        if draft is not None:
            assert info.draft is not None, info.draft_refused
        return generate(engine)
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def plain(default_model: Path) -> list[list[int]]:
    results = run(default_model)
    assert all(len(tokens) == N_TOKENS for tokens, _ in results)
    return [tokens for tokens, _ in results]


@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_greedy_output_is_unchanged_by_speculation(default_model: Path, plain: list[list[int]],
                                                   kind: str) -> None:
    draft = (DraftSettings(kind="ngram") if kind == "ngram"
             else DraftSettings(kind="model", model_path=default_model, k=4, p_min=0.0))
    results = run(default_model, draft)
    assert [tokens for tokens, _ in results] == plain
    drafted = sum(done.speculative.drafted for _, done in results if done.speculative)
    assert drafted > 0
    if kind == "self":  # the model drafting for itself at T = 0 agrees with itself
        assert all(done.speculative is not None and done.speculative.acceptance_rate == 1.0
                   for _, done in results)
