"""Speculative statistics, defined once: the rates, the formulas, the events they become."""

from __future__ import annotations

import doctest

import pytest

from runtime.events import SpecSummary, StepStats
from runtime.speculative import stats as stats_module
from runtime.speculative.stats import (
    ReplySpecStats,
    ReplyTiming,
    acceptance_rate,
    expected_tokens,
    from_draft_flags,
    judged_drafts,
    mean_accepted_length,
    position_alpha,
    predicted_speedup,
)


def test_the_worked_examples_hold() -> None:
    result = doctest.testmod(stats_module)
    assert result.attempted > 10 and result.failed == 0


def test_acceptance_is_accepted_over_drafted() -> None:
    assert acceptance_rate(11, 12) == pytest.approx(0.9167, abs=1e-4)  # "92% (11/12 drafted)"
    assert acceptance_rate(0, 4) == 0.0
    assert acceptance_rate(0, 0) == 0.0  # nothing drafted yet


def test_alpha_counts_only_the_judged_positions() -> None:
    # 4/4, 1/4 (the 2nd rejected, the 3rd and 4th never judged), 4/4
    judged = sum(judged_drafts(4, a) for a in (4, 1, 4))
    assert judged == 10
    assert position_alpha(9, judged) == pytest.approx(0.9)
    assert judged_drafts(3, 3) == 3  # drafting stopped early: no rejection to count
    assert judged_drafts(4, 0) == 1
    assert position_alpha(0, 0) == 0.0


def test_expected_tokens() -> None:
    assert expected_tokens(0.8, 0) == pytest.approx(1.0)
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)  # 3.362
    assert expected_tokens(0.9, 4) == pytest.approx(4.0951)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0


def test_predicted_speedup_formula() -> None:
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))  # 2.401
    assert predicted_speedup(0.9, 4, 0.1) == pytest.approx(4.0951 / 1.4)  # 2.925
    assert predicted_speedup(1.0, 4, 0.0) == 5.0  # every draft accepted, free drafts
    assert predicted_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # pure overhead
    assert predicted_speedup(0.9, 0, 0.5) == 1.0


def test_mean_accepted_length_is_tokens_per_round() -> None:
    assert mean_accepted_length(9, 3) == 4.0  # 12 tokens in 3 rounds
    assert mean_accepted_length(0, 2) == 1.0  # every draft rejected: the target's own token
    assert mean_accepted_length(0, 0) == 0.0


def test_rounds_accumulate_into_step_stats_and_summary() -> None:
    reply = ReplySpecStats()
    reply.record_round(drafted=4, accepted=4)
    first = reply.step_stats("req-1", 0, drafted=4, accepted=4, cost_ratio=0.1,
                             measured_speedup=2.0)
    assert first == StepStats(request_id="req-1", index=0, drafted=4, accepted=4,
                              reply_drafted=4, reply_accepted=4, k=4, acceptance_rate=1.0,
                              mean_accepted_length=5.0, predicted_speedup=pytest.approx(5 / 1.4),
                              measured_speedup=2.0)
    reply.record_round(drafted=4, accepted=1)
    second = reply.step_stats("req-1", 0, drafted=4, accepted=1, cost_ratio=0.1,
                              measured_speedup=1.5, drafting_off_reason=None)
    assert (second.drafted, second.accepted) == (4, 1)  # the round's own
    assert (second.reply_drafted, second.reply_accepted) == (8, 5)  # the reply's so far
    assert second.acceptance_rate == pytest.approx(5 / 8)
    assert second.mean_accepted_length == pytest.approx(7 / 2)
    assert reply.alpha == pytest.approx(5 / 6)  # 5 accepted, 1 rejection judged
    assert second.predicted_speedup == pytest.approx(predicted_speedup(5 / 6, 4, 0.1))
    summary = reply.summary(measured_speedup=1.5)
    assert summary == SpecSummary(drafted=8, accepted=5, acceptance_rate=pytest.approx(5 / 8),
                                  mean_accepted_length=pytest.approx(7 / 2),
                                  measured_speedup=1.5)
    # the last round's running figures are the summary's: a client that saw only it agrees
    assert (second.reply_drafted, second.reply_accepted, second.acceptance_rate,
            second.mean_accepted_length) == (summary.drafted, summary.accepted,
                                             summary.acceptance_rate,
                                             summary.mean_accepted_length)


def test_a_switch_announcement_keeps_the_reply_counts() -> None:
    reply = ReplySpecStats()
    reply.record_round(drafted=2, accepted=1)
    step = reply.step_stats("req-2", 0, drafted=0, accepted=0, cost_ratio=0.0,
                            measured_speedup=0.0, drafting_off_reason="speculation off: because")
    assert step.k == 0 and step.predicted_speedup == 1.0
    assert (step.reply_drafted, step.reply_accepted) == (2, 1)
    assert step.drafting_off_reason == "speculation off: because"
    assert ReplySpecStats().summary(0.0).acceptance_rate == 0.0


def test_measured_speedup_counts_rounds_and_plain_steps() -> None:
    timing = ReplyTiming()
    assert timing.measured(0.010) == 0.0  # nothing timed yet
    timing.record_round(accepted=4, seconds=0.016)
    timing.record_round(accepted=1, seconds=0.016)
    timing.record_plain(0.010)
    assert (timing.emitted, timing.steps) == (8, 3)
    assert timing.measured(t_plain=0.010) == pytest.approx(8 / 0.042 * 0.010)
    assert timing.measured(t_plain=None) == 0.0


def test_from_draft_flags() -> None:
    assert from_draft_flags(0, 1) == [False]
    assert from_draft_flags(3, 4) == [True, True, True, False]
