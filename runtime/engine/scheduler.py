"""Continuous batching: which tokens of which sequences go into the next `llama_decode`.

Each `step()` builds ONE batch, in this order, within a token budget (n_batch):

1. the next token of every decoding sequence (with its draft tokens when it has a drafter);
2. chunks of running prompts (chunked prefill: a long prompt never freezes other streams);
3. newly admitted sequences (FIFO), each taking an idle slot and reusing the longest cached
   prefix (`KvSlots.acquire`), admitted only while their whole remaining prompt fits in free
   cells (idle caches are evicted, least recently used first, to make room).

Then one decode, and per-sequence sampling of the rows that asked for logits. When cells run
out — the planner sees it first; llama.cpp's "no KV slot" (1) is the backstop — the newest
running sequence is preempted: its cells are freed, it goes back to the front of the queue
keeping its generated tokens, and is recomputed later (its prefix may still be cached).

    sched = Scheduler(ctx, model, emit=on_event)
    sched.add([seq])
    while sched.has_work():
        sched.step()

Events (TokenEvent, StepStats, Finished, ErrorEvent) leave through `emit(seq, event)`; the
native step's runs give their plain tokens as one `TokenRun` each, which the request's
handle turns back into TokenEvents (runtime.engine.handle).

A failure belongs to one request: an exception while drafting for, sampling or accepting the
tokens of one sequence (NaN logits, a drafter's bug) fails that sequence's request with an
ErrorEvent (`_guarded`) and the step goes on for everyone else, cache intact. Only the decode
itself, which no one request owns, can fail the whole step.

Structured output: a sequence's constraint (runtime.sampling.constraint, the same object
its sampler masks with) advances on every accepted token, drafts included; once the grammar
is complete (`done`) the reply finishes with "stop" there. A token the grammar refuses (a
lazy trigger followed by text that does not fit) is a ConstraintError for that request.
Logprobs, when asked, are computed from the row each token was sampled from — for accepted
drafts, the verify rows — before the token moves the constraint on.

Preemption always makes progress: the victim is the running sequence that *arrived* last
(ties: the higher sample index), and a preempted sequence keeps its arrival, so the oldest
request is never preempted for a newer one and runs to its end; without that, a recomputed
sequence counted as "newest" again and the same ones were thrown out over and over.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from runtime.engine.kv_slots import KvSlots, SavedPrefixes
from runtime.engine.sequence import Sequence, Status
from runtime.errors import EngineError, OutriderError
from runtime.events import (
    ErrorEvent,
    Event,
    Finished,
    FinishReason,
    StepStats,
    TokenEvent,
    TokenLogprob,
    TokenRun,
    Usage,
)
from runtime.speculative.api import DraftProposal, Verifier

logger = logging.getLogger("outrider.scheduler")

NO_KV_SLOT = 1
_NO_LOGPROBS: tuple[TokenLogprob | None, tuple[TokenLogprob, ...]] = (None, ())


class Context(Protocol):
    """What the scheduler needs of a llama context (runtime.llama.binding.LlamaContext)."""

    n_ctx: int
    n_seq_max: int

    def decode(self, batch: Any) -> int: ...

    def logits(self, n_outputs: int) -> np.ndarray: ...

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_pos_min(self, seq_id: int) -> int: ...


class Vocab(Protocol):
    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...


class FastStep(Protocol):
    """A faster path for a step that is only decoding (runtime.engine.native_step): it
    returns the step's report, or None to let the Python path below plan and run it."""

    def step(self, sched: Scheduler, t0: float) -> StepReport | None: ...


class BatchLike(Protocol):
    n_tokens: int
    n_outputs: int

    def clear(self) -> None: ...

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int: ...

    def add_tokens(self, tokens: Seq[int], pos0: int, seq_id: int, logits_last: bool) -> int: ...

    def add_tokens_all_logits(self, tokens: Seq[int], pos0: int, seq_id: int) -> int: ...


@dataclass
class _Entry:
    seq: Sequence
    tokens: list[int]  # fed this step
    row: int  # output row of the last token (-1: none); first row for drafts
    proposal: DraftProposal | None = None
    media: int = 0  # image positions mtmd evaluated for it before the batch


