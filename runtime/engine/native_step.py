"""The native decode step: a step in which every running sequence is decoding goes to C in
one call — the batch of all their tokens (drafts included), `llama_decode`, the logits rows,
sampling or a speculative round's verify (runtime.llama.stepper, native/step.h) — and
Python keeps the decisions around it: which sequences and drafts go in (the same rules and
order as `Scheduler._plan`), and what the tokens mean afterwards (`Scheduler._sampled`,
`Scheduler._verified`: stop strings, EOS, max_tokens, UTF-8, events, statistics).

    sched = Scheduler(ctx, model, batch, emit=emit, budget=512,
                      native=NativeStep.for_context(ctx, verifier))   # None: Python only

What takes the Python path (`Scheduler._plan`, `_after_decode`), and at what grain:

- per step: a step with a prompt to prefill, an admission that may happen (a waiting
  request and an idle slot), a sequence at the end of its context, too few free cells for
  everyone's next token (eviction, preemption), or a decode llama.cpp refused (the Python
  path then plans again and handles it as it always has);
- per sequence, inside a native step: penalties, logprobs (`runtime.sampling.step_config`),
  a speculative round under a constraint (each row's mask is the grammar's state after the
  drafts before it: `SamplingVerifier` steps through them), or a verifier other than
  `SamplingVerifier` (the tests' biased ones) — their rows are read from the same decode
  and sampled or verified in Python.

Everything else — greedy and sampled, with and without a prompt-lookup or draft-model
round, and a constrained sequence's plain tokens — is sampled natively. The uniforms come
from each sequence's own generator (its BitGenerator capsule) in the order the Python path
draws them, so both paths give the same tokens for the same seed
(tests/engine/test_native_step.py); `OUTRIDER_NATIVE_STEP=0` switches the native step off.

Under a constraint, Python computes the mask of a sequence's next token before the step
(`Constraint.mask`) and hands it over as `TokenMask.step_form`, the short list of allowed
or refused ids; C masks the row with it, then makes the same checks, transform and draw as
for a plain row (native/step.h, `or_sample_masked`: the order of `Sampler.prepared`), and
Python moves the constraint on with the token afterwards, as always (`Scheduler._accept`).
Each mask depends on the token before it, so a constrained sequence takes one token per
step call, never a run (tests/engine/test_native_step_constrained.py).

Runs (`Stepper.run`): when no sequence drafts, has stop strings, a constraint or needs the
Python sampler, one call decodes up to RUN_STEPS steps (RUN_SECONDS at most), each feeding
back the tokens just sampled and ending a sequence at an end-of-generation token and at its
last allowed one (max_tokens, the context's end); Python then takes the tokens in order, as
after single steps. That is what takes Python off the per-token path of a fast sequence:
on the tiny fixture a token decodes in ~0.2 ms, and the Python after a decode runs with
caches the decode just emptied — 15-30 µs, several times its warm cost, 5-10% of the step;
now that cost comes once a run. A request that arrives meanwhile, or a cancel, rings the
engine's doorbell (`runtime.llama.stepper.Doorbell`) and the run ends after its current
step; a run ends as soon as a sequence ends while requests wait (its slot goes to the
next). Stop strings are Python's to find (in text), so their sequences take single steps:
no decode is wasted past a stop.

What Python still does a token of a run is the least it can: the token's piece, its text
(`Utf8Stream.push_all`, one C loop where every piece holds whole characters), and its cell
in the slot table; the run's tokens reach the request's handle as one `TokenRun`, whose
TokenEvents the reader's thread makes as it reads them. On the tiny fixture that took the
time between two runs of ~150 tokens from 0.76 to 0.57 ms; texts straight from the
vocabulary's cache (`Utf8Stream.push_run`) and a slot table that records a run's cells as
one list extend (`KvSlots.append`) took it to ~0.35 ms (benchmarks: docs/benchmarks.md).

(Runs on a thread of their own, overlapping Python's turn with the next decodes, were
tried: on this project's 2-core machine they measured 4-8% slower than these plain runs,
the Python and the decode then competing for the cores.)
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, NamedTuple

from runtime.engine.scheduler import Scheduler, StepReport, _Entry
from runtime.events import TokenRun
from runtime.llama.binding import LlamaContext
from runtime.llama.stepper import Doorbell, Stepper, StepTimings
from runtime.sampling.step_config import StepConfig, step_config, step_error
from runtime.speculative.api import Verifier
from runtime.speculative.speculation import SamplingVerifier

_LAST_STEP = attrgetter("last_step")
# A run of plain decode steps in one call ends after this many steps or this long (checked
# after each step), or at once when the engine's doorbell rings (a request, a cancel: they
# wait one step, not a run). The limit is the stream's grain: 40 ms, the chat window's own
# repaint interval (app/chat/transcript.py), so the window shows a reply as often as it
# would token by token; on the tiny fixture one sequence takes ~250 steps a run, eight ~20.
# Each run pays Python's cold start once (its caches emptied by the decodes, ~0.35 ms
# between two runs on the tiny fixture): 8 ms runs cost ~9 µs of Python a token there,
# 30 ms runs ~5, 40 ms runs ~4.
RUN_STEPS = 256
RUN_SECONDS = 0.04


class _Plan(NamedTuple):
    """How the native step treats one sequence (fixed for its life; `Sequence.native`)."""

    sample: StepConfig | None  # None: its rows are sampled in Python
    verify: StepConfig | None  # None: its rounds are verified in Python
    with_q: bool  # a leviathan round: the draft's q rows go in
    runs: bool  # plain decode steps may run back to back (no drafter, stop strings, mask)
    masked: bool  # constrained: each native token goes in with the constraint's mask


class NativeStep:
    """Implements `runtime.engine.scheduler.FastStep` over a `Stepper`."""

    def __init__(self, stepper: Stepper, verifier: Verifier | None,
                 doorbell: Doorbell | None = None) -> None:
        self.stepper = stepper
        self._doorbell = doorbell.address if doorbell is not None else 0
        self._step = stepper.step
        self._run = stepper.run
        # The verify rule the C code applies: SamplingVerifier's own; any other verifier's
        # rounds are its own to judge.
        self._rule = verifier.rule if type(verifier) is SamplingVerifier else None

    @classmethod
    def for_context(cls, ctx: LlamaContext, verifier: Verifier | None,
                    doorbell: Doorbell | None = None) -> NativeStep | None:
        """The native step for `ctx`, or None (extension not built, or switched off).
        `doorbell`: the engine's, which ends a run when a command comes in."""
        stepper = Stepper.for_context(ctx)
        return cls(stepper, verifier, doorbell) if stepper is not None else None

    def timings(self) -> StepTimings:
        return self.stepper.timings()

    def _plan_of(self, seq: Any) -> _Plan:
        if seq.logprobs is not None:
            plan = _Plan(None, None, False, False, False)
        else:
            rule = self._rule
            cfg = step_config(seq.sampler, rule or "leviathan", masks=True)
            masked = cfg is not None and seq.sampler.constraint is not None
            verify = cfg if rule is not None and not masked else None
            runs = cfg is not None and not masked and seq.drafter is None and not seq.stops.stops
            plan = _Plan(cfg, verify, verify is not None and verify[0] == 1, runs, masked)
        seq.native = plan
        return plan

    @staticmethod
    def _mask_of(sched: Scheduler, seq: Any) -> Any:
        """The step form of `seq`'s mask for its next token (None: free text there, as a
        lazy grammar's before its trigger). A mask that cannot be computed (the grammar
        failed, or allows nothing) fails the request, as on the Python path, before any of
        its samples goes into the batch."""
        try:
            mask = seq.sampler.constraint.mask()
        except Exception as exc:  # this request's failure alone
            sched._failed(seq, exc)
            return None
        return None if mask is None else mask.step_form

    def step(self, sched: Scheduler, t0: float) -> StepReport | None:
        """One step, or None where it must take the Python path (see the module doc)."""
        running = sched.running
        if not running:
            return None
        n_ctx = sched.ctx.n_ctx
        for seq in running:
            n = len(seq.tokens)
            if seq.n_computed != n - 1 or n == 1 or n > n_ctx:
                return None  # a prompt to evaluate, or the context is at its end
        kv = sched.kv
        if kv.free < len(running) or sched.budget < len(running):
            return None  # cells to free first (eviction, preemption) or a rotation
        if sched.waiting and not all(kv.busy):
            return None  # an admission may happen this step
        decoders = sorted(running, key=_LAST_STEP) if len(running) > 1 else list(running)
        seq_plans = [seq.native if seq.native is not None else self._plan_of(seq)
                     for seq in decoders]
        if all(plan.runs for plan in seq_plans):
            return self._steps_back_to_back(sched, decoders, t0)
        # Every mask first: one that fails ends its request before any of its samples is
        # in the batch (no cells decoded for a request that is gone).
        masks = [self._mask_of(sched, seq) if plan.masked and not seq.finished else None
                 for seq, plan in zip(decoders, seq_plans, strict=True)]

        # The batch, as Scheduler._plan fills it: one token each, then the drafts.
        left = sched.budget
        spare = kv.free - len(decoders)
        entries: list[tuple[Any, ...]] = []
        plans: list[_Entry] = []
        n_rows = 0
        for seq, plan, mask in zip(decoders, seq_plans, masks, strict=True):
            if left <= 0:
                break
            if seq.finished:  # another sample of its request failed just now
                continue
            proposal = None
            if seq.drafter is not None:
                try:
                    proposal = sched._propose(seq, min(left - 1, spare))
                except Exception as exc:
                    sched._failed(seq, exc)
                if seq.finished:
                    continue
            last = seq.tokens[-1]
            if proposal is not None and proposal.tokens:
                fed = (last, *proposal.tokens)
                q = proposal.q_rows if plan.with_q else None
                entries.append((seq.slot, seq.n_computed, fed, plan.verify, q))
                plans.append(_Entry(seq, list(fed), n_rows, proposal))
                n_rows += len(fed)
                left -= len(fed)
                spare -= len(fed) - 1
            else:
                entries.append((seq.slot, seq.n_computed, last, plan.sample, None, mask))
                plans.append(_Entry(seq, [last], n_rows))
                n_rows += 1
                left -= 1
            seq.last_step = sched._steps
        if not entries:
            return None
        rc, results = self._step(entries)
        if rc != 0 or results is None:
            return None  # the Python path plans again and answers the failure as always
        return self._after(sched, plans, results, n_rows, t0)

    def _steps_back_to_back(self, sched: Scheduler, decoders: list[Any],
                            t0: float) -> StepReport | None:
        """Plain decode steps for `decoders` in one call (`Stepper.run`), then what each
        token means, in order, as after single steps. None when the first decode failed
        (the Python path's to answer)."""
        n_ctx = sched.ctx.n_ctx
        entries = []
        for seq in decoders:
            seq.last_step = sched._steps
            # Tokens it may take before "length" (Scheduler._accept): max_tokens, then the
            # context's last position.
            room = min(seq.sampling.max_tokens - seq.n_generated, n_ctx + 1 - len(seq.tokens))
            entries.append((seq.slot, seq.n_computed, seq.tokens[-1], seq.native.sample,
                            max(1, room), not seq.sampling.ignore_eos))
        # Each step takes a cell per sequence: never more steps than free cells allow. A
        # decode that fails after the first step: the steps before it stand, and the next
        # step meets the failure again (here or on the Python path).
        max_steps = min(RUN_STEPS, sched.kv.free // len(decoders))
        _rc, steps, results = self._run(entries, max_steps, RUN_SECONDS, bool(sched.waiting),
                                        self._doorbell)
        if steps == 0:
            return None
        return self._take(sched, decoders, results, t0)

    def _take(self, sched: Scheduler, decoders: list[Any], results: list[Any],
              t0: float) -> StepReport:
        """Each sequence's tokens of a run, in order."""
        now = sched.clock()
        decoded = width = 0
        for seq, (tokens, err) in zip(decoders, results, strict=True):
            if seq.finished or (not tokens and not err):
                continue
            slot, pos0 = seq.slot, seq.n_computed
            width += bool(tokens)
            try:
                if tokens:
                    decoded += self._take_run(sched, seq, tokens, now)
                if err and not seq.finished:  # the last step's rows could not be sampled
                    sched.kv.append(slot, (seq.tokens[-1],))
                    seq.n_computed += 1
                    raise step_error(err)
            except Exception as exc:  # this request's failure alone
                sched._failed(seq, exc)
            kept = seq.n_computed - pos0
            if kept < len(tokens) + bool(err):  # it ended inside the run: drop the rest
                sched.ctx.seq_rm(slot, pos0 + kept, -1)
        return StepReport(decoded, 0, sched.clock() - t0, width=width)

    @staticmethod
    def _take_run(sched: Scheduler, seq: Any, tokens: tuple[int, ...], now: float) -> int:
        """Accept a run's tokens for `seq` in order; returns how many were taken.

        The run ends a sequence's tokens at an end-of-generation token and at its last
        allowed one, so only the last token can end the reply: it goes through
        `Scheduler._sampled` like any. Each one before it is what `Scheduler._accept` does
        for a token that ends nothing, for a sequence without constraint, stop strings or
        logprobs (`_Plan.runs`): append it, its text, its event — here without the checks
        that cannot fire, and with one `TokenRun` for all their events (the handle makes
        them: the engine thread's Python here is what a run pays a token)."""
        head, last = tokens[:-1], tokens[-1]
        fed = (seq.tokens[-1], *head)  # what each step evaluated
        kv = sched.kv
        if head:
            kv.append(seq.slot, fed[:-1])
            seq.n_computed += len(head)
            seq.tokens.extend(head)
            if seq.t_first_token is None:
                seq.t_first_token = now
            seq.t_last_token = now
            texts = seq.utf8.push_run(sched.vocab, head)
            sched.emit(seq, TokenRun(seq.request_id, seq.index, head, texts))
        kv.append(seq.slot, (fed[-1],))
        seq.n_computed += 1
        sched._sampled(seq, last, None, now, True)
        return len(tokens)

    def _after(self, sched: Scheduler, plans: list[_Entry], results: list[Any], n_rows: int,
               t0: float) -> StepReport:
        """What the tokens mean: Scheduler._after_decode for a step of decoders."""
        now = sched.clock()
        logits = None
        decoded = drafted = accepted = width = 0
        kv = sched.kv
        for entry, res in zip(plans, results, strict=True):
            seq = entry.seq
            if seq.finished:  # its request failed earlier in this loop
                continue
            try:
                if entry.proposal is not None:
                    if res is None:  # a round for the Python verifier
                        if logits is None:
                            logits = sched.ctx.logits(n_rows)
                        d, a = sched._verify(entry, logits, now)
                    else:
                        if isinstance(res, int):
                            raise step_error(res)
                        d, a = sched._verified(entry, res[0], res[1], None, now)
                    drafted += d
                    accepted += a
                    decoded += a + 1
                    width += 1
                    continue
                kv.append(seq.slot, entry.tokens)
                seq.n_computed += 1
                row = None
                if res is None:  # sampled in Python (penalties, logprobs)
                    if logits is None:
                        logits = sched.ctx.logits(n_rows)
                    row = logits[entry.row]
                    token = seq.sampler.sample(row, seq.tokens)
                elif res < 0:
                    raise step_error(res)
                else:
                    token = res
                decoded += 1
                width += 1
                sched._sampled(seq, token, row, now, True)
            except Exception as exc:  # this request's failure alone
                sched._failed(seq, exc)
        return StepReport(decoded, 0, sched.clock() - t0, drafted, accepted, width)
