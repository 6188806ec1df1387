"""Per-reply speculative statistics: the counts, the formula, the events they become."""

from __future__ import annotations

import pytest

from runtime.events import SpecSummary, StepStats
from runtime.speculative.stats import ReplySpecStats, from_draft_flags, predicted_speedup


def test_predicted_speedup_formula() -> None:
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert predicted_speedup(1.0, 4, 0.0) == 5.0  # every draft accepted, free drafts
    assert predicted_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # pure overhead
    assert predicted_speedup(0.9, 0, 0.5) == 1.0


def test_rounds_accumulate_into_step_stats_and_summary() -> None:
    stats = ReplySpecStats(request_id="req-1", index=0)
    # plain decoding takes 10 ms a token; a draft token 1 ms
    first = stats.record_round(k=4, drafted=4, accepted=4, seconds=0.016, t_draft=0.001,
                               t_plain=0.010)
    assert first == StepStats(request_id="req-1", index=0, drafted=4, accepted=4, k=4,
                              acceptance_rate=1.0, mean_accepted_length=5.0,
                              predicted_speedup=pytest.approx(5 / 1.4),
                              measured_speedup=pytest.approx(5 / 0.016 * 0.010))
    second = stats.record_round(k=4, drafted=4, accepted=1, seconds=0.016, t_draft=0.001,
                                t_plain=0.010, drafting_off_reason=None)
    assert (second.drafted, second.accepted) == (4, 1)
    assert second.acceptance_rate == pytest.approx(5 / 8)
    assert second.mean_accepted_length == pytest.approx(7 / 2)
    assert stats.alpha == pytest.approx(5 / 6)  # 5 accepted, 1 rejection judged
    assert second.predicted_speedup == pytest.approx(predicted_speedup(5 / 6, 4, 0.1))
    stats.record_plain(0.010)
    summary = stats.summary(t_plain=0.010)
    assert summary == SpecSummary(drafted=8, accepted=5, acceptance_rate=pytest.approx(5 / 8),
                                  mean_accepted_length=pytest.approx(8 / 3),
                                  measured_speedup=pytest.approx(8 / 0.042 * 0.010))


def test_unmeasured_costs_read_as_neutral() -> None:
    stats = ReplySpecStats(request_id="req-2")
    step = stats.record_round(k=2, drafted=2, accepted=1, seconds=0.01, t_draft=None,
                              t_plain=None, drafting_off_reason="speculation off: because")
    assert step.predicted_speedup == 1.0 and step.measured_speedup == 0.0
    assert step.drafting_off_reason == "speculation off: because"
    assert ReplySpecStats(request_id="req-3").summary(None).acceptance_rate == 0.0


def test_from_draft_flags() -> None:
    assert from_draft_flags(0, 1) == [False]
    assert from_draft_flags(3, 4) == [True, True, True, False]
