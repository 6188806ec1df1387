"""Scheduler and slot table against a strict fake context (tests/engine/fake_llama.py):
continuous batching, chunked prefill, preemption, prefix sharing, n > 1, cancel, and the
speculative hook. Real-model versions of the important ones are in test_engine.py."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence as Seq

import numpy as np
import pytest

from runtime.engine.kv_slots import KvSlots, common_prefix
from runtime.engine.scheduler import Scheduler
from runtime.engine.sequence import Sequence
from runtime.engine.stops import StopMatcher
from runtime.events import ErrorEvent, Event, Finished, SamplingParams, StepStats, TokenEvent
from runtime.sampling.sampler import Sampler
from runtime.speculative.api import DraftProposal, DraftVerdict
from tests.engine.fake_llama import FakeBatch, FakeContext, FakeVocab, logits_for


class Recorder:
    def __init__(self) -> None:
        self.events: dict[tuple[str, int], list[Event]] = defaultdict(list)

    def __call__(self, seq: Sequence, event: Event) -> None:
        self.events[(seq.request_id, seq.index)].append(event)

    def tokens(self, rid: str, index: int = 0) -> list[int]:
        return [e.token_id for e in self.events[(rid, index)] if isinstance(e, TokenEvent)]

    def finished(self, rid: str, index: int = 0) -> Finished:
        done = [e for e in self.events[(rid, index)] if isinstance(e, Finished)]
        assert len(done) == 1, self.events[(rid, index)]
        return done[0]


def make_seq(rid: str, prompt: Seq[int], max_tokens: int = 8, *, index: int = 0,
             leader: Sequence | None = None, stop: tuple[str, ...] = ()) -> Sequence:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop)
    return Sequence(request_id=rid, index=index, tokens=list(prompt), prompt_len=len(prompt),
                    sampling=params, sampler=Sampler(params, None), leader=leader,
                    stops=StopMatcher(stop))


def make_sched(n_ctx: int = 256, n_slots: int = 4, budget: int = 64, **kw: object
               ) -> tuple[Scheduler, FakeContext, Recorder]:
    ctx = FakeContext(n_ctx, n_slots)
    rec = Recorder()
    sched = Scheduler(ctx, FakeVocab(), FakeBatch(budget), emit=rec, budget=budget, **kw)  # type: ignore[arg-type]
    return sched, ctx, rec


def run(sched: Scheduler, ctx: FakeContext, max_steps: int = 10_000) -> int:
    steps = 0
    while sched.has_work():
        sched.step()
        assert sched.kv.used == ctx.used(), "the ledger disagrees with the cache"
        steps += 1
        assert steps < max_steps
    return steps


def greedy_reference(prompt: Seq[int], max_tokens: int) -> list[int]:
    seen = list(prompt)
    out = []
    for _ in range(max_tokens):
        t = int(np.argmax(logits_for(seen)))
        out.append(t)
        seen.append(t)
    return out


PROMPTS = [[5 + i, 7, 9, 11 + i % 3] * (2 + i % 3) for i in range(6)]


def test_one_sequence_matches_the_reference() -> None:
    sched, ctx, rec = make_sched()
    sched.add([make_seq("a", PROMPTS[0], 10)])
    run(sched, ctx)
    assert rec.tokens("a") == greedy_reference(PROMPTS[0], 10)
    assert rec.finished("a").reason == "length"
    assert rec.finished("a").usage.completion_tokens == 10


def test_concurrent_sequences_match_running_alone() -> None:
    sched, ctx, rec = make_sched(n_slots=6)
    sched.add([make_seq(f"r{i}", p, 12) for i, p in enumerate(PROMPTS)])
    steps = run(sched, ctx)
    for i, p in enumerate(PROMPTS):
        assert rec.tokens(f"r{i}") == greedy_reference(p, 12)
    assert steps < 6 * 13  # batched: far fewer steps than one sequence after the other


def test_chunked_prefill_never_freezes_a_decoding_stream() -> None:
    sched, ctx, rec = make_sched(budget=8)
    sched.add([make_seq("short", [1, 2, 3], 30)])
    sched.step()  # prompt of "short"
    sched.add([make_seq("long", list(range(1, 41)), 2)])
    before = len(rec.tokens("short"))
    for step in range(1, 6):  # the 40-token prompt needs ≥ 5 steps of ≤ 7 tokens
        sched.step()
        assert len(rec.tokens("short")) == before + step  # one token every step
    run(sched, ctx)
    assert rec.tokens("long") == greedy_reference(list(range(1, 41)), 2)
    assert rec.tokens("short") == greedy_reference([1, 2, 3], 30)


def test_preemption_when_cells_run_out_still_gives_identical_results() -> None:
    prompts = [[3 + i, 4, 5, 6, 7, 8, 9, 10, 11, 12] for i in range(3)]
    sched, ctx, rec = make_sched(n_ctx=48, n_slots=3, budget=16)
    sched.add([make_seq(f"p{i}", p, 20) for i, p in enumerate(prompts)])
    run(sched, ctx)
    assert sched.n_preemptions > 0
    for i, p in enumerate(prompts):
        assert rec.tokens(f"p{i}") == greedy_reference(p, 20)
        assert rec.finished(f"p{i}").reason == "length"


def test_a_sequence_stops_at_the_end_of_the_context() -> None:
    sched, ctx, rec = make_sched(n_ctx=16, n_slots=1)
    sched.add([make_seq("a", [1, 2, 3, 4, 5, 6], 100)])
    run(sched, ctx)
    assert rec.finished("a").reason == "length"
    assert len(rec.tokens("a")) == 16 - 6 + 1  # positions 0..15, then one last sample


def test_prefix_sharing_reuses_a_finished_sequences_cells() -> None:
    sched, ctx, rec = make_sched(n_slots=2)
    shared = list(range(10, 30))
    sched.add([make_seq("first", [*shared, 1, 2], 4)])
    run(sched, ctx)
    evaluated = ctx.tokens_evaluated
    sched.add([make_seq("second", [*shared, 3, 4, 5], 4)])
    run(sched, ctx)
    assert rec.finished("second").usage.cached_tokens == len(shared)
    # prefill only the 3 new prompt tokens, then 3 decode steps (the 4th token is not fed)
    assert ctx.tokens_evaluated - evaluated == 3 + 3
    assert rec.tokens("second") == greedy_reference([*shared, 3, 4, 5], 4)


def test_a_fully_cached_prompt_re_evaluates_its_last_token() -> None:
    sched, ctx, rec = make_sched(n_slots=1)
    prompt = list(range(1, 20))
    sched.add([make_seq("a", prompt, 3)])
    run(sched, ctx)
    sched.add([make_seq("b", prompt, 3)])
    run(sched, ctx)
    assert rec.finished("b").usage.cached_tokens == len(prompt) - 1
    assert rec.tokens("b") == rec.tokens("a")


def test_prefix_of_a_live_sequence_is_shared() -> None:
    sched, ctx, rec = make_sched(n_slots=2)
    system = list(range(40, 60))
    sched.add([make_seq("live", [*system, 1], 30)])
    sched.step()
    sched.step()
    sched.add([make_seq("new", [*system, 2, 3], 5)])
    run(sched, ctx)
    assert rec.finished("new").usage.cached_tokens == len(system)
    assert rec.tokens("new") == greedy_reference([*system, 2, 3], 5)
    assert rec.tokens("live") == greedy_reference([*system, 1], 30)


def test_n_samples_share_the_prompt_cells() -> None:
    sched, ctx, rec = make_sched(n_slots=2)
    prompt = list(range(1, 31))
    lead = make_seq("n2", prompt, 6)
    follower = make_seq("n2", prompt, 6, index=1, leader=lead)
    sched.add([lead, follower])
    peak = 0
    while sched.has_work():
        sched.step()
        peak = max(peak, ctx.used())
    assert rec.finished("n2", 1).usage.cached_tokens == len(prompt) - 1
    assert rec.tokens("n2", 0) == rec.tokens("n2", 1)  # greedy: same text
    assert peak < 2 * len(prompt)  # the prompt is held once, not twice


def test_cancel_frees_the_cells_at_once() -> None:
    sched, ctx, rec = make_sched()
    sched.add([make_seq("a", list(range(1, 30)), 100)])
    sched.step()
    sched.step()
    assert ctx.used() > 0
    sched.cancel("a")
    assert ctx.used() == 0 and sched.kv.used == 0
    assert rec.finished("a").reason == "cancelled"
    assert not sched.has_work()


def test_stop_strings_end_a_reply_without_showing_the_stop() -> None:
    sched, ctx, rec = make_sched()
    reference = greedy_reference(PROMPTS[1], 12)
    text = "".join(chr(97 + t % 26) for t in reference)
    stop = text[5:7]
    sched.add([make_seq("s", PROMPTS[1], 12, stop=(stop,))])
    run(sched, ctx)
    shown = "".join(e.text for e in rec.events[("s", 0)] if isinstance(e, TokenEvent))
    assert shown == text[:text.index(stop)]
    assert rec.finished("s").reason == "stop"


def test_fail_sends_one_error_and_frees_everything() -> None:
    sched, ctx, rec = make_sched()
    lead = make_seq("x", [1, 2, 3], 50)
    sched.add([lead, make_seq("x", [1, 2, 3], 50, index=1, leader=lead)])
    sched.step()
    sched.fail("x", "EngineError", "boom")
    errors = [e for e in rec.events[("x", 0)] if isinstance(e, ErrorEvent)]
    assert [e.message for e in errors] == ["boom"]
    assert ctx.used() == 0 and not sched.has_work()


# ---- the speculative hook -----------------------------------------------------------------

class OracleDrafter:
    """Proposes the reference continuation, wrong on every `wrong_every`-th token."""

    cost_ratio = 0.1
    measured_speedup = 0.0
    off_reason = None

    def __init__(self, reference_seen: list[int], prompt_len: int, wrong_every: int = 0) -> None:
        self.full = reference_seen
        self.prompt_len = prompt_len
        self.wrong_every = wrong_every
        self.observed: list[tuple[int, int]] = []
        self.closed = False

    def propose(self, seq_tokens: Seq[int], k: int) -> DraftProposal:
        n = len(seq_tokens)
        out = list(self.full[n:n + k])
        if self.wrong_every:
            out = [(t + 1) % 60 + 1 if (n + i) % self.wrong_every == 0 else t
                   for i, t in enumerate(out)]
        return DraftProposal(tuple(out))

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        self.observed.append((drafted, accepted))

    def close(self) -> None:
        self.closed = True


class GreedyVerifier:
    def verify(self, proposal: DraftProposal, rows: np.ndarray, sampler: Sampler,
               history: Seq[int]) -> DraftVerdict:
        out: list[int] = []
        for i, x in enumerate(proposal.tokens):
            y = int(np.argmax(rows[i]))
            if y != x:
                return DraftVerdict((*out, y), len(out), len(proposal.tokens) - len(out))
            out.append(x)
        return DraftVerdict((*out, int(np.argmax(rows[len(out)]))), len(out), 0)


@pytest.mark.parametrize("wrong_every", [0, 3])
def test_speculative_rounds_keep_the_output_and_roll_back_rejections(wrong_every: int) -> None:
    prompt = PROMPTS[2]
    reference = greedy_reference(prompt, 20)
    sched, ctx, rec = make_sched(verifier=GreedyVerifier(), k_max=4)
    seq = make_seq("d", prompt, 20)
    drafter = OracleDrafter([*prompt, *reference], len(prompt), wrong_every)
    seq.drafter = drafter
    sched.add([seq])
    steps = run(sched, ctx)
    assert rec.tokens("d") == reference
    assert steps < 20  # several tokens per target step
    stats = [e for e in rec.events[("d", 0)] if isinstance(e, StepStats)]
    assert stats and sum(s.drafted for s in stats) == sum(d for d, _ in drafter.observed)
    flags = [e.from_draft for e in rec.events[("d", 0)] if isinstance(e, TokenEvent)]
    assert any(flags) and not all(flags)
    summary = rec.finished("d").speculative
    assert summary is not None and summary.accepted == sum(a for _, a in drafter.observed)
    if wrong_every == 0:
        assert summary.acceptance_rate == 1.0
    else:
        assert summary.acceptance_rate < 1.0
    assert drafter.closed


# ---- the slot table alone -------------------------------------------------------------------

def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [2]) == 0
    assert common_prefix([], [1]) == 0


def test_slot_table_counts_shared_cells_once() -> None:
    ctx = FakeContext(64, 3)
    kv = KvSlots(ctx, 3, 64)
    slot_a, reused = kv.acquire([1, 2, 3, 4, 5])  # type: ignore[misc]
    assert reused == 0
    kv.append(slot_a, [1, 2, 3, 4, 5])
    slot_b, reused = kv.acquire([1, 2, 3, 9])  # type: ignore[misc]
    assert slot_b != slot_a and reused == 3
    assert kv.used == 5  # three shared cells count once
    kv.release(slot_a, keep=False)
    assert kv.used == 3  # the shared ones stay for b
    kv.release(slot_b, keep=True)
    assert kv.cached_cells() == 3
    assert kv.evict_idle() == 3 and kv.used == 0


def test_a_cell_three_slots_share_is_freed_by_the_last_of_them() -> None:
    kv = KvSlots(FakeContext(64, 3), 3, 64)
    a, _ = kv.acquire([1, 2, 3, 4])  # type: ignore[misc]
    kv.append(a, [1, 2, 3, 4])
    b, reused_b = kv.acquire([1, 2, 3, 7])  # type: ignore[misc]
    c, reused_c = kv.acquire([1, 2, 8])  # type: ignore[misc]
    assert (reused_b, reused_c) == (3, 2) and kv.used == 4
    assert kv.truncate(a, 0) == 1  # only its own fourth cell
    assert kv.truncate(b, 0) == 1  # the third, now b's alone
    assert kv.used == 2
    assert kv.truncate(c, 0) == 2 and kv.used == 0


def test_models_that_cannot_share_cells_recompute_every_prompt() -> None:
    class NoShareVocab(FakeVocab):
        shares_prefixes = False

    ctx = FakeContext(128, 2)
    rec = Recorder()
    sched = Scheduler(ctx, NoShareVocab(), FakeBatch(64), emit=rec, budget=64)  # type: ignore[arg-type]
    for rid in ("a", "b"):
        sched.add([make_seq(rid, list(range(1, 20)), 3)])
        run(sched, ctx)
    assert rec.finished("b").usage.cached_tokens == 0
    assert ctx.used() == 0  # nothing kept as cache either
    assert rec.tokens("a") == rec.tokens("b")


def test_a_budget_smaller_than_the_streams_starves_no_one() -> None:
    sched, ctx, rec = make_sched(n_slots=6, budget=4)
    sched.add([make_seq(f"r{i}", [1 + i, 2, 3], 6) for i in range(6)])
    run(sched, ctx)
    for i in range(6):
        assert rec.tokens(f"r{i}") == greedy_reference([1 + i, 2, 3], 6)
