"""Speculative statistics, defined once: what a reply's rounds add up to, and the formulas.

Every number about drafting that Outrider shows or streams comes from here — the scheduler's
`StepStats` and `SpecSummary` (so the `/v1` stream's `outrider.step` / `outrider.speculative`,
the reply footer and the Speculative panel), the engine's rolling metrics, and the adaptive
controller's model. Two rates, with different names, because they answer different questions:

- **acceptance rate** = accepted / drafted: the share of drafted tokens the target kept. The
  only figure ever shown as "acceptance". It is what llama.cpp's tools report
  (llama-speculative's "accept", llama-server's draft counts), so benchmarks compare like
  with like.
- **α (per-position)** = accepted / judged, judged = accepted + rejections: the probability
  that the target keeps a draft token given it kept the ones before it — the α of the
  geometric model below. Drafts after a round's first rejection were never judged, so the
  acceptance rate counts them as lost and, plugged into the formula, predicts too few
  tokens. Used inside formulas and the adaptive controller; never shown as "acceptance".

From the same counts: **mean accepted length** = tokens per speculative round (its accepted
drafts plus the one token the target samples itself), **expected tokens** E(α, k) =
(1 − α^(k+1)) / (1 − α) per round drafting k, **predicted speedup** = E(α, k) / (k·c + 1) with
c = t_draft / t_target, and **measured speedup** = tokens per second over the reply
(`ReplyTiming`, drafting and plain steps included) × the plain step time.

Worked example: a reply of three rounds at k = 4 —

    round 1: 4 drafted, 4 kept (+1 the target's own)           5 tokens
    round 2: 4 drafted, 1 kept, the 2nd rejected (+1)          2 tokens; drafts 3, 4 unjudged
    round 3: 4 drafted, 4 kept (+1)                            5 tokens

    >>> reply = ReplySpecStats()
    >>> for accepted in (4, 1, 4):
    ...     reply.record_round(drafted=4, accepted=accepted)
    >>> reply.drafted, reply.accepted, f"{reply.acceptance_rate:.0%}"   # footer, panel, /v1
    (12, 9, '75%')
    >>> reply.judged, reply.alpha, reply.mean_accepted_length          # 9 kept + 1 rejection
    (10, 0.9, 4.0)
    >>> round(expected_tokens(reply.alpha, 4), 2)                      # vs 4.00 measured
    4.1
    >>> round(expected_tokens(reply.acceptance_rate, 4), 2)            # why not 9/12 here
    3.05
    >>> round(predicted_speedup(reply.alpha, 4, 0.1), 3)               # 4.10 tokens, 1.4 steps
    2.925
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.events import SpecSummary, StepStats


def acceptance_rate(accepted: int, drafted: int) -> float:
    """The share of drafted tokens the target kept (0.0 before anything was drafted).

    >>> acceptance_rate(11, 12)
    0.9166666666666666
    """
    return accepted / drafted if drafted else 0.0


def judged_drafts(drafted: int, accepted: int) -> int:
    """Draft positions the target judged in one round: the accepted ones and, if the round
    ended in a rejection, that one (the drafts after it were never looked at).

    >>> judged_drafts(4, 1), judged_drafts(4, 4), judged_drafts(3, 3)
    (2, 4, 3)
    """
    return accepted + (1 if accepted < drafted else 0)


def position_alpha(accepted: float, judged: float) -> float:
    """α, the per-position acceptance probability: accepted / judged drafts (0.0 before any
    was judged). Floats, so the adaptive controller can pass its decayed sums.

    >>> position_alpha(9, 10)
    0.9
    """
    return accepted / judged if judged else 0.0


def expected_tokens(alpha: float, k: int) -> float:
    """E(α, k): mean tokens emitted by a round that drafts k (accepted drafts + 1), with α
    the per-position probability (`position_alpha`); k + 1 when α = 1.

    >>> round(expected_tokens(0.8, 4), 3)
    3.362
    """
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Expected speedup over plain decoding of drafting k at per-position α and draft cost
    ratio c: E(α, k) tokens for k·c + 1 target-step equivalents.

    >>> round(predicted_speedup(0.8, 4, 0.1), 3)     # 3.362 tokens for 1.4 target steps
    2.401
    """
    return expected_tokens(alpha, k) / (k * c + 1.0)


