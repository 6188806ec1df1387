"""A reply's footer without Qt: the server's figures win over what the app counted, the
app's clock fills in a rate the server did not send, thinking and answer tokens add up to
the total, the speculative figures pass through as the engine sent them, and the text uses
runtime.units' formats."""

from __future__ import annotations

import doctest

from app.chat import footer
from app.chat.footer import Streamed, footer_stats, footer_text
from app.engine.wire import ReplyFinished
from runtime.events import SpecSummary, Timings, Usage
from runtime.units import fmt_latency, fmt_rate


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(footer).failed == 0


def test_the_servers_figures_win_over_the_apps() -> None:
    seen = Streamed(tokens=30, sent_at=100.0, first_token_at=100.5)
    ended = ReplyFinished("stop", Usage(12, 32, cached_tokens=8),
                          Timings(ttft_s=0.42, prefill_tokens_per_s=800.0,
                                  decode_tokens_per_s=55.5, total_s=1.0))
    stats = footer_stats(seen, ended, now=101.0)
    assert stats == {"tokens": 32, "ttft_s": 0.42, "finish": "stop", "prompt_tokens": 12,
                     "cached_tokens": 8, "tokens_per_s": 55.5, "prefill_tokens_per_s": 800.0}


def test_without_the_servers_timings_the_rate_is_the_apps_own() -> None:
    # 11 tokens: the first at 10.5, the other 10 over the next 2 s.
    seen = Streamed(tokens=11, sent_at=10.0, first_token_at=10.5)
    stats = footer_stats(seen, None, now=12.5)
    assert stats == {"tokens": 11, "ttft_s": 0.5, "tokens_per_s": 5.0}
    assert "tokens_per_s" not in footer_stats(Streamed(tokens=1, sent_at=10.0,
                                                       first_token_at=10.5), None, now=12.5)
    assert footer_stats(Streamed(tokens=0), None, now=12.5) == {"tokens": 0}


def test_thinking_and_answer_tokens_add_up_to_the_servers_total() -> None:
    seen = Streamed(tokens=50, thinking_tokens=60, thought=True, thinking_s=3.5)
    ended = ReplyFinished("length", Usage(5, 40))
    stats = footer_stats(seen, ended, now=0.0)
    assert (stats["thinking_tokens"], stats["answer_tokens"]) == (40, 0)  # never above the total
    assert stats["thinking_s"] == 3.5 and stats["finish"] == "length"
    # Thinking text whose tokens the chunks never named still splits the footer.
    assert footer_stats(Streamed(tokens=9, thought=True), None, now=0.0)["answer_tokens"] == 9


def test_a_resumed_reply_keeps_its_restore_time() -> None:
    ended = ReplyFinished("stop", Usage(4000, 9, cached_tokens=3912, resumed_tokens=3912),
                          Timings(0.4, 300.0, 40.0, 0.7, restore_s=0.2134))
    stats = footer_stats(Streamed(tokens=9), ended, now=0.0)
    assert (stats["resumed_tokens"], stats["restore_s"]) == (3912, 0.2134)
    assert footer_text(stats).endswith(f"resumed 3,912 cached tokens in {fmt_latency(0.2134)}")


def test_speculative_figures_pass_through_as_the_engine_sent_them() -> None:
    spec = SpecSummary(drafted=12, accepted=11, acceptance_rate=11 / 12,
                       mean_accepted_length=4.67, measured_speedup=2.1)
    stats = footer_stats(Streamed(tokens=16), ReplyFinished("stop", speculative=spec), now=0.0)
    assert (stats["drafted"], stats["accepted"], stats["acceptance_rate"],
            stats["mean_accepted_length"], stats["measured_speedup"]) == (12, 11, 11 / 12, 4.67, 2.1)
    assert "acceptance 92% (11/12 drafted)" in footer_text(stats)


def test_the_text_uses_the_shared_formats() -> None:
    text = footer_text({"tokens": 300, "tokens_per_s": 1234.5, "ttft_s": 1.5})
    assert text == f"300 tokens · {fmt_rate(1234.5)} · TTFT {fmt_latency(1.5)}"
    assert footer_text({}) == ""
