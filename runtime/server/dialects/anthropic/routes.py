"""Anthropic's Messages API on the same server: `POST /v1/messages` and
`POST /v1/messages/count_tokens` (the key as `x-api-key` or `Authorization: Bearer`).

A request is read into the engine's request (`schema`) and answered by
`runtime.server.generation.answer`; the reply's pieces become content blocks in order — `thinking` (a reasoning model's thinking, with an empty
`signature`: there is nothing to sign), `text`, `tool_use` (`input` the arguments object):

    {"id": "msg_…", "type": "message", "role": "assistant", "model": "m",
     "content": [{"type": "text", "text": "Let me look."},
                 {"type": "tool_use", "id": "call_…", "name": "get_weather", "input": {"city": "Oslo"}}],
     "stop_reason": "tool_use", "stop_sequence": null,
     "usage": {"input_tokens": 30, "output_tokens": 21, "cache_read_input_tokens": 12,
               "cache_creation_input_tokens": 0}}

`stop_reason`: tool_use (the reply holds calls), max_tokens, stop_sequence (with the one
that matched), else end_turn (a botched call included: its raw text is the text block).
`input_tokens` counts the prompt tokens not read from the prefix cache, as Anthropic's
usage does. Streamed, the events come in Anthropic's order:

    message_start, ping,
    content_block_start / content_block_delta (thinking_delta | text_delta |
        input_json_delta: a call's whole arguments at once) / content_block_stop, per block,
    message_delta (stop_reason, stop_sequence, usage), message_stop

and a failure after the first byte is an `error` event. `count_tokens` renders and
prefills the prompt (max_tokens 1), so its count is exact — and the prompt's cells stay in
the prefix cache for the request that usually follows.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from runtime.errors import shown
from runtime.events import ErrorEvent
from runtime.server.dialects.anthropic.schema import MessagesBody, MessagesRequest
from runtime.server.errors import status_for_kind
from runtime.server.generation import (
    Choice,
    Piece,
    Reply,
    Update,
    answer,
    arguments_object,
    collected,
    finish_json,
    fold,
    lease_for,
    prepared,
)
from runtime.server.models.router import Lease
from runtime.server.request.fields import Sampling
from runtime.server.sse import sse_event, sse_response
from runtime.server.state import ServerState

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_json(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body: `{"type": "error", "error": {"type": ..., "message": ...}}`.

    >>> error_json(401, "wrong API key")
    {'type': 'error', 'error': {'type': 'authentication_error', 'message': 'wrong API key'}}
    """
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": shown(message)}}


def anthropic_router(state: ServerState) -> APIRouter:
    # Not in /openapi.json: that document describes OpenAI's error shape (openapi_doc).
    router = APIRouter(prefix="/v1/messages", include_in_schema=False)

    @router.post("")
    async def messages(body: MessagesRequest, request: Request) -> Response:
        lease = await lease_for(state, request, body.model)
        writer = MessageWriter(body.model)
        if body.max_tokens == 0:
            prefilled = await _prefill(state, lease, body, request)
            if isinstance(prefilled, ErrorEvent):
                return writer.error(prefilled)
            if body.stream:
                return sse_response(_events([*writer.opening(), *writer.closing(prefilled)]))
            return JSONResponse(writer.whole(prefilled))
        generation, reply = await prepared(
            state, request, lambda: body.ask(state.limits).generation(lease.model, state.limits))
        return await answer(request, lease, generation, reply, writer, stream=body.stream,
                            poll_s=state.limits.poll_interval_s)

    @router.post("/count_tokens")
    async def count_tokens(body: MessagesBody, request: Request) -> Response:
        lease = await lease_for(state, request, body.model)
        prefilled = await _prefill(state, lease, body, request)
        if isinstance(prefilled, ErrorEvent):
            return MessageWriter(body.model).error(prefilled)
        done = prefilled.choice(0).finished
        return JSONResponse({"input_tokens": done.usage.prompt_tokens if done else 0})

    return router


async def _prefill(state: ServerState, lease: Lease, body: MessagesBody,
                   request: Request) -> Reply | ErrorEvent:
    """Render and prefill the prompt, generating one token (no grammar, no stop): the reply
    holds its `Finished` (the exact prompt count; `completion_tokens` forced to 0)."""
    def prepare() -> Any:
        ask = dataclasses.replace(body.ask(state.limits), sampling=Sampling(max_tokens=1))
        generation, _ = ask.generation(lease.model, state.limits)
        return dataclasses.replace(generation, constraint=None, logprobs=None)

    generation = await anyio.to_thread.run_sync(prepare)
    reply = await collected(request, lease, generation, state.limits.poll_interval_s)
    if reply.error is not None:
        return reply.error
    choice = reply.choice(0)
    choice.pieces = []  # the one token made is not a reply
    if choice.finished is not None:
        usage = dataclasses.replace(choice.finished.usage, completion_tokens=0)
        choice.finished = dataclasses.replace(choice.finished, usage=usage, reason="length")
    return reply


