"""Token log-probabilities in OpenAI's two shapes: chat's list of entries, and the legacy
completions' parallel lists.

The numbers are the engine's (`TokenEvent.logprob`, `.top_logprobs`): log p under the final
distribution the token was drawn from (docs/api.md, "logprobs"). A probability of zero has no
JSON spelling (log 0 = −∞), so it is sent as −9999.0, as OpenAI does.

    >>> chat_entry(TokenLogprob(72, b"Hi", -0.25), (TokenLogprob(72, b"Hi", -0.25),))  # doctest: +NORMALIZE_WHITESPACE
    {'token': 'Hi', 'logprob': -0.25, 'bytes': [72, 105],
     'top_logprobs': [{'token': 'Hi', 'logprob': -0.25, 'bytes': [72, 105]}]}
    >>> legacy = CompletionLogprobs()
    >>> legacy.add([TokenEvent("r", 0, 72, "H", logprob=TokenLogprob(72, b"H", -0.5)),
    ...             TokenEvent("r", 0, 105, "i", logprob=TokenLogprob(105, b"i", -1.0))])  # doctest: +NORMALIZE_WHITESPACE
    {'tokens': ['H', 'i'], 'token_logprobs': [-0.5, -1.0], 'top_logprobs': [{}, {}],
     'text_offset': [0, 1]}

A token may hold part of a character (a byte-level vocabulary splits "é" in two): its `bytes`
are exact, its `token` text shows the missing part as U+FFFD, and `text_offset` counts whole
characters, so offsets index the reply's text.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterable, Sequence
from typing import Any

from runtime.events import TokenEvent, TokenLogprob

ZERO_PROBABILITY = -9999.0  # OpenAI's stand-in for log 0


def _number(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else ZERO_PROBABILITY


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def _top(entry: TokenLogprob) -> dict[str, Any]:
    return {"token": _text(entry.piece), "logprob": _number(entry.logprob),
            "bytes": list(entry.piece)}


def chat_entry(sampled: TokenLogprob, top: Sequence[TokenLogprob]) -> dict[str, Any]:
    """One element of `choices[i].logprobs.content`."""
    return {**_top(sampled), "top_logprobs": [_top(t) for t in top]}


def chat_logprobs(events: Iterable[TokenEvent]) -> dict[str, Any]:
    """`choices[i].logprobs` of a chat reply (or of one streamed chunk)."""
    return {"content": [chat_entry(e.logprob, e.top_logprobs) for e in events
                        if e.logprob is not None],
            "refusal": None}


class CompletionLogprobs:
    """The legacy `logprobs` object of one text choice, chunk by chunk: `text_offset`
    continues across chunks."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._offset = 0

    def add(self, events: Iterable[TokenEvent]) -> dict[str, Any]:
        tokens: list[str] = []
        values: list[float] = []
        tops: list[dict[str, float]] = []
        offsets: list[int] = []
        for event in events:
            if event.logprob is None:
                continue
            tokens.append(_text(event.logprob.piece))
            values.append(_number(event.logprob.logprob))
            top: dict[str, float] = {}
            for entry in event.top_logprobs:
                top.setdefault(_text(entry.piece), _number(entry.logprob))
            tops.append(top)
            offsets.append(self._offset)
            self._offset += len(self._decoder.decode(event.logprob.piece))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}
