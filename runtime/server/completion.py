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
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.events import ErrorEvent, Event, Finished, StepStats, TokenEvent
from runtime.server.error_responses import error_body, status_for_kind
from runtime.server.jsonable import to_jsonable


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
    token_ids: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    step: StepStats | None = None  # the last of the batch (its reply_ counts cover the rest)

    def empty(self) -> bool:
        return not self.token_ids and self.step is None


class ChunkWriter:
    """Makes the `data:` payloads of one streamed completion."""

    def __init__(self, *, chat: bool, model: str, n: int, include_usage: bool) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.n = n
        self.include_usage = include_usage
        self.finished: dict[int, Finished] = {}
        self._started: set[int] = set()

    def _chunk(self, index: int, text: str | None, finish: str | None,
               outrider: dict[str, Any] | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            delta: dict[str, Any] = {}
            if index not in self._started:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        self._started.add(index)
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        chunk: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": [choice]}
        if outrider is not None:
            chunk["outrider"] = outrider
        return chunk

    def _flush(self, index: int, pending: dict[int, _Pending]) -> list[dict[str, Any]]:
        item = pending.pop(index, None)
        if item is None or item.empty():
            return []
        extra: dict[str, Any] = {"token_ids": item.token_ids, "from_draft": item.from_draft}
        if item.step is not None:
            extra["step"] = step_json(item.step)
        return [self._chunk(index, "".join(item.text), None, extra)]

    def chunks(self, batch: list[Event]) -> list[dict[str, Any]]:
        """The chunks for one batch of events, in order per choice."""
        out: list[dict[str, Any]] = []
        pending: dict[int, _Pending] = {}
        for event in batch:
            if isinstance(event, TokenEvent):
                item = pending.setdefault(event.index, _Pending())
                item.text.append(event.text)
                item.token_ids.append(event.token_id)
                item.from_draft.append(event.from_draft)
            elif isinstance(event, StepStats):
                pending.setdefault(event.index, _Pending()).step = event
            elif isinstance(event, Finished):
                out += self._flush(event.index, pending)
                self.finished[event.index] = event
                out.append(self._chunk(event.index, None if self.chat else "", event.reason,
                                       finish_json(event)))
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
    """Gathers a whole (non-streamed) completion."""

    def __init__(self, *, chat: bool, model: str, n: int) -> None:
        self.chat = chat
        self.model = model
        self.n = n
        self.error: ErrorEvent | None = None
        self._text: dict[int, list[str]] = {i: [] for i in range(n)}
        self._ids: dict[int, list[int]] = {i: [] for i in range(n)}
        self._draft: dict[int, list[bool]] = {i: [] for i in range(n)}
        self._finished: dict[int, Finished] = {}

    def add(self, batch: list[Event]) -> None:
        for event in batch:
            if isinstance(event, TokenEvent):
                self._text.setdefault(event.index, []).append(event.text)
                self._ids.setdefault(event.index, []).append(event.token_id)
                self._draft.setdefault(event.index, []).append(event.from_draft)
            elif isinstance(event, Finished):
                self._finished[event.index] = event
            elif isinstance(event, ErrorEvent) and self.error is None:
                self.error = event

    @property
    def complete(self) -> bool:
        return len(self._finished) >= self.n

    def response(self) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        extra: list[dict[str, Any]] = []
        for index in sorted(self._text):
            text = "".join(self._text[index])
            done = self._finished.get(index)
            choice: dict[str, Any] = {"index": index}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = None
            choice["finish_reason"] = done.reason if done else "cancelled"
            choices.append(choice)
            info: dict[str, Any] = {"index": index, "token_ids": self._ids[index],
                                    "from_draft": self._draft[index]}
            if done is not None:
                info.update(finish_json(done))
            extra.append(info)
        return {"id": ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24],
                "object": "chat.completion" if self.chat else "text_completion",
                "created": int(time.time()), "model": self.model, "choices": choices,
                "usage": usage_json(self._finished), "outrider": {"choices": extra}}
