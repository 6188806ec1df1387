"""Per-reply speculative statistics: what each round streams and what the reply keeps.

Counts add up over one reply (one sequence): drafted and accepted tokens, target steps
(speculative rounds and plain steps alike) and the time they took. From them:

- acceptance rate = accepted / drafted (the share of drafted tokens kept);
- mean accepted length = tokens emitted per target step (1 for plain decoding);
- predicted speedup = (1 − α^(k+1)) / ((1 − α)(k·c + 1)), k the current draft length,
  c = t_draft / t_target, α the per-token acceptance probability: accepted / (accepted +
  rejections), since drafts after a round's first rejection were never judged (the
  acceptance rate above counts them as lost, which is what a user sees but biases α low);
- measured speedup = (tokens / seconds over the reply) × the plain step time.

    >>> round(predicted_speedup(0.8, 4, 0.1), 3)     # 3.362 tokens for 1.4 target steps
    2.401
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.events import SpecSummary, StepStats
from runtime.speculative.adaptive import expected_tokens


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Expected speedup over plain decoding of drafting k at acceptance α and draft cost
    ratio c: E(α, k) tokens for k·c + 1 target-step equivalents."""
    return expected_tokens(alpha, k) / (k * c + 1.0)


def from_draft_flags(accepted: int, emitted: int) -> list[bool]:
    """Per-token `from_draft` for one round: the accepted drafts, then the target's own.

    >>> from_draft_flags(2, 3)
    [True, True, False]
    """
    return [i < accepted for i in range(emitted)]


@dataclass
class ReplySpecStats:
    """Accumulates one reply's rounds and makes its `StepStats` and `SpecSummary`."""

    request_id: str
    index: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # target steps: speculative rounds and plain steps
    emitted: int = 0
    seconds: float = 0.0
    k: int = 0
    rejections: int = 0  # rounds that ended in a rejection

    def record_round(
        self,
        *,
        k: int,
        drafted: int,
        accepted: int,
        seconds: float,
        t_draft: float | None,
        t_plain: float | None,
        drafting_off_reason: str | None = None,
    ) -> StepStats:
        """Add one speculative round (accepted + 1 tokens emitted in `seconds`, drafting
        included) and return its stats. `t_draft` is the per-token draft time and
        `t_plain` the plain step time, as measured so far (None: not yet measured)."""
        self.k = k
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += accepted < drafted
        self.steps += 1
        self.emitted += accepted + 1
        self.seconds += seconds
        return self.step_stats(drafted=drafted, accepted=accepted, t_draft=t_draft,
                               t_plain=t_plain, drafting_off_reason=drafting_off_reason)

    def record_plain(self, seconds: float) -> None:
        """Add a plain step (one token, nothing drafted): it counts toward the measured
        speedup, so switched-off stretches show as about 1×."""
        self.k = 0
        self.steps += 1
        self.emitted += 1
        self.seconds += seconds

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance probability (the α of the speedup formula)."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    def predicted(self, t_draft: float | None, t_plain: float | None) -> float:
        """The formula at the running α, the current k and the measured cost ratio
        (1.0 until both costs are measured or while k is 0)."""
        if self.k == 0 or t_draft is None or not t_plain:
            return 1.0
        return predicted_speedup(self.alpha, self.k, t_draft / t_plain)

    def measured(self, t_plain: float | None) -> float:
        """Tokens per second over the reply against plain decoding (0.0: not measured)."""
        if not t_plain or self.seconds <= 0.0:
            return 0.0
        return self.emitted / self.seconds * t_plain

    def step_stats(self, *, drafted: int, accepted: int, t_draft: float | None,
                   t_plain: float | None, drafting_off_reason: str | None = None) -> StepStats:
        return StepStats(
            request_id=self.request_id,
            index=self.index,
            drafted=drafted,
            accepted=accepted,
            k=self.k,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            predicted_speedup=self.predicted(t_draft, t_plain),
            measured_speedup=self.measured(t_plain),
            drafting_off_reason=drafting_off_reason,
        )

    def summary(self, t_plain: float | None) -> SpecSummary:
        """What the reply keeps (`Finished.speculative`)."""
        return SpecSummary(
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            measured_speedup=self.measured(t_plain),
        )
