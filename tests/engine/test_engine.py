"""The engine on the tiny generated GGUFs: streaming, determinism, seeds, cancel, stops,
limits, overflow, KV cache types, errors, concurrency, n > 1, preemption, prefix sharing."""

from __future__ import annotations

import threading
from collections.abc import Sequence as Seq
from pathlib import Path

import numpy as np
import pytest

from runtime.engine.api import RequestHandle
from runtime.engine.engine import Engine
from runtime.errors import (
    LoadError,
    ModelNotFound,
    NoModelLoaded,
    NotAGGUF,
)
from runtime.events import (
    ChatMessage,
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.sampling.sampler import Sampler
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.api import DraftProposal, DraftVerdict, SpecSetup
from tests.engine.conftest import tiny_settings
from tests.fixtures.tiny_gguf import TinySpec, write_tiny_gguf

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def collect(handle: RequestHandle) -> tuple[list[int], str, list[Event]]:
    events = list(handle.events(timeout=60))
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    return tokens, text, events


def finished(events: Seq[Event], index: int = 0) -> Finished:
    done = [e for e in events if isinstance(e, Finished) and e.index == index]
    assert len(done) == 1, events
    return done[0]


def generate(engine: Engine, prompt: str, sampling: SamplingParams = GREEDY,
             **kw: object) -> tuple[list[int], str, list[Event]]:
    return collect(engine.submit(GenerationRequest(prompt=prompt, sampling=sampling, **kw)))  # type: ignore[arg-type]


PROMPTS = [f"the {w} went to the {v} and then" for w, v in
           [("cat", "sea"), ("dog", "hill"), ("owl", "wood"), ("ant", "rock"),
            ("bee", "tree"), ("fox", "den"), ("elk", "lake"), ("eel", "reef")]]


def test_streams_tokens_and_finishes_with_usage_and_timings(engine: Engine, tiny_target: Path) -> None:
    info = engine.load(tiny_settings(tiny_target))
    assert info.n_vocab == 271 and info.chat_template_source == "model"
    assert info.allocated and engine.status().state == "ready"
    tokens, _text, events = generate(engine, PROMPTS[0])
    done = finished(events)
    assert done.reason in ("length", "stop")
    assert done.usage.completion_tokens == len(tokens) > 0
    assert done.usage.prompt_tokens == len(engine._loaded.model.tokenize(PROMPTS[0]))  # type: ignore[union-attr]
    assert done.timings.ttft_s > 0 and done.timings.prefill_tokens_per_s > 0
    assert done.timings.decode_tokens_per_s > 0 and done.timings.total_s >= done.timings.ttft_s
    m = engine.metrics()
    assert m.decode_tokens_per_s > 0 and m.prefill_tokens_per_s > 0
    assert m.kv_cells_total == 512


def test_rates_read_zero_once_the_engine_is_idle(engine: Engine, tiny_target: Path) -> None:
    """The live rates are what the engine does now: right after a reply its own speed, and
    0 once it has been idle a moment — not a window of old steps drifting as it empties."""
    engine.load(tiny_settings(tiny_target))
    generate(engine, PROMPTS[0])
    assert engine.metrics().decode_tokens_per_s > 0
    with engine._steps_lock:  # the same steps, as if they had ended 2 s ago
        engine._steps = type(engine._steps)((t - 2.0, r, k) for t, r, k in engine._steps)
    idle = engine.metrics()
    assert (idle.decode_tokens_per_s, idle.prefill_tokens_per_s) == (0.0, 0.0)
    assert idle.acceptance_rate is None and idle.kv_cells_total == 512


def test_greedy_is_deterministic(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    first = generate(engine, PROMPTS[1])[0]
    engine.load(tiny_settings(tiny_target))  # a fresh context, no cache
    assert generate(engine, PROMPTS[1])[0] == first


def test_seeded_sampling_is_reproducible(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24,
                         seed=1234, ignore_eos=True)
    a = generate(engine, PROMPTS[2], hot)[0]
    b = generate(engine, PROMPTS[2], hot)[0]
    c = generate(engine, PROMPTS[2], SamplingParams(**{**hot.__dict__, "seed": 99}))[0]
    assert a == b and a != c


def test_max_tokens_finishes_with_length(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    tokens, _, events = generate(engine, PROMPTS[3], SamplingParams(temperature=0, max_tokens=5,
                                                                    ignore_eos=True))
    assert len(tokens) == 5 and finished(events).reason == "length"


def test_cancel_mid_stream(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    handle = engine.submit(GenerationRequest(
        prompt=PROMPTS[0], sampling=SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True)))
    seen = 0
    events: list[Event] = []
    for event in handle.events(timeout=60):
        events.append(event)
        if isinstance(event, TokenEvent):
            seen += 1
            if seen == 3:
                handle.cancel()
    done = finished(events)
    assert done.reason == "cancelled" and 3 <= done.usage.completion_tokens < 100_000
    status = engine.status()
    assert status.active_sequences == 0 and status.kv_cells_used == 0  # freed at once


def test_stop_string_across_token_boundaries(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    free = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    tokens, text, _ = generate(engine, PROMPTS[4], free)
    model = engine._loaded.model  # type: ignore[union-attr]
    pieces = [model.piece(t) for t in tokens]
    # A stop string made of the end of one token's text and the start of the next one's.
    i = next(i for i in range(3, len(pieces) - 1)
             if pieces[i].isascii() and pieces[i + 1].isascii() and pieces[i] and pieces[i + 1])
    stop = (pieces[i][-1:] + pieces[i + 1][:1]).decode()
    _, stopped_text, events = generate(engine, PROMPTS[4], SamplingParams(**{**free.__dict__, "stop": (stop,)}))
    assert finished(events).reason == "stop"
    assert stop not in stopped_text
    assert stopped_text == text[:text.index(stop)]


def test_context_overflow_names_both_numbers(engine: Engine, tiny_target: Path) -> None:
    info = engine.load(tiny_settings(tiny_target, n_ctx=256))
    assert info.n_ctx == 256
    prompt = (5,) * 300
    events = list(engine.submit(GenerationRequest(prompt=prompt)).events(timeout=30))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert events[0].kind == "ContextOverflow"
    assert "300 tokens" in events[0].message and "256" in events[0].message
    assert generate(engine, PROMPTS[0])[0]  # and the engine carries on


def test_a_context_rounded_up_by_llama_cpp_is_said(engine: Engine, tiny_target: Path) -> None:
    info = engine.load(tiny_settings(tiny_target, n_ctx=100))
    assert info.n_ctx == 256
    assert any("from 100 up to 256" in n for n in info.notes)


def test_middle_truncation_drops_older_turns_and_says_how_much(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target, n_ctx=256))
    chat = [ChatMessage("system", "sys")]
    for i in range(8):
        chat += [ChatMessage("user", f"question {i} " + "x" * 40), ChatMessage("assistant", "ok " * 5)]
    chat.append(ChatMessage("user", "last question"))
    request = GenerationRequest(messages=tuple(chat), truncate_middle=True,
                                sampling=SamplingParams(temperature=0, max_tokens=16))
    _tokens, _, events = collect(engine.submit(request))
    usage = finished(events).usage
    assert usage.truncated_tokens > 0
    assert usage.prompt_tokens <= 256 - 16
    model = engine._loaded.model  # type: ignore[union-attr]
    rendered = model.tokenize(engine.render_chat(chat))
    assert usage.prompt_tokens + usage.truncated_tokens == len(rendered)


def test_middle_truncation_of_a_raw_prompt(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target, n_ctx=256))
    prompt = tuple(3 + i % 250 for i in range(300))
    events = list(engine.submit(GenerationRequest(
        prompt=prompt, truncate_middle=True,
        sampling=SamplingParams(temperature=0, max_tokens=8))).events(timeout=30))
    usage = finished(events).usage
    assert usage.prompt_tokens == 256 - 8 and usage.truncated_tokens == 300 - 248


@pytest.mark.parametrize(("type_k", "type_v"), [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"),
                                                ("q8_0", "f16")])
def test_kv_cache_types_load_and_generate(engine: Engine, tiny_target: Path, type_k: str, type_v: str) -> None:
    info = engine.load(tiny_settings(tiny_target, type_k=type_k, type_v=type_v, flash_attn="off"))
    if type_v != "f16":
        assert info.flash_attn is True
        assert any("flash attention on" in n and type_v in n for n in info.notes)
    else:
        assert info.flash_attn is False
    tokens = generate(engine, PROMPTS[5], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len(tokens) == 8


def test_an_unsupported_kv_pair_is_a_load_error_with_the_reason(engine: Engine, tiny_target: Path,
                                                               tmp_path: Path) -> None:
    # Head size 16 cannot hold q8_0's 32-value blocks.
    narrow = write_tiny_gguf(tmp_path / "narrow.gguf", TinySpec(n_embd=64, n_head=4, name="narrow"))
    with pytest.raises(LoadError, match=r"block size 32 does not divide .*q8_0/f16"):
        engine.load(tiny_settings(narrow, type_k="q8_0"))
    assert engine.status().state == "empty"
    engine.load(tiny_settings(tiny_target))  # usable afterwards
    assert generate(engine, PROMPTS[0])[0]


def test_bad_files_are_typed_errors(engine: Engine, tmp_path: Path, tiny_target: Path) -> None:
    with pytest.raises(ModelNotFound):
        engine.load(tiny_settings(tmp_path / "missing.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(NotAGGUF):
        engine.load(tiny_settings(junk))
    engine.load(tiny_settings(tiny_target))
    assert generate(engine, PROMPTS[0])[0]


def test_request_errors_leave_the_engine_usable(engine: Engine, tiny_target: Path) -> None:
    with pytest.raises(NoModelLoaded):
        engine.submit(GenerationRequest(prompt="hi"))
    engine.load(tiny_settings(tiny_target))
    for bad in (GenerationRequest(prompt=(5, 99_999)), GenerationRequest(prompt="")):
        events = list(engine.submit(bad).events(timeout=30))
        assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert "outside the vocabulary" in str(
        next(iter(engine.submit(GenerationRequest(prompt=(5, 99_999))).events(timeout=30))))
    assert generate(engine, PROMPTS[0])[0]


def test_concurrent_requests_are_each_identical_to_running_alone(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    alone = [generate(engine, p)[0] for p in PROMPTS]
    engine.load(tiny_settings(tiny_target, n_parallel=8))
    handles = [engine.submit(GenerationRequest(prompt=p, sampling=GREEDY)) for p in PROMPTS]
    together = [collect(h)[0] for h in handles]
    assert together == alone


def test_concurrent_submitters_from_threads(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target, n_parallel=4))
    results: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        results[i] = generate(engine, PROMPTS[i])[0]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(4)] == [generate(engine, PROMPTS[i])[0] for i in range(4)]


def test_n_samples_share_the_prompt_cells(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target, n_parallel=2))
    request = GenerationRequest(prompt=PROMPTS[6], n=2, sampling=SamplingParams(
        temperature=1.0, max_tokens=12, seed=7, ignore_eos=True))
    events = list(engine.submit(request).events(timeout=60))
    first, second = finished(events, 0), finished(events, 1)
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens == first.usage.prompt_tokens - 1
    by_index = [[e.token_id for e in events if isinstance(e, TokenEvent) and e.index == i] for i in (0, 1)]
    assert by_index[0] != by_index[1]  # seeds seed and seed+1


def test_preemption_in_a_tiny_context_completes_everyone_correctly(engine: Engine, tiny_target: Path) -> None:
    sampling = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    engine.load(tiny_settings(tiny_target))
    alone = [generate(engine, p, sampling)[0] for p in PROMPTS[:6]]
    engine.load(tiny_settings(tiny_target, n_ctx=256, n_parallel=6, n_batch=64, n_ubatch=64))
    handles = [engine.submit(GenerationRequest(prompt=p, sampling=sampling)) for p in PROMPTS[:6]]
    together = [collect(h)[0] for h in handles]
    assert engine._loaded.scheduler.n_preemptions > 0  # type: ignore[union-attr]
    assert together == alone


def test_prefix_sharing_reports_cached_tokens_and_prefills_only_the_rest(engine: Engine,
                                                                        tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target, n_parallel=2))
    system = "You are a helpful assistant who answers in the shortest way. " * 3
    model = engine._loaded.model  # type: ignore[union-attr]
    shared = len(model.tokenize(system))
    generate(engine, system + "first question")
    kept = engine.status().kv_cells_used
    assert kept > 0  # the first reply's cells stay as cache
    steps_before = len(engine._steps)
    _, _, events = generate(engine, system + "second question, longer")
    done = finished(events)
    assert shared - 2 <= done.usage.cached_tokens <= shared  # BPE may merge across the seam
    prefilled = sum(r.prefilled for _, r, _ in list(engine._steps)[steps_before:])
    assert prefilled == done.usage.prompt_tokens - done.usage.cached_tokens


def test_a_chat_turn_reuses_the_previous_turn(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    chat = (ChatMessage("user", "hello there"),)
    _tokens, text, events = collect(engine.submit(GenerationRequest(messages=chat, sampling=GREEDY)))
    follow = (*chat, ChatMessage("assistant", text), ChatMessage("user", "and then?"))
    _, _, events2 = collect(engine.submit(GenerationRequest(messages=follow, sampling=GREEDY)))
    first_prompt = finished(events).usage.prompt_tokens
    assert finished(events2).usage.cached_tokens >= first_prompt


def test_unload_while_running_cancels_cleanly(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target, n_parallel=2))
    endless = SamplingParams(temperature=0, max_tokens=1_000_000, ignore_eos=True)
    handles = [engine.submit(GenerationRequest(prompt=p, sampling=endless)) for p in PROMPTS[:2]]
    assert isinstance(handles[0].get(timeout=30), TokenEvent)
    engine.unload()
    for h in handles:
        events = list(h.events(timeout=30))
        last = events[-1]
        assert (isinstance(last, Finished) and last.reason == "cancelled") or isinstance(last, ErrorEvent)
    assert engine.status().state == "empty"
    with pytest.raises(NoModelLoaded):
        engine.submit(GenerationRequest(prompt="hi"))


def test_stop_joins_the_thread(tiny_target: Path) -> None:
    engine = Engine()
    engine.load(tiny_settings(tiny_target))
    handle = engine.submit(GenerationRequest(prompt="hi", sampling=SamplingParams(
        temperature=0, max_tokens=1_000_000, ignore_eos=True)))
    handle.get(timeout=30)
    thread = engine._thread
    engine.stop()
    assert thread is not None and not thread.is_alive()
    assert any(isinstance(e, Finished) and e.reason == "cancelled" for e in handle.events(timeout=5))


def test_chat_template_fallback_is_said_out_loud(engine: Engine, tmp_path: Path) -> None:
    bare = write_tiny_gguf(tmp_path / "bare.gguf", TinySpec(chat_template=None, name="bare"))
    info = engine.load(tiny_settings(bare))
    assert info.chat_template_source == "fallback"
    assert "the model has no chat template; using ChatML" in info.notes
    assert engine.render_chat([ChatMessage("user", "x")]).startswith("<|im_start|>user\nx")


# ---- the speculative hook, end to end on llama.cpp ------------------------------------------

class _ReplayDrafter:
    """Proposes the known greedy continuation: every draft must be accepted."""

    cost_ratio = 0.0
    measured_speedup = 0.0
    off_reason = None

    def __init__(self, full: list[int]) -> None:
        self.full = full

    def propose(self, seq_tokens: Seq[int], k: int) -> DraftProposal:
        return DraftProposal(tuple(self.full[len(seq_tokens):len(seq_tokens) + k]))

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


class _GreedyVerifier:
    def verify(self, proposal: DraftProposal, rows: np.ndarray, sampler: Sampler,
               history: Seq[int]) -> DraftVerdict:
        out: list[int] = []
        for i, x in enumerate(proposal.tokens):
            y = int(np.argmax(rows[i]))
            if y != x:
                return DraftVerdict((*out, y), len(out), len(proposal.tokens) - len(out))
            out.append(x)
        return DraftVerdict((*out, int(np.argmax(rows[len(out)]))), len(out), 0)


class _Speculation:
    def __init__(self, full: list[int]) -> None:
        self.full = full

    def attach(self, model: object, settings: LoadSettings) -> SpecSetup:
        return SpecSetup(drafter_for=lambda seq: _ReplayDrafter(self.full),
                         verifier=_GreedyVerifier(), k_max=4, draft_name="replay")


def test_the_speculative_hook_verifies_drafts_on_llama_cpp(tiny_target: Path) -> None:
    sampling = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = Engine()
    plain.load(tiny_settings(tiny_target))
    prompt = plain._loaded.model.tokenize(PROMPTS[7])  # type: ignore[union-attr]
    reference = generate(plain, PROMPTS[7], sampling)[0]
    plain.stop()
    spec = Engine(speculation=_Speculation([*prompt, *reference]))
    try:
        info = spec.load(tiny_settings(tiny_target, draft=DraftSettings(kind="ngram")))
        assert info.draft == "replay"
        tokens, _, events = generate(spec, PROMPTS[7], sampling)
        assert tokens == reference
        summary = finished(events).speculative
        assert summary is not None and summary.acceptance_rate == 1.0
        assert any(isinstance(e, TokenEvent) and e.from_draft for e in events)
    finally:
        spec.stop()


def test_a_draft_without_speculation_support_is_refused_out_loud(engine: Engine, tiny_target: Path) -> None:
    info = engine.load(tiny_settings(tiny_target, draft=DraftSettings(kind="ngram")))
    assert info.draft is None and info.draft_refused
    assert generate(engine, PROMPTS[0])[0]
