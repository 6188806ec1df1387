"""A reply in OpenAI's JSON: streamed chunks or the whole completion, chat or text.

Chat and text completions differ only in names: a chat choice carries `delta`/`message`, a
text choice `text`. Both add an `outrider` object (docs/api.md). A batch of events becomes at
most one content chunk per choice (`runtime.server.generation.Update`), so a speculative
round that accepted four tokens reaches the client as one chunk. Its `step` is the batch's
last round: a `StepStats` carries the reply's running counts (`reply_drafted`,
`reply_accepted`, the acceptance rate), so the rounds before it in the batch lose nothing but
their own per-round figures.

A chat reply whose model thinks or calls functions carries `reasoning_content` and
`tool_calls` beside `content` (a piece with nothing says `"content": ""`: text held back),
and its finish reason may be "tool_calls" or "malformed_tool_call". Logprobs, when asked for,
ride on each chunk for its own tokens (`runtime.server.logprobs`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.responses import JSONResponse

from runtime.chat.reply import ParsedReply
from runtime.events import ErrorEvent, StepStats, TokenEvent, ToolCall
from runtime.server.errors import error_body, response_for_event, status_for_kind
from runtime.server.generation import Choice, Piece, Reply, Update, finish_json, usage_json
from runtime.server.jsonable import to_jsonable
from runtime.server.logprobs import CompletionLogprobs, chat_logprobs
from runtime.server.sse import SSE_DONE, sse_data


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """OpenAI's JSON of a call; with `index` as a stream delta carries it."""
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update({"id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}})
    return out


def delta_json(pieces: list[Piece]) -> dict[str, Any]:
    """A chunk's `delta` of some pieces. `content` is left out when they hold only thinking
    or calls; no pieces at all say `"content": ""` (text held back)."""
    out: dict[str, Any] = {}
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind == "content")
    calls = [tool_call_json(p.call, p.index) for p in pieces if p.call is not None]
    if reasoning:
        out["reasoning_content"] = reasoning
    if content or (not out and not calls):
        out["content"] = content
    if calls:
        out["tool_calls"] = calls
    return out


def message_json(parsed: ParsedReply) -> dict[str, Any]:
    """The `message` of a whole reply."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:  # with a botched call after them too: those were well formed
        message["tool_calls"] = [tool_call_json(call) for call in parsed.tool_calls]
        if not parsed.content.strip():
            message["content"] = None  # as OpenAI: a reply that is only calls has no content
    return message


def step_json(step: StepStats) -> dict[str, Any]:
    out = to_jsonable(step)
    del out["request_id"], out["index"]
    return dict(out)


def stream_error_json(event: ErrorEvent) -> dict[str, Any]:
    status, code = status_for_kind(event.kind)
    return error_body(event.message, code=code, status=status)


def _token_info(tokens: list[TokenEvent]) -> dict[str, Any]:
    return {"token_ids": [t.token_id for t in tokens], "from_draft": [t.from_draft for t in tokens]}


def _malformed(choice: Choice) -> dict[str, Any]:
    """The `outrider` note of a botched call: why the parser refused it."""
    return {} if choice.malformed is None else {"malformed_tool_call": choice.malformed}


class OpenAIWriter:
    """One completion (`chat` or text) as OpenAI's JSON; `logprobs`: the request asked."""

    media_type = "text/event-stream"

    def __init__(self, *, chat: bool, model: str, include_usage: bool = False,
                 logprobs: bool = False) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.logprobs = logprobs
        self._started: set[int] = set()
        self._legacy: dict[int, CompletionLogprobs] = {}

    def _chunk(self, index: int, pieces: list[Piece], text: str, finish: str | None,
               outrider: dict[str, Any], logprobs: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            head = {"role": "assistant"} if index not in self._started else {}
            choice["delta"] = {**head, **(delta_json(pieces) if finish is None else {})}
        else:
            choice["text"] = text
        self._started.add(index)
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish
        return {"id": self.id, "object": self.object + (".chunk" if self.chat else ""),
                "created": self.created, "model": self.model, "choices": [choice],
                "outrider": outrider}

    def _logprobs(self, index: int, tokens: list[TokenEvent]) -> dict[str, Any] | None:
        if not self.logprobs or not tokens:
            return None
        if self.chat:
            return chat_logprobs(tokens)
        return self._legacy.setdefault(index, CompletionLogprobs()).add(tokens)

    # -- streamed ---------------------------------------------------------------------------

    def opening(self) -> list[bytes]:
        return []

    def update(self, update: Update) -> list[bytes]:
        index, out = update.choice.index, []
        if update.tokens or update.step is not None:
            extra = _token_info(update.tokens)
            if update.step is not None:
                extra["step"] = step_json(update.step)
            out.append(self._chunk(index, update.pieces, update.text, None, extra,
                                   self._logprobs(index, update.tokens)))
        if update.finished is not None:
            if update.rest:  # held back by the parser: sent first
                out.append(self._chunk(index, update.rest, "", None, _token_info([])))
            outrider = {**finish_json(update.finished), **_malformed(update.choice)}
            out.append(self._chunk(index, [], "", update.choice.reason, outrider))
        return [sse_data(chunk) for chunk in out]

    def closing(self, reply: Reply) -> list[bytes]:
        """After every choice finished: the usage-only chunk, if the client asked for it."""
        if not self.include_usage:
            return [SSE_DONE]
        usage = {"id": self.id, "object": self.object + (".chunk" if self.chat else ""),
                 "created": self.created, "model": self.model, "choices": [],
                 "usage": usage_json(_finished(reply))}
        return [sse_data(usage), SSE_DONE]

    def failure(self, error: ErrorEvent) -> list[bytes]:
        return [sse_data(stream_error_json(error)), SSE_DONE]

    # -- whole ------------------------------------------------------------------------------

    def whole(self, reply: Reply) -> dict[str, Any]:
        choices, extra = [], []
        for index in range(reply.n):
            choice = reply.choice(index)
            entry: dict[str, Any] = {"index": index}
            info: dict[str, Any] = {"index": index, **_token_info(choice.tokens)}
            text = "".join(token.text for token in choice.tokens)
            if choice.parsed is not None:
                entry["message"] = message_json(choice.parsed)
                info.update(_malformed(choice))
            elif self.chat:
                entry["message"] = {"role": "assistant", "content": text}
            else:
                entry["text"] = text
            entry["logprobs"] = None
            if self.logprobs:
                entry["logprobs"] = (chat_logprobs(choice.tokens) if self.chat
                                     else CompletionLogprobs().add(choice.tokens))
            entry["finish_reason"] = choice.reason
            if choice.finished is not None:
                info.update(finish_json(choice.finished))
            choices.append(entry)
            extra.append(info)
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices, "usage": usage_json(_finished(reply)),
                "outrider": {"choices": extra}}

    def error(self, error: ErrorEvent) -> JSONResponse:
        return response_for_event(error.kind, error.message)


def _finished(reply: Reply) -> list[Any]:
    return [c.finished for c in reply.choices.values() if c.finished is not None]