async def _events(events: list[bytes]) -> Any:
    for event in events:
        yield event


def stop_of(reader: Choice) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence of a reply."""
    reason = reader.reason
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if reader.stop_sequence is not None:
        return "stop_sequence", reader.stop_sequence
    return "end_turn", None


def usage_of(reader: Choice) -> dict[str, int]:
    done = reader.finished
    if done is None:
        return {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0}
    cached = done.usage.cached_tokens
    return {"input_tokens": done.usage.prompt_tokens - cached,
            "output_tokens": done.usage.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def block_json(piece: Piece) -> dict[str, Any]:
    """A whole block of a reply."""
    if piece.call is not None:
        return {"type": "tool_use", "id": piece.call.id, "name": piece.call.name,
                "input": arguments_object(piece.call.arguments)}
    if piece.kind == "reasoning":
        return {"type": "thinking", "thinking": piece.text, "signature": ""}
    return {"type": "text", "text": piece.text}


def _empty_block(piece: Piece) -> dict[str, Any]:
    """A block as `content_block_start` opens it."""
    if piece.call is not None:
        return {"type": "tool_use", "id": piece.call.id, "name": piece.call.name, "input": {}}
    if piece.kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def _delta(piece: Piece) -> dict[str, Any]:
    if piece.call is not None:
        return {"type": "input_json_delta", "partial_json": piece.call.arguments}
    if piece.kind == "reasoning":
        return {"type": "thinking_delta", "thinking": piece.text}
    return {"type": "text_delta", "text": piece.text}


class MessageWriter:
    """One reply as Anthropic's message, whole or as stream events."""

    media_type = "text/event-stream"

    def __init__(self, model: str) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self._index = -1
        self._open: str | None = None  # the kind of the open text block

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def whole(self, reply: Reply) -> dict[str, Any]:
        choice = reply.choice(0)
        stop_reason, stop_sequence = stop_of(choice)
        out = {**self._head(), "content": [block_json(p) for p in fold(choice.pieces)],
               "stop_reason": stop_reason, "stop_sequence": stop_sequence,
               "usage": usage_of(choice)}
        if choice.finished is not None:
            out["outrider"] = finish_json(choice.finished)
        return out

    def error(self, error: ErrorEvent) -> Response:
        status, _ = status_for_kind(error.kind)
        message = error.message if status < 500 else f"internal error: {error.kind}: {error.message}"
        return JSONResponse(error_json(status, message), status_code=status)

    # -- streaming ----------------------------------------------------------------------------

    def opening(self) -> list[bytes]:
        start = {**self._head(), "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [sse_event("message_start", {"type": "message_start", "message": start}),
                sse_event("ping", {"type": "ping"})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [sse_event("content_block_stop", {"type": "content_block_stop",
                                                 "index": self._index})]

    def _begin(self, piece: Piece) -> list[bytes]:
        out = self._close()
        self._index += 1
        out.append(sse_event("content_block_start", {"type": "content_block_start",
                                                     "index": self._index,
                                                     "content_block": _empty_block(piece)}))
        return out

    def update(self, update: Update) -> list[bytes]:
        out: list[bytes] = []
        for piece in update.pieces + update.rest:
            if piece.kind == "tool_call" or piece.kind != self._open:
                out += self._begin(piece)
                self._open = piece.kind
            out.append(sse_event("content_block_delta", {"type": "content_block_delta",
                                                         "index": self._index,
                                                         "delta": _delta(piece)}))
        return out

    def closing(self, reply: Reply) -> list[bytes]:
        choice = reply.choice(0)
        if choice.finished is None:
            return []
        stop_reason, stop_sequence = stop_of(choice)
        delta: dict[str, Any] = {"type": "message_delta",
                                 "delta": {"stop_reason": stop_reason,
                                           "stop_sequence": stop_sequence},
                                 "usage": usage_of(choice), "outrider": finish_json(choice.finished)}
        return [*self._close(), sse_event("message_delta", delta),
                sse_event("message_stop", {"type": "message_stop"})]

    def failure(self, error: ErrorEvent) -> list[bytes]:
        status, _ = status_for_kind(error.kind)
        return [sse_event("error", error_json(status, error.message))]
