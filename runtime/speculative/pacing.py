"""Per-sequence pacing of speculative rounds: how many tokens to draft, what each round
really cost, and the reply's timing (for the measured speedup).

A drafter sees the scheduler only through `propose` (before the batch) and `observe` (after
the verify). The honest cost of a round is the whole scheduler cycle — drafting, the target's
batch, the verify, emitting the tokens — so a `Pacer` timestamps the start of each
`propose` and closes the previous cycle there:

    propose ─ draft ─┐ target batch, verify, emit ┌ propose (next) ...
    │<── t_draft ──>│<────────── t_verify ───────>│
    │<───────────────── one cycle ───────────────>│

A plain step (nothing proposed: k was 0, or the drafter gave up at once) is timed the same
way and is the yardstick: `DraftLengthController.record_plain`. One-off costs that are not
part of a round's price — a draft model prefilling the prompt into its own cache — are
passed as `one_off` and left out of the controller's model (the reply's statistics keep
them: the user waited for them).

Worked example: a round drafts 4 in 6 ms, the target's batch and verify take 22 ms, 3 are
accepted: `record_round(drafted=4, accepted=3, t_draft=0.006, t_verify=0.022)`, and the
reply's timing gains 4 tokens in 28 ms. Against a 20 ms plain step that is
4 / 28 × 20 = 2.86× measured.

The reply's counts (drafted, accepted, the acceptance rate) are not kept here: the scheduler
adds them up as it verifies each round (`Sequence.spec`), while a cycle closes only at the
next propose — counted here they would lag one round behind what was streamed. Both use
`runtime.speculative.stats`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.settings.load import DraftSettings
from runtime.speculative.adaptive import DraftLengthController
from runtime.speculative.stats import ReplyTiming


@dataclass
class CostMemory:
    """What one loaded model's replies learn and hand to the next reply: the draft-length
    controller of the last reply that ended (its costs, its acceptance as the next prior,
    its on/off state) and the plain step time. A new reply then starts from what this pair
    of models on this machine is known to do, not from guesses — and a fixed k needs no
    plain step to measure its speedup."""

    t_plain: float | None = None
    controller: DraftLengthController | None = None


@dataclass
class _Cycle:
    start: float
    drafted: int
    t_draft: float  # drafting cost of the round (one-off costs excluded)
    one_off: float  # cost to leave out of the controller's model
    accepted: int | None = None  # set by observe(); None: the round was never verified


class Pacer:
    """Chooses k for one sequence's rounds and measures them (see the module doc).

    Attributes:
        controller: the adaptive (or fixed) draft-length policy.
        timing: the reply's tokens and wall time so far (its measured speedup).
    """

    def __init__(self, draft: DraftSettings, *, clock: Callable[[], float] = time.perf_counter,
                 memory: CostMemory | None = None) -> None:
        k_max = draft.k if draft.k is not None else draft.k_max
        self.controller = DraftLengthController(k_max=max(1, k_max), fixed_k=draft.k,
                                                p_min=draft.p_min)
        self.timing = ReplyTiming()
        self.clock = clock
        self._fixed = draft.k is not None
        self.memory = memory if memory is not None else CostMemory()
        self._fresh = True  # the memory is read at the first round, not at creation: the
        # n samples of one request are created together, before any of them ran
        self._cycle: _Cycle | None = None
        self._t_start = 0.0

    # ---- the round's edges ---------------------------------------------------------------

    def start(self, k_allowed: int) -> int:
        """The start of a propose: close the previous cycle, return the draft length for
        this one (0 = a plain step), at most `k_allowed`."""
        now = self.clock()
        if self._fresh:
            self._fresh = False
            if self.memory.controller is not None:
                self.controller = copy.deepcopy(self.memory.controller)
        self._close_cycle(now)
        self._t_start = now
        if self.controller.t_plain is None and self.memory.t_plain is not None:
            self.controller.record_plain(self.memory.t_plain)  # an earlier reply measured it
        return max(0, min(self._choose(), k_allowed))

    def _choose(self) -> int:
        ctl = self.controller
        if self._fixed and ctl.t_plain is None:
            return 0  # one plain step per load, so a fixed k still gets a measured speedup
        return ctl.next_k()

    def proposed(self, drafted: int, one_off: float = 0.0) -> None:
        """The end of a propose: `drafted` tokens proposed; `one_off` seconds of it (say, a
        prompt prefilled into the draft's cache) are not the price of a round."""
        now = self.clock()
        t_draft = max(0.0, now - self._t_start - one_off)
        self._cycle = _Cycle(self._t_start, drafted, t_draft, one_off)

    def observe(self, drafted: int, accepted: int) -> None:
        """The scheduler verified the round: `accepted` of `drafted` kept."""
        cycle = self._cycle
        if cycle is not None and cycle.drafted == drafted:
            cycle.accepted = accepted

    def reset(self) -> None:
        """The sequence left the running set (finished or preempted): the open cycle would
        span the gap, so it is dropped; what the controller learned goes to the memory."""
        self._cycle = None
        if not self._fresh:
            self.memory.controller = copy.deepcopy(self.controller)

    # ---- what the drafter reports -----------------------------------------------------------

    def keep_drafting(self, top_prob: float) -> bool:
        return self.controller.keep_drafting(top_prob)

    @property
    def cost_ratio(self) -> float:
        return self.controller.cost_ratio or 0.0

    @property
    def measured_speedup(self) -> float:
        return self.timing.measured(self.controller.t_plain)

    @property
    def off_reason(self) -> str | None:
        return self.controller.off_reason

    def _close_cycle(self, now: float) -> None:
        cycle, self._cycle = self._cycle, None
        if cycle is None:
            return
        total = max(0.0, now - cycle.start)
        target = max(0.0, total - cycle.t_draft - cycle.one_off)
        ctl = self.controller
        if cycle.drafted == 0 or cycle.accepted is None:
            # A plain step. Drafting time spent before giving up is not the target's: the
            # yardstick stays the target alone, the reply's clock counts everything.
            ctl.record_plain(target)
            self.memory.t_plain = ctl.t_plain
            self.timing.record_plain(total)
            return
        ctl.record_round(drafted=cycle.drafted, accepted=cycle.accepted, t_draft=cycle.t_draft,
                         t_verify=target)
        self.timing.record_round(accepted=cycle.accepted, seconds=total)


class PacedDrafter:
    """The Drafter protocol's statistics, published from a `Pacer` as the plain attributes
    the scheduler reads. Both drafters (prompt lookup, draft model) share it."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.cost_ratio = 0.0
        self.measured_speedup = 0.0
        self.off_reason: str | None = None

    def _publish(self) -> None:
        self.cost_ratio = self.pacer.cost_ratio
        self.measured_speedup = self.pacer.measured_speedup
        self.off_reason = self.pacer.off_reason
