"""Adaptive draft length: pick k each round to maximise expected tokens per second.

With per-token acceptance rate α a round drafting k tokens emits on average

    E(α, k) = (1 − α^(k+1)) / (1 − α)            (k + 1 when α = 1)

tokens and costs k·t_draft + t_verify(k). On a GPU verifying k + 1 tokens costs about one
step; on a CPU it grows with k, so t_verify(k) ≈ t0 + k·t1 is fitted online from measured
rounds (the slope from neighbouring rounds of different lengths, see `_fit`) — rounds only,
not plain steps: on a CPU a batch of 2 tokens already runs another, slower matmul kernel
than a batch of 1, so a line through the plain step would overstate long drafts (SmolLM2-135M
F32 on one core: a plain step 38 ms, verifying 1, 4, 8 and 16 drafts 45, 54, 65 and 86 ms).
The controller picks from the k in 0..k_max by E / cost. Worked example: α = 0.8,
t_draft = 2 ms, t_verify(k) = 20 + 2k ms:

    k = 0: 1.00 token / 20 ms  = 50 tok/s
    k = 3: 2.95 tokens / 32 ms = 92 tok/s
    k = 4: 3.36 tokens / 36 ms = 93 tok/s          the best
    k = 5: 3.69 tokens / 40 ms = 92 tok/s          within 2% and longer → k = 5
    k = 6: 3.95 tokens / 44 ms = 90 tok/s

Learning: a fresh controller drafts k_max, times a plain step, drafts k_max / 2, times
another plain step and drafts k_max again (`learning_plan`): two draft lengths far apart give
the verify line a slope at once, three rounds give α some evidence before the first choice,
and the plain steps are the yardstick for everything else. Starting long costs one round of
wasted drafts when the draft is poor; starting short took twenty rounds to climb to a good
draft's best k.

The yardstick is the mean of the last `PLAIN_SAMPLES` plain steps, leaving out any more
than `PLAIN_SPIKE` (1.5×) the fastest of them: a plain step runs far slower than its cost
only by accident, and the first one after a batch can (on an H200 it took 8.8 ms where the
next took 1.25: CUDA graphs are captured for each new batch shape). Averaged in, that one
sample made plain decoding look 7× slower than it was, and drafting at 0.55× of plain stayed
on for the whole reply. (The fastest alone would be biased low by ordinary noise: about 4%
with ±5% noise, enough to switch a draft worth 8% off.)

Acceptance. α is the per-position probability of `runtime.speculative.stats`
(`position_alpha`, not the acceptance rate users see): a round that accepted a of d drafts is
a successes and (a < d) one failure (`judged_drafts`); tokens after the first rejection were
never judged, so counting them as failures (accepted / drafted) would underestimate α. The
estimate forgets per trial (`ALPHA_MEMORY` ≈ the last 100 judged drafts).

Choice. Near its best the rate is flat in k (α = 0.97 on the SmolLM2 pair: k = 5..8 within
4%), so noise in α decides among them, and a k chosen too short costs more than one too
long: positions beyond the current k are never measured, and the controller climbed back
slowly (at T = 0.8, adaptive ran 6% behind a fixed k = 8 that way). So the longest k
predicted within `LONG_BIAS` (2%) of the best is taken — by construction it costs at most 2%
of the prediction — and after a round that kept every draft the next one tries one more
(unless that predicts `CLIMB_RISK`, 5%, slower).

Auto-off: speculation switches off, with a reason, when no k > 0 is predicted within
`OFF_TOLERANCE` (5%) of plain decoding, or when a window of rounds *measured* (drafting
included) more than that below plain (every `plain_every` rounds one plain step is timed).
After `probe_after` plain steps a probe forgets α (back to the prior) and drafts
`PROBE_ROUNDS` rounds; if the model then still prefers plain, speculation stays off and
the wait doubles (up to `probe_after_max`). The wait is also long enough that what a probe
loses against plain decoding is at most `PROBE_SHARE` (5%) of the time spent off: where a
round costs 30 plain steps (a small model on a GPU), a probe every 64 steps would halve the
speed, while a close call (drafting about as fast as plain) may still probe every 64. A fixed k (`fixed_k`)
bypasses all of this.

Pure Python and deterministic: it sees only the numbers it is given.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Literal

from runtime.errors import SettingsError
from runtime.speculative.stats import expected_tokens, judged_drafts, position_alpha

State = Literal["learning", "on", "off", "probing"]
OFF_TOLERANCE = 0.05  # drafting must be this much slower than plain to switch off
LONG_BIAS = 0.02  # the longest k predicted within this of the best is taken
ALPHA_MEMORY = 0.99  # per judged draft: α remembers about the last 100
PROBE_ROUNDS = 4
SLOPE_MEMORY = 0.8  # per pair of neighbouring rounds of different lengths
CLIMB_RISK = 0.05  # a climb is tried unless the model predicts it this much slower
PLAIN_SAMPLES = 4  # the yardstick: the mean of the last few plain steps ...
PLAIN_SPIKE = 1.5  # ... without those this much slower than the fastest of them
PROBE_SHARE = 0.05  # what probes lose against plain: at most this share of the time off


def learning_plan(k_max: int) -> tuple[int, ...]:
    """The first steps of a fresh controller (0 = the plain step).

    >>> learning_plan(8)
    (8, 0, 4, 0, 8)
    """
    return (k_max, 0, max(1, k_max // 2), 0, k_max)


class DraftLengthController:
    """Chooses k for each round from measured acceptance and costs; see the module doc.

    Per round the engine calls `next_k()`, drafts (stopping early while
    `keep_drafting(top_prob)` says no), verifies, and reports `record_round(...)` — or, when
    k was 0, runs a plain step and reports `record_plain(seconds)`.

    Attributes:
        state: "learning", "on", "off" (plain steps only) or "probing".
        off_reason: why speculation is off now (None while on or probing).
    """

    def __init__(
        self,
        *,
        k_max: int = 8,
        fixed_k: int | None = None,
        p_min: float = 0.3,
        alpha_prior: float = 0.7,
        decay: float = 0.9,
        window: int = 16,
        plain_every: int = 32,
        probe_after: int = 64,
        probe_after_max: int = 1024,
    ) -> None:
        if not 1 <= k_max <= 32:
            raise SettingsError(f"k_max must be between 1 and 32, not {k_max}")
        if fixed_k is not None and not 0 <= fixed_k <= 32:
            raise SettingsError(f"a fixed draft length must be 0..32, not {fixed_k}")
        if not 0.0 < decay < 1.0 or window < 1 or plain_every < 2 or probe_after < 1:
            raise SettingsError("bad adaptive draft-length tuning")
        self.k_max = k_max
        self.fixed_k = fixed_k
        self.p_min = p_min
        self._decay = decay  # per round, for the cost estimates
        self._window_size = window
        self._plain_every = plain_every
        self._probe_base = probe_after
        self._probe_max = probe_after_max
        self._probe_after = probe_after
        self._prior = alpha_prior
        self._succ = self._trials = 0.0
        self._forget_alpha()
        self._t_draft: float | None = None  # seconds per drafted token
        self._t_plain: float | None = None  # seconds per plain step
        self._plains: deque[float] = deque(maxlen=PLAIN_SAMPLES)
        # t_verify(k) = t0 + k·t1: decayed sums (w, Σk, Σt) over rounds give the level,
        # Δk²-weighted sums over neighbouring rounds of different lengths the slope t1
        self._rounds = [0.0] * 3
        self._slope_sums = [0.0, 0.0]  # Σ Δk²·(Δt/Δk), Σ Δk²
        self._last_round: tuple[int, float] | None = None
        self._window: deque[tuple[int, float]] = deque(maxlen=window)
        self.state: State = "learning" if fixed_k is None else "on"
        self.off_reason: str | None = None
        self._plan = list(learning_plan(k_max))
        self._k = k_max  # the last k chosen: a climb starts from it
        self._plain_left = 0  # plain steps still to run while off
        self._probe_left = 0  # probe rounds still to run
        self._back_from_probe = False  # on again after a probe, no window judged yet
        self._climb = False  # the last round accepted all k of its drafts
        self._since_plain = 0
        self._last_wait = probe_after  # plain steps of the last time off

    # ---- what the engine asks --------------------------------------------------------

    def next_k(self) -> int:
        """Draft length for the coming round; 0 means a plain step (no drafting)."""
        if self.fixed_k is not None:
            return self.fixed_k
        if self.state == "learning":
            if self._plan:
                return self._plan.pop(0)
            self.state = "on"
        if self.state == "off":
            if self._plain_left > 0:
                self._plain_left -= 1
                return 0
            self.state = "probing"
            self._probe_left = PROBE_ROUNDS
            self._forget_alpha()
            self._window.clear()
        if self.state == "probing":
            if self._probe_left > 0:
                self._probe_left -= 1
                return self._choose(positive=True)
            if self._choose() == 0:
                self._probe_after = min(self._probe_after * 2, self._probe_max)
                self._switch_off(self._predicted_reason, failed_probe=True)
                return self.next_k()
            self._come_back_on()
        if self._t_plain is None or self._since_plain >= self._plain_every:
            return 0  # (re)time a plain step: the yardstick for everything else
        k = self._choose()
        if k == 0:
            self._switch_off(self._predicted_reason)
            return self.next_k()
        return k

    def keep_drafting(self, top_prob: float) -> bool:
        """Early stop: draft the next token only while the draft's own top probability is
        at least p_min (an unsure draft is rarely accepted)."""
        return top_prob >= self.p_min

    # ---- what the engine reports -----------------------------------------------------

    def record_round(self, *, drafted: int, accepted: int, t_draft: float,
                     t_verify: float) -> None:
        """A speculative round: `drafted` tokens proposed in `t_draft` seconds (all draft
        steps), `accepted` of them kept, the target batch took `t_verify` seconds."""
        if not 0 <= accepted <= drafted:
            raise SettingsError(f"accepted ({accepted}) must be within 0..drafted ({drafted})")
        if drafted == 0:  # the drafter gave up at once: the target ran a plain step
            self.record_plain(t_verify + t_draft)
            return
        judged = judged_drafts(drafted, accepted)
        self._climb = accepted == drafted == self._k
        forget = ALPHA_MEMORY ** judged
        self._succ = self._succ * forget + accepted
        self._trials = self._trials * forget + judged
        d = self._decay
        per_token = t_draft / drafted
        self._t_draft = per_token if self._t_draft is None else \
            self._t_draft * d + per_token * (1.0 - d)
        self._fit(drafted, t_verify)
        self._since_plain += 1
        if self.fixed_k is not None or self.state != "on":
            return
        self._window.append((accepted + 1, t_draft + t_verify))
        if len(self._window) == self._window_size and self._t_plain is not None:
            self._judge_window()

    def record_plain(self, seconds: float) -> None:
        """A plain decoding step (one token, no drafting) took `seconds`."""
        self._plains.append(seconds)
        usual = [s for s in self._plains if s <= PLAIN_SPIKE * min(self._plains)]
        self._t_plain = sum(usual) / len(usual)  # see the module doc: spikes are accidents
        self._since_plain = 0

    # ---- the model -------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        """Running per-position α (`stats.position_alpha`, decayed): the geometric model's
        probability, not the acceptance rate shown as "acceptance"."""
        return position_alpha(self._succ, self._trials)

    @property
    def t_draft(self) -> float | None:
        return self._t_draft

    @property
    def t_plain(self) -> float | None:
        return self._t_plain

    @property
    def cost_ratio(self) -> float | None:
        """c = t_draft / t_target, for the predicted-speedup formula."""
        if self._t_draft is None or not self._t_plain:
            return None
        return self._t_draft / self._t_plain

    def verify_cost(self, k: int) -> float:
        """Fitted seconds to verify k drafts (a batch of k + 1 tokens); for k = 0 the plain
        step's own time. Until rounds of two lengths are measured the line is flat (as on
        a GPU) through the rounds seen."""
        if k == 0 and self._t_plain is not None:
            return self._t_plain
        w, sx, sy = self._rounds
        if w == 0.0:
            return self._t_plain or 0.0
        slope = self.verify_slope
        return max(sy / w - slope * sx / w, 1e-9) + k * slope

    @property
    def verify_slope(self) -> float:
        """Seconds each extra draft adds to the verify (0 until two lengths were measured)."""
        num, den = self._slope_sums
        return max(num / den, 0.0) if den > 0.0 else 0.0

    def predicted_rate(self, k: int) -> float:
        """Expected tokens per second when drafting k."""
        cost = k * (self._t_draft or 0.0) + self.verify_cost(k)
        return expected_tokens(self.alpha, k) / cost if cost > 0 else 0.0

    def _choose(self, *, positive: bool = False) -> int:
        """The k to draft: the longest predicted within LONG_BIAS of the best rate (one
        more after a round that kept all it drafted, unless that predicts CLIMB_RISK
        slower); 0 when no k > 0 comes within OFF_TOLERANCE of plain (never, when
        `positive`)."""
        rates = [self.predicted_rate(k) for k in range(self.k_max + 1)]
        top = max(rates[1:])
        if not positive and top < rates[0] * (1.0 - OFF_TOLERANCE):
            return 0
        k = max(k for k in range(1, self.k_max + 1) if rates[k] >= top * (1.0 - LONG_BIAS))
        if self._climb and self._k >= k and self._k < self.k_max and \
                rates[self._k + 1] >= top * (1.0 - CLIMB_RISK):
            k = self._k + 1  # the last round kept all it drafted: try one more
        self._k, self._climb = k, False
        return k

    def _fit(self, k: int, t: float) -> None:
        """Add a round of k drafts whose verify took t seconds to the line.

        The slope comes only from neighbouring rounds of different lengths: every step gets
        slower as the reply grows (attention over a longer context: verifying 8 drafts went
        from 56 to 82 ms over one 256-token reply), and a fit over a window in which the
        short rounds happen to be the old ones blames that growth on k — once that made
        k = 2 look best in the middle of a run at k = 8. Neighbours share their context.
        """
        d = self._decay
        r = self._rounds
        for i, v in enumerate((1.0, k, t)):
            r[i] = r[i] * d + v
        if self._last_round is not None and self._last_round[0] != k:
            dk, dt = k - self._last_round[0], t - self._last_round[1]
            num, den = self._slope_sums
            self._slope_sums = [num * SLOPE_MEMORY + dk * dt, den * SLOPE_MEMORY + dk * dk]
        self._last_round = (k, t)

    def _forget_alpha(self) -> None:
        """Back to the weak prior (2 judged drafts at alpha_prior)."""
        self._succ, self._trials = 2.0 * self._prior, 2.0

    # ---- switching off and on --------------------------------------------------------

    def _judge_window(self) -> None:
        tokens = sum(t for t, _ in self._window)
        seconds = sum(s for _, s in self._window)
        measured = tokens / seconds if seconds > 0 else 0.0
        plain = 1.0 / self._t_plain if self._t_plain else 0.0
        if measured >= plain * (1.0 - OFF_TOLERANCE):
            self._probe_after = self._probe_base  # drafting pays: the next wait starts short
            self._back_from_probe = False
            return
        failed_probe = self._back_from_probe  # its promise did not hold: wait longer
        if failed_probe:
            self._probe_after = min(self._probe_after * 2, self._probe_max)
        window = len(self._window)
        lost = (seconds - tokens * (self._t_plain or 0.0)) / window
        self._switch_off(lambda wait: (
            f"speculation off: {measured:.1f} tok/s with drafting is below "
            f"{plain:.1f} tok/s plain over the last {window} rounds "
            f"(α {self.alpha:.2f} per draft position); trying again in {wait} steps"), lost, failed_probe)

    def _predicted_reason(self, wait: int) -> str:
        c = self.cost_ratio
        cost = f"a draft step costing {c:.2f}× a target step" if c is not None else \
            "the measured draft cost"
        return (f"speculation off: at α {self.alpha:.2f} per draft position and {cost}, no draft "
                f"length beats plain decoding; trying again in {wait} steps")

    def probe_wait(self, lost_per_round: float | None = None) -> int:
        """Plain steps before the next probe: `probe_after` (which doubles with each probe
        that failed), or more where what a probe loses against plain decoding
        (`lost_per_round` seconds, measured; else predicted) would otherwise exceed
        PROBE_SHARE of the time spent off. A close call thus probes soon (a probe there
        loses little, and α may have been unlucky), a clear loss rarely."""
        if not self._t_plain:
            return self._probe_after
        if lost_per_round is None:
            k = max(1, self._k)
            cost = k * (self._t_draft or 0.0) + self.verify_cost(k)
            lost_per_round = cost - expected_tokens(self.alpha, k) * self._t_plain
        lost = PROBE_ROUNDS * max(0.0, lost_per_round)
        affordable = lost * (1.0 - PROBE_SHARE) / (PROBE_SHARE * self._t_plain)
        return max(self._probe_after, math.ceil(affordable))

    def _switch_off(self, reason: Callable[[int], str], lost_per_round: float | None = None,
                    failed_probe: bool = False) -> None:
        """Off for `probe_wait()` plain steps — after a failed probe at least twice the last
        wait (up to probe_after_max); `reason(wait)` says why, and for how long."""
        wait = self.probe_wait(lost_per_round)
        if failed_probe:
            wait = max(wait, min(2 * self._last_wait, self._probe_max))
        self._last_wait = wait
        self.state = "off"
        self.off_reason = reason(wait)
        self._back_from_probe = False
        self._plan.clear()
        self._plain_left = wait
        self._window.clear()

    def _come_back_on(self) -> None:
        self.state = "on"
        self.off_reason = None
        self._back_from_probe = True
        self._window.clear()
