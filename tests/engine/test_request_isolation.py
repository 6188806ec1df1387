"""One request's failure is its own (issue 15), on the real engine and the tiny model: an
exception while preparing or inside a step ends that request with a typed one-line
ErrorEvent; a neighbour's stream runs on unchanged and the engine keeps serving."""

from __future__ import annotations

import threading
from collections.abc import Sequence as Seq
from pathlib import Path

import numpy as np
import pytest

from runtime.engine import engine as engine_module
from runtime.engine.api import RequestHandle
from runtime.engine.engine import Engine
from runtime.errors import InvalidLogits
from runtime.events import (
    ChatMessage,
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.sampling.sampler import INVALID_LOGITS, Sampler
from tests.engine.conftest import tiny_settings

WAIT_S = 10.0
POISON_SEED = 666  # the sampler of a request with this seed sees NaN logits


def collect(handle: RequestHandle) -> tuple[list[int], list[Event]]:
    events = list(handle.events(timeout=WAIT_S))
    return [e.token_id for e in events if isinstance(e, TokenEvent)], events


def greedy(prompt: str, max_tokens: int = 40, seed: int | None = None) -> GenerationRequest:
    return GenerationRequest(prompt=prompt,
                             sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                     seed=seed))


def test_nan_logits_end_one_request_and_not_its_neighbour(engine: Engine, tiny_target: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    engine.load(tiny_settings(tiny_target, n_parallel=4))
    alone, _ = collect(engine.submit(greedy("The neighbour says")))

    real_sample = Sampler.sample
    poisoned = threading.Event()

    def sample(self: Sampler, logits_row: np.ndarray, history: Seq[int]) -> int:
        if self.params.seed == POISON_SEED and len(history) > 12:
            poisoned.set()
            row = logits_row.copy()
            row[7] = np.nan
            return real_sample(self, row, history)
        return real_sample(self, logits_row, history)

    monkeypatch.setattr(Sampler, "sample", sample)
    neighbour = engine.submit(greedy("The neighbour says"))
    victim = engine.submit(greedy("The victim says", max_tokens=200, seed=POISON_SEED))
    neighbour_tokens, neighbour_events = collect(neighbour)
    _, victim_events = collect(victim)

    assert poisoned.is_set()
    error = victim_events[-1]
    assert isinstance(error, ErrorEvent)
    assert (error.kind, error.message) == (InvalidLogits.__name__, INVALID_LOGITS)
    assert isinstance(neighbour_events[-1], Finished)
    assert neighbour_tokens == alone  # same stream as alone: its cells were never cleared
    again, events = collect(engine.submit(greedy("The neighbour says")))
    assert again == alone and isinstance(events[-1], Finished)
    assert engine.status().active_sequences == 0


def test_an_unexpected_exception_while_preparing_is_that_requests_error(
        engine: Engine, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.load(tiny_settings(tiny_target))
    real_prepare = engine_module.prepare_prompt

    def prepare(request: GenerationRequest, *args: object) -> object:
        if request.prompt == "explode":
            raise UnicodeEncodeError("utf-8", "x", 0, 1, "surrogates not allowed\nsecond line")
        return real_prepare(request, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "prepare_prompt", prepare)
    _, events = collect(engine.submit(greedy("explode")))
    [error] = events
    assert isinstance(error, ErrorEvent) and error.kind == "EngineError"
    assert "UnicodeEncodeError" in error.message and "\n" not in error.message
    tokens, events = collect(engine.submit(greedy("still serving", max_tokens=5)))
    assert len(tokens) == 5 and isinstance(events[-1], Finished)


def test_lone_surrogates_reach_the_engine_safely(engine: Engine, tiny_target: Path) -> None:
    """The server refuses them; the CLI and the app hand them to the engine, which replaces
    them (U+FFFD) instead of failing inside the tokenizer."""
    engine.load(tiny_settings(tiny_target))
    for request in (GenerationRequest(messages=(ChatMessage("user", "a\ud800b"),),
                                      sampling=SamplingParams(temperature=0, max_tokens=3)),
                    greedy("x\udfff", max_tokens=3)):
        tokens, events = collect(engine.submit(request))
        assert len(tokens) == 3 and isinstance(events[-1], Finished)


def test_n_samples_get_max_tokens_the_cache_holds(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target, n_ctx=256, n_parallel=8))
    request = GenerationRequest(prompt="Once upon a time", n=8,
                                sampling=SamplingParams(temperature=1.0, seed=1, max_tokens=8192,
                                                        ignore_eos=True))
    _, events = collect(engine.submit(request))
    done = [e for e in events if isinstance(e, Finished)]
    assert len(done) == 8 and {d.reason for d in done} == {"length"}
    prompt = done[0].usage.prompt_tokens
    assert {d.usage.completion_tokens for d in done} == {(256 - prompt) // 8}
    assert max(d.usage.completion_tokens for d in done) * 8 + prompt <= 256


def test_a_request_cancelled_while_preparing_is_answered(engine: Engine, tiny_target: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    engine.load(tiny_settings(tiny_target))
    real_prepare = engine_module.prepare_prompt
    release = threading.Event()

    def prepare(request: GenerationRequest, *args: object) -> object:
        if request.prompt == "slow":
            assert release.wait(WAIT_S)
        return real_prepare(request, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "prepare_prompt", prepare)
    handle = engine.submit(greedy("slow"))
    handle.cancel()
    # The cancel reaches the engine before the preparation ends: a quick request submitted
    # after it is answered first, so the cancel has been handled.
    collect(engine.submit(greedy("quick", max_tokens=2)))
    release.set()
    _, events = collect(handle)
    assert [e.reason for e in events if isinstance(e, Finished)] == ["cancelled"]


def test_unload_waits_for_a_preparation_and_answers_it(engine: Engine, tiny_target: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    engine.load(tiny_settings(tiny_target))
    real_prepare = engine_module.prepare_prompt
    started, release = threading.Event(), threading.Event()

    def prepare(request: GenerationRequest, *args: object) -> object:
        started.set()
        assert release.wait(WAIT_S)
        return real_prepare(request, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "prepare_prompt", prepare)
    handle = engine.submit(greedy("during unload"))
    assert started.wait(WAIT_S)
    unloading = threading.Thread(target=engine.unload)
    unloading.start()
    unloading.join(0.2)
    assert unloading.is_alive(), "unload freed the model under a tokenizing worker"
    release.set()
    unloading.join(WAIT_S)
    assert not unloading.is_alive()
    _, events = collect(handle)
    assert isinstance(events[-1], ErrorEvent) and events[-1].kind == "NoModelLoaded"
