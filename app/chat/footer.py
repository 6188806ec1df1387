"""A reply's footer: the figures kept with the reply (`footer_stats`, saved as `Message.stats`)
and the line the transcript and the export show of them (`footer_text`). Plain Python.

The server's figures win: its completion tokens, time to first token and rates (measured in
the engine); what the app saw as the chunks arrived (`Streamed`) fills in where the server sent
none. Speculative figures are the engine's (`runtime.speculative.stats`), never recomputed
here, so the footer and the Speculative panel say the same. Rates and times are written by
runtime.units, as on every other screen.

    >>> stats = footer_stats(Streamed(tokens=42, sent_at=10.0, first_token_at=10.25),
    ...                      None, now=11.25)
    >>> stats
    {'tokens': 42, 'ttft_s': 0.25, 'tokens_per_s': 41.0}
    >>> footer_text(stats)
    '42 tokens · 41.0 tok/s · TTFT 250 ms'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.wire import ReplyFinished
from runtime.events import SpecSummary
from runtime.units import fmt_latency, fmt_rate


@dataclass(frozen=True)
class Streamed:
    """What the app saw of a reply as it streamed (`app.chat.generation.Generation`).

    `tokens`: the chunks' token count; `thinking_tokens` of them were thinking, and `thought`
    says the reply has thinking text at all. `sent_at` and `first_token_at` are
    `time.perf_counter()` readings (0.0 / None: not sent / nothing arrived); `thinking_s` is
    how long the thinking text kept coming (None: no thinking)."""

    tokens: int
    thinking_tokens: int = 0
    thought: bool = False
    sent_at: float = 0.0
    first_token_at: float | None = None
    thinking_s: float | None = None


def footer_stats(seen: Streamed, result: ReplyFinished | None, *, now: float) -> dict[str, Any]:
    """The figures a reply's footer keeps, from what the app saw and the server's end of the
    reply (`result`; None when it never came: stopped before, failed). `now` is the
    `time.perf_counter()` reading at the end, for a rate the server did not send.

    A reply that thought splits its tokens: the server's count is the total; the thinking is
    what the chunks said, and the answer the rest (tokens the stream never showed, such as
    the end, go with it):

    >>> from runtime.events import Timings, Usage
    >>> ended = ReplyFinished("stop", Usage(20, 400), Timings(0.3, 900.0, 41.0, 10.0))
    >>> stats = footer_stats(Streamed(390, thinking_tokens=312, thought=True), ended, now=0.0)
    >>> stats["tokens"], stats["thinking_tokens"], stats["answer_tokens"], stats["tokens_per_s"]
    (400, 312, 88, 41.0)
    """
    stats: dict[str, Any] = {"tokens": seen.tokens}
    if seen.thinking_s is not None:
        stats["thinking_s"] = seen.thinking_s
    if seen.first_token_at is not None and seen.sent_at:
        stats["ttft_s"] = seen.first_token_at - seen.sent_at
    if result is not None:
        stats["finish"] = result.reason
        if result.usage is not None:
            stats["tokens"] = result.usage.completion_tokens
            stats["prompt_tokens"] = result.usage.prompt_tokens
            stats["cached_tokens"] = result.usage.cached_tokens
            if result.usage.resumed_tokens:
                stats["resumed_tokens"] = result.usage.resumed_tokens
                stats["restore_s"] = result.timings.restore_s if result.timings else 0.0
        if result.timings is not None:
            stats["ttft_s"] = result.timings.ttft_s
            stats["tokens_per_s"] = result.timings.decode_tokens_per_s
            stats["prefill_tokens_per_s"] = result.timings.prefill_tokens_per_s
        if result.speculative is not None:
            stats.update(speculative_footer(result.speculative))
    if "tokens_per_s" not in stats and seen.first_token_at is not None and seen.tokens > 1:
        elapsed = now - seen.first_token_at
        if elapsed > 0:
            stats["tokens_per_s"] = (seen.tokens - 1) / elapsed
    if seen.thinking_tokens or seen.thought:
        stats["thinking_tokens"] = min(seen.thinking_tokens, stats["tokens"])
        stats["answer_tokens"] = stats["tokens"] - stats["thinking_tokens"]
    return stats


def speculative_footer(spec: SpecSummary) -> dict[str, Any]:
    """The footer's speculative entries: the engine's figures as it sent them (computed by
    `runtime.speculative.stats`), never recomputed here; the Speculative panel shows these
    same numbers once the reply ended.

    >>> speculative_footer(SpecSummary(12, 11, 11 / 12, 4.67, 2.1))["acceptance_rate"]
    0.9166666666666666
    """
    return {"drafted": spec.drafted, "accepted": spec.accepted,
            "acceptance_rate": spec.acceptance_rate,
            "mean_accepted_length": spec.mean_accepted_length,
            "measured_speedup": spec.measured_speedup}


def footer_text(stats: dict[str, Any]) -> str:
    """The reply footer: tokens (thinking and answer apart when the model thought) · tok/s ·
    TTFT · acceptance (accepted/drafted) · what a saved KV cache spared.

    >>> footer_text({"tokens": 42, "tokens_per_s": 35.06, "ttft_s": 0.213,
    ...              "acceptance_rate": 0.62, "drafted": 50, "accepted": 31})
    '42 tokens · 35.1 tok/s · TTFT 213 ms · acceptance 62% (31/50 drafted)'
    >>> footer_text({"tokens": 9, "resumed_tokens": 3912, "restore_s": 0.2134})
    '9 tokens · resumed 3,912 cached tokens in 213 ms'
    >>> footer_text({"tokens": 400, "thinking_tokens": 312, "answer_tokens": 88})
    '312 thinking + 88 answer tokens'
    """
    parts: list[str] = []
    if "thinking_tokens" in stats:
        parts.append(f"{stats['thinking_tokens']} thinking + "
                     f"{stats.get('answer_tokens', 0)} answer tokens")
    elif "tokens" in stats:
        parts.append(f"{stats['tokens']} tokens")
    if stats.get("tokens_per_s"):
        parts.append(fmt_rate(stats["tokens_per_s"]))
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {fmt_latency(stats['ttft_s'])}")
    if stats.get("drafted"):
        parts.append(f"acceptance {stats.get('acceptance_rate', 0.0):.0%} "
                     f"({stats.get('accepted', 0)}/{stats['drafted']} drafted)")
    if stats.get("resumed_tokens"):
        parts.append(f"resumed {stats['resumed_tokens']:,} cached tokens in "
                     f"{fmt_latency(stats.get('restore_s', 0.0))}")
    return " · ".join(parts)
