"""Engine events → OpenAI response JSON, streamed (`ChunkWriter`) or whole (`ResponseCollector`).

Chat and text completions differ only in names: a chat choice carries `delta`/`message`, a
text choice `text`. Both add an `outrider` object (docs/api.md). A batch of events becomes at
most one content chunk per choice, so a speculative round that accepted four tokens reaches
the client as one chunk. Its `step` is the batch's last round: a `StepStats` carries the
reply's running counts (`reply_drafted`, `reply_accepted`, the acceptance rate), so the
rounds before it in the batch lose nothing but their own per-round figures:

    >>> writer = ChunkWriter(chat=False, model="m", n=1, include_usage=False)
    >>> [c["choices"][0]["text"] for c in writer.chunks([TokenEvent("r", 0, 72, "H"),
    ...                                                  TokenEvent("r", 0, 105, "i")])]
    ['Hi']

A chat reply whose model thinks or calls functions is read per choice by `ChoiceReader`
(`runtime.server.chat_reply`): its deltas carry `reasoning_content` and `tool_calls` beside
`content`, and its finish reason may be "tool_calls" or "malformed_tool_call". Logprobs, when
asked for, ride on each chunk for its own tokens (`runtime.server.logprobs_json`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.events import ErrorEvent, Event, Finished, StepStats, TokenEvent
from runtime.server.chat_reply import ChoiceReader, ReplyEnd, ReplyOptions, message_json
from runtime.server.error_responses import error_body, status_for_kind
from runtime.server.jsonable import to_jsonable
from runtime.server.logprobs_json import CompletionLogprobs, chat_logprobs


def usage_json(finished: dict[int, Finished]) -> dict[str, Any]:
    """OpenAI usage for all choices: the prompt counts once (choice 0's), completions add up."""
    if not finished:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                "prompt_tokens_details": {"cached_tokens": 0}}
    first = finished[min(finished)].usage
    completion = sum(f.usage.completion_tokens for f in finished.values())
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}


def step_json(step: StepStats) -> dict[str, Any]:
    out = to_jsonable(step)
    del out["request_id"], out["index"]
    return dict(out)


def finish_json(done: Finished) -> dict[str, Any]:
    """The `outrider` object of a choice's last chunk. Its usage also says how many prompt
    tokens middle truncation dropped (never silently) and how many of the cached ones were
    read back from a saved KV cache (`timings.restore_s` says how long that took)."""
    usage = usage_json({done.index: done})
    usage["truncated_tokens"] = getattr(done.usage, "truncated_tokens", 0)
    usage["resumed_tokens"] = getattr(done.usage, "resumed_tokens", 0)
    return {"timings": to_jsonable(done.timings), "usage": usage,
            "speculative": to_jsonable(done.speculative)}


def stream_error_json(event: ErrorEvent) -> dict[str, Any]:
    status, code = status_for_kind(event.kind)
    return error_body(event.message, code=code, status=status)


@dataclass
class _Pending:
    text: list[str] = field(default_factory=list)
    tokens: list[TokenEvent] = field(default_factory=list)
    step: StepStats | None = None  # the last of the batch (its reply_ counts cover the rest)

    def empty(self) -> bool:
        return not self.tokens and self.step is None


def _token_info(tokens: list[TokenEvent]) -> dict[str, Any]:
    return {"token_ids": [t.token_id for t in tokens], "from_draft": [t.from_draft for t in tokens]}


def _malformed(end: ReplyEnd | None) -> dict[str, Any]:
    """The `outrider` note of a botched call: why the parser refused it."""
    if end is None or end.parsed.malformed is None:
        return {}
    return {"malformed_tool_call": end.parsed.malformed}