def mean_accepted_length(accepted: int, rounds: int) -> float:
    """Tokens per speculative round: each round's accepted drafts plus the token the target
    sampled itself (0.0 before any round).

    >>> mean_accepted_length(9, 3)
    4.0
    """
    return (accepted + rounds) / rounds if rounds else 0.0


def from_draft_flags(accepted: int, emitted: int) -> list[bool]:
    """Per-token `from_draft` for one round: the accepted drafts, then the target's own.

    >>> from_draft_flags(2, 3)
    [True, True, False]
    """
    return [i < accepted for i in range(emitted)]


@dataclass
class ReplySpecStats:
    """One reply's (one sequence's) speculative counts, added up as the scheduler verifies
    each round; its `StepStats` carry the running totals, so a client that sees only the
    last round of a burst (the server sends one chunk per burst) still has the whole reply,
    and its `SpecSummary` is what the reply keeps."""

    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    judged: int = 0  # accepted drafts + rounds that ended in a rejection

    def record_round(self, *, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.rounds += 1
        self.judged += judged_drafts(drafted, accepted)

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def alpha(self) -> float:
        """The per-position α of the predicted speedup (not the acceptance rate)."""
        return position_alpha(self.accepted, self.judged)

    @property
    def mean_accepted_length(self) -> float:
        return mean_accepted_length(self.accepted, self.rounds)

    def step_stats(self, request_id: str, index: int, *, drafted: int, accepted: int,
                   cost_ratio: float, measured_speedup: float,
                   drafting_off_reason: str | None = None) -> StepStats:
        """The `StepStats` of a round that drafted `drafted` and kept `accepted` (0, 0: no
        round, drafting switched off or on); `cost_ratio` is c (0.0 while unknown)."""
        return StepStats(
            request_id=request_id, index=index, drafted=drafted, accepted=accepted,
            reply_drafted=self.drafted, reply_accepted=self.accepted, k=drafted,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            predicted_speedup=(predicted_speedup(self.alpha, drafted, cost_ratio) if drafted
                               else 1.0),
            measured_speedup=measured_speedup, drafting_off_reason=drafting_off_reason)

    def summary(self, measured_speedup: float) -> SpecSummary:
        """What the reply keeps (`Finished.speculative`)."""
        return SpecSummary(drafted=self.drafted, accepted=self.accepted,
                           acceptance_rate=self.acceptance_rate,
                           mean_accepted_length=self.mean_accepted_length,
                           measured_speedup=measured_speedup)


@dataclass
class ReplyTiming:
    """Tokens and wall time over one reply, speculative rounds and plain steps alike (a
    `Pacer` times whole cycles), for the measured speedup: switched-off stretches show as
    about 1×."""

    emitted: int = 0
    steps: int = 0  # target steps: speculative rounds and plain steps
    seconds: float = 0.0

    def record_round(self, *, accepted: int, seconds: float) -> None:
        """A verified round: its accepted drafts and the target's own token."""
        self.steps += 1
        self.emitted += accepted + 1
        self.seconds += seconds

    def record_plain(self, seconds: float) -> None:
        self.steps += 1
        self.emitted += 1
        self.seconds += seconds

    def measured(self, t_plain: float | None) -> float:
        """Tokens per second over the reply against plain decoding (0.0: not measured).

        >>> timing = ReplyTiming()
        >>> timing.record_round(accepted=3, seconds=0.028)
        >>> round(timing.measured(t_plain=0.020), 2)          # 4 tokens in 28 ms vs 20 ms each
        2.86
        """
        if not t_plain or self.seconds <= 0.0:
            return 0.0
        return self.emitted / self.seconds * t_plain