class StepReport(NamedTuple):  # a tuple: made once per step, ~5x faster than a dataclass
    decoded: int  # tokens generated this step (accepted drafts included)
    prefilled: int  # prompt (or recomputed) tokens evaluated
    seconds: float
    drafted: int = 0
    accepted: int = 0
    # Sequences that got tokens from one decode (the most, where the native step ran several
    # decodes back to back: runtime.engine.native_step).
    width: int = 0


class Scheduler:
    """Owns the running/waiting sequences and the slot table of one context."""

    def __init__(self, ctx: Context, vocab: Vocab, batch: BatchLike, *,
                 emit: Callable[[Sequence, Event | TokenRun], None], budget: int,
                 verifier: Verifier | None = None, k_max: int = 0,
                 clock: Callable[[], float] = time.perf_counter,
                 store: SavedPrefixes | None = None, native: FastStep | None = None) -> None:
        self.ctx = ctx
        self.native = native
        self.vocab = vocab
        self.batch = batch
        self.emit = emit
        self.budget = max(1, budget)
        self.verifier = verifier
        self.k_max = k_max
        self.clock = clock
        self.kv = KvSlots(ctx, ctx.n_seq_max, ctx.n_ctx,
                          sharing=getattr(vocab, "shares_prefixes", True), store=store,
                          window=getattr(ctx, "swa_window", 0))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._order = itertools.count(1)
        self.n_preemptions = 0
        self._steps = 0

    # ---- requests ---------------------------------------------------------------------------

    def add(self, seqs: Seq[Sequence]) -> None:
        self.waiting.extend(seqs)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def cancel(self, request_id: str) -> None:
        """Finish every unfinished sample of a request as "cancelled"; frees cells at once."""
        for seq in [s for s in self.running if s.request_id == request_id]:
            self._finish(seq, "cancelled")
        for seq in [s for s in self.waiting if s.request_id == request_id]:
            self.waiting.remove(seq)
            self._finish(seq, "cancelled")

    def cancel_all(self) -> None:
        for seq in list(self.running) + list(self.waiting):
            if seq.status is Status.WAITING:
                self.waiting.remove(seq)
            self._finish(seq, "cancelled")

    def fail(self, request_id: str, kind: str, message: str) -> None:
        """End a request with an ErrorEvent (its samples are dropped silently after it)."""
        seqs = [s for s in self.running + list(self.waiting) if s.request_id == request_id]
        for seq in seqs:
            if seq.status is Status.WAITING:
                self.waiting.remove(seq)
            else:
                # A failed decode may leave cells the ledger never saw: remove them too.
                self.ctx.seq_rm(seq.slot, len(self.kv.tokens[seq.slot]), -1)
                self._drop(seq, keep=False)
            seq.status = Status.FINISHED
        if seqs:
            self.emit(seqs[0], ErrorEvent(request_id, kind, message))

    # ---- one step ---------------------------------------------------------------------------

    def step(self) -> StepReport:
        t0 = self.clock()
        self._steps += 1
        if self.native is not None:
            report = self.native.step(self, t0)
            if report is not None:
                return report
        for _attempt in range(len(self.running) + len(self.waiting) + 2):
            entries = self._plan()
            if not any(e.tokens or e.media for e in entries):  # (an image waiting for cells)
                if self.running:
                    # Nothing could be scheduled although sequences run: cells are exhausted
                    # by prompts in flight. The oldest keeps going; the newest waits.
                    self._preempt(self._newest())
                    continue
                return StepReport(0, 0, self.clock() - t0)
            # A step may be all images (evaluated by mtmd while planning): no batch to run.
            rc = self.ctx.decode(self.batch) if self.batch.n_tokens else 0
            if rc == 0:
                return self._after_decode(entries, t0)
            if rc == NO_KV_SLOT and len(self.running) > 1:
                logger.debug("no KV slot for the batch: preempting the newest sequence")
                self._preempt(self._newest())
                continue
            message = ("the context is full" if rc == NO_KV_SLOT
                       else f"llama.cpp failed to evaluate the batch (code {rc})")
            for entry in entries:
                self.fail(entry.seq.request_id, "EngineError" if rc != NO_KV_SLOT else "ContextOverflow",
                          message)
            return StepReport(0, 0, self.clock() - t0)
        return StepReport(0, 0, self.clock() - t0)

    # ---- planning ---------------------------------------------------------------------------

    def _plan(self) -> list[_Entry]:
        batch, kv = self.batch, self.kv
        batch.clear()
        entries: list[_Entry] = []
        left = self.budget
        n_ctx = self.ctx.n_ctx

        # 1. decoders: one token each (+ drafts). Make room first, preempting the newest.
        # Least recently served first, so a budget smaller than the slot count starves no one.
        decoders = sorted((s for s in self.running if s.decoding), key=lambda s: s.last_step)
        for seq in decoders:
            if len(seq.tokens) > n_ctx:  # position n_ctx does not exist
                self._finish(seq, "length")
        decoders = [s for s in decoders if not s.finished]
        while decoders and kv.free < len(decoders):
            if kv.evict_idle() >= 0:
                continue
            victim = self._newest()
            self._preempt(victim)
            decoders = [s for s in decoders if s is not victim]
        spare = kv.free - len(decoders)  # cells left for draft tokens
        for seq in decoders:
            if left <= 0:
                break
            if seq.finished:  # another sample of its request failed just now
                continue
            proposal = None
            with self._guarded(seq):
                proposal = self._propose(seq, min(left - 1, spare))
            if seq.finished:
                continue
            if proposal is not None and proposal.tokens:
                fed = [seq.tokens[-1], *proposal.tokens]
                row = batch.add_tokens_all_logits(fed, seq.n_computed, seq.slot)
                entries.append(_Entry(seq, fed, row, proposal))
            else:
                fed = [seq.tokens[-1]]
                row = batch.add(fed[0], seq.n_computed, seq.slot, True)
                entries.append(_Entry(seq, fed, row))
            left -= len(fed)
            spare -= len(fed) - 1
            seq.last_step = self._steps
        reserved = sum(len(e.tokens) for e in entries)

        def prefill(seq: Sequence) -> bool:
            """As many of `seq`'s pending tokens as the budget and the free cells allow into
            the batch; False when none fit."""
            nonlocal left, reserved
            n = min(seq.pending, left, kv.free - reserved)
            if n <= 0:
                return False
            entry = self._prefill_entry(seq, n, kv.free - reserved)
            entries.append(entry)
            left -= len(entry.tokens) + entry.media
            reserved += len(entry.tokens)
            return True

        # 2. running prompts, then 3. admissions — within the budget and the free cells.
        for seq in [s for s in self.running if not s.decoding and not s.finished]:
            if left <= 0:
                break
            prefill(seq)
        while self.waiting and left > 0:
            admitted = self._admit(reserved, n_running=len(self.running))
            if admitted is None or not prefill(admitted):
                break
        return entries

    def _prefill_entry(self, seq: Sequence, n: int, room: int) -> _Entry:
        """Up to `n` pending tokens of `seq` into the batch. With images (runtime.engine.
        media_prompt) an image that comes next is evaluated now, in `room` free cells, and
        the text stops before the next image."""
        if seq.t_scheduled is None:
            seq.t_scheduled = self.clock()
        media = 0
        if seq.media is not None:
            with self._guarded(seq):
                media, n = seq.media.prefill(seq, n, room, self.ctx, self.kv, self.budget)
            if seq.finished:
                return _Entry(seq, [], -1)
        start = seq.n_computed
        fed = seq.tokens[start:start + n]
        last = start + n == len(seq.tokens)
        row = self.batch.add_tokens(fed, start, seq.slot, last) if fed else -1
        return _Entry(seq, fed, row, media=media)

    def _propose(self, seq: Sequence, room: int) -> DraftProposal | None:
        if seq.drafter is None or self.verifier is None or self.k_max <= 0:
            return None
        k = min(self.k_max, seq.sampling.max_tokens - seq.n_generated - 1,
                self.ctx.n_ctx - len(seq.tokens) - 1, room)
        if k <= 0:
            return None
        proposal = seq.drafter.propose(seq.tokens, k)
        if len(proposal.tokens) > k:
            proposal = DraftProposal(proposal.tokens[:k],
                                     None if proposal.q_rows is None else proposal.q_rows[:k])
        return proposal

    def _admit(self, reserved: int, n_running: int) -> Sequence | None:
        """Admit the first waiting sequence that may start now, or None."""
        kv = self.kv
        for seq in list(self.waiting):
            leader = seq.leader
            if (leader is not None and leader.status is Status.RUNNING
                    and leader.n_computed < leader.prompt_len - 1):
                continue  # n > 1: wait for the leader's prompt cells, then share them
            if not kv.idle_slots():
                return None
            src, match = kv.best_match(seq.tokens)
            need = len(seq.tokens) - min(match, len(seq.tokens) - 1)
            # A saved prefix (runtime.engine.kv_store) longer than any slot's: its cells are
            # restored whole, then cut to the common part.
            stored = kv.stored_match(seq.tokens, min(match, len(seq.tokens) - 1))
            if stored is not None:
                need = stored.n_tokens + len(seq.tokens) - stored.usable
            while kv.free - reserved < need and kv.evict_idle(keep=src) >= 0:
                pass
            if stored is not None and kv.free - reserved < need:
                stored = None
                need = len(seq.tokens) - min(match, len(seq.tokens) - 1)
            if kv.free - reserved < need and n_running > 0:
                return None  # wait for running sequences to finish (FIFO: no overtaking)
            resumed = kv.acquire_stored(seq.tokens, stored) if stored is not None else None
            taken = kv.acquire(seq.tokens) if resumed is None else resumed[:2]
            if taken is None:
                return None
            self.waiting.remove(seq)
            seq.slot, reused = taken
            if seq.media is not None and seq.media.aligned(reused) < reused:
                reused = seq.media.aligned(reused)  # an image is evaluated whole
                kv.truncate(seq.slot, reused)
            seq.n_computed = reused
            if not seq.admitted_once:
                seq.cached_tokens = min(reused, seq.prompt_len)
                if resumed is not None:
                    seq.resumed_tokens, seq.restore_s = seq.cached_tokens, resumed[2]
                seq.admitted_once = True
            seq.status = Status.RUNNING
            seq.order = next(self._order)
            self.running.append(seq)
            return seq
        return None

    # ---- after the decode ---------------------------------------------------------------------

    def _after_decode(self, entries: list[_Entry], t0: float) -> StepReport:
        logits = self.ctx.logits(self.batch.n_outputs) if self.batch.n_outputs else None
        decoded = prefilled = drafted = accepted = width = 0
        now = self.clock()
        for entry in entries:
            seq = entry.seq
            if seq.finished:  # its request failed earlier in this loop (another sample's error)
                continue
            if entry.proposal is not None:
                assert logits is not None
                with self._guarded(seq):
                    d, a = self._verify(entry, logits, now)
                    drafted += d
                    accepted += a
                    decoded += a + 1
                    width += 1
                continue
            self.kv.append(seq.slot, entry.tokens)
            is_decode = len(entry.tokens) == 1 and seq.n_computed >= seq.prompt_len
            seq.n_computed += len(entry.tokens)
            if not is_decode:
                prefilled += len(entry.tokens) + entry.media
                if seq.t_first_token is None:
                    seq.prefill_computed += len(entry.tokens) + entry.media
            if entry.row < 0:
                continue
            assert logits is not None
            with self._guarded(seq):
                row = logits[entry.row]
                token = seq.sampler.sample(row, seq.tokens)
                decoded += 1
                width += 1
                self._sampled(seq, token, row, now, is_decode)
        return StepReport(decoded, prefilled, self.clock() - t0, drafted, accepted, width)

    def _sampled(self, seq: Sequence, token: int, row: np.ndarray | None, now: float,
                 is_decode: bool) -> None:
        """Accept a token sampled from `row` (its logprobs come from that row, when asked);
        after a decode step, say once when drafting switched off (or back on)."""
        self._accept(seq, token, from_draft=False, now=now,
                     logprobs=_NO_LOGPROBS if seq.logprobs is None or row is None
                     else self._logprobs(seq, row, token))
        drafter = seq.drafter
        if (is_decode and drafter is not None and not seq.finished
                and drafter.off_reason != seq.spec_off_said):
            seq.spec_off_said = drafter.off_reason
            self.emit(seq, self._step_stats(seq, 0, 0))

    @contextmanager
    def _guarded(self, seq: Sequence) -> Iterator[None]:
        """Run one sequence's share of the step; an exception fails its request alone."""
        try:
            yield
        except Exception as exc:
            self._failed(seq, exc)

    def _failed(self, seq: Sequence, exc: Exception) -> None:
        """`seq`'s share of the step raised: its request fails with the error, in one line."""
        if isinstance(exc, OutriderError):
            kind, message = type(exc).__name__, str(exc)
        else:
            logger.error("request %s failed inside a step", seq.request_id, exc_info=exc)
            kind = EngineError.__name__
            message = f"the engine failed on this request: {type(exc).__name__}: {exc}"
        if not seq.finished:
            self.fail(seq.request_id, kind, message)

    def _verify(self, entry: _Entry, logits: np.ndarray, now: float) -> tuple[int, int]:
        seq, proposal = entry.seq, entry.proposal
        assert proposal is not None and self.verifier is not None and seq.drafter is not None
        k = len(proposal.tokens)
        rows = logits[entry.row:entry.row + k + 1]
        verdict = self.verifier.verify(proposal, rows, seq.sampler, seq.tokens)
        return self._verified(entry, verdict.n_accepted, verdict.tokens, rows, now)

    def _verified(self, entry: _Entry, n_acc: int, tokens: Seq[int], rows: np.ndarray | None,
                  now: float) -> tuple[int, int]:
        """Keep a round's verdict: the accepted drafts' cells, then each token in turn (rows:
        the target's k + 1 rows, for logprobs when asked). Returns (drafted, accepted)."""
        seq = entry.seq
        assert seq.drafter is not None
        k = len(entry.tokens) - 1
        base = seq.n_computed
        self.kv.append(seq.slot, entry.tokens)
        self.kv.truncate(seq.slot, base + 1 + n_acc)  # drop the rejected drafts' cells
        seq.n_computed = base + 1 + n_acc
        seq.spec.record_round(drafted=k, accepted=n_acc)
        seq.drafter.observe(k, n_acc, self.clock() - now)
        for i, token in enumerate(tokens):
            if seq.finished:  # a stop string, EOS, max_tokens or a complete grammar
                break
            self._accept(seq, token, from_draft=i < n_acc, now=now,
                         logprobs=_NO_LOGPROBS if seq.logprobs is None or rows is None
                         else self._logprobs(seq, rows[i], token))
        seq.spec_off_said = seq.drafter.off_reason
        self.emit(seq, self._step_stats(seq, k, n_acc))
        return k, n_acc

    @staticmethod
    def _step_stats(seq: Sequence, k: int, n_acc: int) -> StepStats:
        """The round's statistics (runtime.speculative.stats), the drafter's timings in."""
        drafter = seq.drafter
        return seq.spec.step_stats(
            seq.request_id, seq.index, drafted=k, accepted=n_acc,
            cost_ratio=drafter.cost_ratio if drafter is not None else 0.0,
            measured_speedup=drafter.measured_speedup if drafter is not None else 0.0,
            drafting_off_reason=drafter.off_reason if drafter is not None else None)

    def _accept(self, seq: Sequence, token: int, *, from_draft: bool, now: float,
                logprobs: tuple[TokenLogprob | None, tuple[TokenLogprob, ...]] = _NO_LOGPROBS,
                ) -> None:
        """Append one sampled token: constraint, text, stop strings, EOS, max_tokens,
        context end."""
        if seq.t_first_token is None:
            seq.t_first_token = now
        seq.t_last_token = now
        params = seq.sampling
        if self.vocab.is_eog(token) and not params.ignore_eos:
            tail = self._drain(seq)
            if tail:  # held-back text that turned out not to be a stop string
                self.emit(seq, TokenEvent(seq.request_id, seq.index, token, tail, from_draft,
                                          *logprobs))
            self._finish(seq, "stop")
            return
        constraint = seq.constraint
        if constraint is not None:
            constraint.advance(token)  # a ConstraintError fails this request (_guarded)
        seq.tokens.append(token)
        text, stopped = seq.stops.push(seq.utf8.push(self.vocab.piece(token)))
        reason: FinishReason | None = "stop" if stopped else None
        if reason is None and constraint is not None and constraint.done:
            reason = "stop"  # the grammar is complete: nothing may follow
            text += self._drain(seq)
        if reason is None and (seq.n_generated >= params.max_tokens
                               or len(seq.tokens) > self.ctx.n_ctx):
            reason = "length"
            text += self._drain(seq)
        self.emit(seq, TokenEvent(seq.request_id, seq.index, token, text, from_draft, *logprobs))
        if reason is not None:
            self._finish(seq, reason)

    def _logprobs(self, seq: Sequence, row: np.ndarray,
                  token: int) -> tuple[TokenLogprob | None, tuple[TokenLogprob, ...]]:
        """The token's logprob and the top ones (runtime.sampling.sampler defines them), from
        the row it was sampled from, before it moves the constraint. Only when asked."""
        assert seq.logprobs is not None
        value, top = seq.sampler.logprobs(row, seq.tokens, token, seq.logprobs)
        return (TokenLogprob(token, self._piece(token), value),
                tuple(TokenLogprob(t, self._piece(t), v) for t, v in top))

    def _piece(self, token: int) -> bytes:
        """A token's bytes for logprobs: its text piece, or its vocabulary text for a control
        token (which prints as nothing): b"<|im_end|>" rather than b"" in a top list."""
        piece = self.vocab.piece(token)
        if piece:
            return piece
        text = getattr(self.vocab, "token_text", None)
        return text(token).encode("utf-8") if text is not None else b""

    @staticmethod
    def _drain(seq: Sequence) -> str:
        """Text still held at the end of a reply: an incomplete character, a stop prefix."""
        flushed = seq.utf8.flush()
        text = seq.stops.push(flushed)[0] if flushed else ""
        return text + seq.stops.flush()

    # ---- leaving ------------------------------------------------------------------------------

    def _newest(self) -> Sequence:
        """The preemption victim: latest arrival (a preempted sequence keeps its own)."""
        return max(self.running, key=lambda s: (s.arrival, s.index, s.order))

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's cells and requeue it (front) for recomputation."""
        self._drop(seq, keep=False)
        seq.status = Status.WAITING
        seq.n_computed = 0
        seq.n_preempted += 1
        self.n_preemptions += 1
        if seq.drafter is not None:
            seq.drafter.close()
        # Back in arrival order among the waiting: preempted work resumes before new work.
        self.waiting.appendleft(seq)
        ordered = sorted(self.waiting, key=lambda s: s.arrival)
        self.waiting.clear()
        self.waiting.extend(ordered)

    def _drop(self, seq: Sequence, keep: bool) -> None:
        if seq in self.running:
            self.running.remove(seq)
            if keep and seq.n_computed < len(self.kv.tokens[seq.slot]):
                self.kv.truncate(seq.slot, seq.n_computed)
            self.kv.release(seq.slot, keep=keep)
            seq.slot = -1

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.finished:
            return
        # A finished reply's cells stay as prefix cache; a cancelled one's are freed at once.
        self._drop(seq, keep=reason != "cancelled")
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if seq.drafter is not None:
            seq.drafter.close()
        now = self.clock()
        spec = None
        if seq.spec.rounds:
            spec = seq.spec.summary(seq.drafter.measured_speedup if seq.drafter else 0.0)
        usage = Usage(prompt_tokens=seq.prompt_len, completion_tokens=max(0, seq.n_generated),
                      cached_tokens=seq.cached_tokens, truncated_tokens=seq.truncated_tokens,
                      resumed_tokens=seq.resumed_tokens)
        self.emit(seq, Finished(seq.request_id, seq.index, reason, usage, seq.timings(now), spec,
                                seq.stops.hit if reason == "stop" else None))