class ChunkWriter:
    """Makes the `data:` payloads of one streamed completion. `reply`: how chat choices are
    read (None: their text is all content); `logprobs`: the request asked for them."""

    def __init__(self, *, chat: bool, model: str, n: int, include_usage: bool,
                 reply: ReplyOptions | None = None, logprobs: bool = False) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.n = n
        self.include_usage = include_usage
        self.reply = reply if chat else None
        self.logprobs = logprobs
        self.finished: dict[int, Finished] = {}
        self._started: set[int] = set()
        self._readers: dict[int, ChoiceReader] = {}
        self._legacy: dict[int, CompletionLogprobs] = {}

    def _reader(self, index: int) -> ChoiceReader | None:
        if self.reply is None:
            return None
        if index not in self._readers:
            self._readers[index] = ChoiceReader(self.reply)
        return self._readers[index]

    def _chunk(self, index: int, delta: dict[str, Any] | None, text: str,
               finish: str | None, outrider: dict[str, Any] | None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            head = {"role": "assistant"} if index not in self._started else {}
            choice["delta"] = {**head, **(delta or {})}
        else:
            choice["text"] = text
        self._started.add(index)
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish
        chunk: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": [choice]}
        if outrider is not None:
            chunk["outrider"] = outrider
        return chunk

    def _logprobs(self, index: int, tokens: list[TokenEvent]) -> dict[str, Any] | None:
        if not self.logprobs or not tokens:
            return None
        if self.chat:
            return chat_logprobs(tokens)
        return self._legacy.setdefault(index, CompletionLogprobs()).add(tokens)

    def _flush(self, index: int, pending: dict[int, _Pending]) -> list[dict[str, Any]]:
        item = pending.pop(index, None)
        if item is None or item.empty():
            return []
        extra = _token_info(item.tokens)
        if item.step is not None:
            extra["step"] = step_json(item.step)
        text = "".join(item.text)
        reader = self._reader(index)
        delta = reader.push(text).delta() if reader is not None else {"content": text}
        return [self._chunk(index, delta, text, None, extra, self._logprobs(index, item.tokens))]

    def _finish(self, event: Finished) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        reader = self._reader(event.index)
        end = reader.finish(event.reason) if reader is not None else None
        if end is not None and not end.rest.empty():  # held back by the parser: sent first
            out.append(self._chunk(event.index, end.rest.delta(), "", None, _token_info([])))
        self.finished[event.index] = event
        outrider = {**finish_json(event), **_malformed(end)}
        out.append(self._chunk(event.index, None, "", event.reason if end is None else end.reason,
                               outrider))
        return out

    def chunks(self, batch: list[Event]) -> list[dict[str, Any]]:
        """The chunks for one batch of events, in order per choice."""
        out: list[dict[str, Any]] = []
        pending: dict[int, _Pending] = {}
        for event in batch:
            if isinstance(event, TokenEvent):
                item = pending.setdefault(event.index, _Pending())
                item.text.append(event.text)
                item.tokens.append(event)
            elif isinstance(event, StepStats):
                pending.setdefault(event.index, _Pending()).step = event
            elif isinstance(event, Finished):
                out += self._flush(event.index, pending)
                out += self._finish(event)
            elif isinstance(event, ErrorEvent):
                for index in sorted(pending):
                    out += self._flush(index, pending)
                out.append(stream_error_json(event))
                return out
        for index in sorted(pending):
            out += self._flush(index, pending)
        return out

    def closing_chunks(self) -> list[dict[str, Any]]:
        """After every choice finished: the usage-only chunk, if the client asked for it."""
        if not self.include_usage:
            return []
        return [{"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": [],
                 "usage": usage_json(self.finished)}]


class ResponseCollector:
    """Gathers a whole (non-streamed) completion; `reply` and `logprobs` as for `ChunkWriter`."""

    def __init__(self, *, chat: bool, model: str, n: int, reply: ReplyOptions | None = None,
                 logprobs: bool = False) -> None:
        self.chat = chat
        self.model = model
        self.n = n
        self.reply = reply if chat else None
        self.logprobs = logprobs
        self.error: ErrorEvent | None = None
        self._text: dict[int, list[str]] = {i: [] for i in range(n)}
        self._tokens: dict[int, list[TokenEvent]] = {i: [] for i in range(n)}
        self._finished: dict[int, Finished] = {}

    def add(self, batch: list[Event]) -> None:
        for event in batch:
            if isinstance(event, TokenEvent):
                self._text.setdefault(event.index, []).append(event.text)
                self._tokens.setdefault(event.index, []).append(event)
            elif isinstance(event, Finished):
                self._finished[event.index] = event
            elif isinstance(event, ErrorEvent) and self.error is None:
                self.error = event

    @property
    def complete(self) -> bool:
        return len(self._finished) >= self.n

    def _choice(self, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """One choice and its `outrider` entry."""
        text = "".join(self._text[index])
        tokens = self._tokens.get(index, [])
        done = self._finished.get(index)
        reason: str = done.reason if done else "cancelled"
        choice: dict[str, Any] = {"index": index}
        info: dict[str, Any] = {"index": index, **_token_info(tokens)}
        if self.reply is not None:
            reader = ChoiceReader(self.reply)
            reader.push(text)
            end = reader.finish(reason)
            reason = end.reason
            choice["message"] = message_json(end.parsed)
            info.update(_malformed(end))
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        if self.logprobs:
            choice["logprobs"] = (chat_logprobs(tokens) if self.chat
                                  else CompletionLogprobs().add(tokens))
        choice["finish_reason"] = reason
        if done is not None:
            info.update(finish_json(done))
        return choice, info

    def response(self) -> dict[str, Any]:
        choices, extra = zip(*(self._choice(index) for index in sorted(self._text)), strict=True)
        return {"id": ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24],
                "object": "chat.completion" if self.chat else "text_completion",
                "created": int(time.time()), "model": self.model, "choices": list(choices),
                "usage": usage_json(self._finished), "outrider": {"choices": list(extra)}}
