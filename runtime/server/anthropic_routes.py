"""Anthropic's Messages API on the same server: `POST /v1/messages` and
`POST /v1/messages/count_tokens` (the key as `x-api-key` or `Authorization: Bearer`).

A request is read onto the engine's request through the OpenAI chat request
(`runtime.server.dialect`, `runtime.server.anthropic_schema`); the reply's pieces become
content blocks in order — `thinking` (a reasoning model's thinking, with an empty
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
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from runtime.server.anthropic_schema import RENAME, MessagesBody, MessagesRequest
from runtime.server.completion import finish_json, stream_error_json
from runtime.server.dialect import (
    Piece,
    ReplyReader,
    Run,
    arguments_object,
    chat_request,
    collect,
    prepare,
    served_model,
    start,
    stream_pieces,
)
from runtime.server.dialect_errors import anthropic_error_type
from runtime.server.error_responses import response_for_event, status_for_kind
from runtime.server.router import Lease
from runtime.server.sse import sse_event, sse_response
from runtime.server.state import ServerState


def anthropic_router(state: ServerState) -> APIRouter:
    # Not in /openapi.json: that document describes OpenAI's error shape (openapi_doc).
    router = APIRouter(prefix="/v1/messages", include_in_schema=False)

    @router.post("")
    async def messages(body: MessagesRequest, request: Request) -> Response:
        lease = await served_model(state, request, body.model)
        writer = MessageWriter(body.model)
        if body.max_tokens == 0:
            prefilled = await _prefill(state, lease, body, request)
            if isinstance(prefilled, Response):
                return prefilled
            if body.stream:
                return sse_response(_event_list([*writer.opening(), *writer.closing(prefilled)]))
            return JSONResponse(writer.message([], prefilled))
        openai = chat_request(body.openai_fields(), RENAME)
        generation, reply = await prepare(state, lease, openai, RENAME)
        run = await start(state, lease, generation, request)
        if isinstance(run, Response):
            return run
        reader = ReplyReader(reply)
        if body.stream:
            return sse_response(_events(run, reader, writer), on_close=run.bridge.close)
        pieces = await collect(run, reader)
        if reader.error is not None:
            return response_for_event(reader.error.kind, reader.error.message)
        return JSONResponse(writer.message(pieces, reader))

    @router.post("/count_tokens")
    async def count_tokens(body: MessagesBody, request: Request) -> Response:
        lease = await served_model(state, request, body.model)
        prefilled = await _prefill(state, lease, body, request)
        if isinstance(prefilled, Response):
            return prefilled
        done = prefilled.finished
        return JSONResponse({"input_tokens": done.usage.prompt_tokens if done else 0})

    return router


async def _prefill(state: ServerState, lease: Lease, body: MessagesBody,
                   request: Request) -> ReplyReader | Response:
    """Render and prefill the prompt, generating one token (no grammar): the reader holds
    its `Finished` (the exact prompt count; `completion_tokens` forced to 0)."""
    fields = {**body.openai_fields(), "max_tokens": 1}
    fields.pop("stop", None)
    generation, _ = await prepare(state, lease, chat_request(fields, RENAME), RENAME)
    generation = dataclasses.replace(generation, constraint=None, logprobs=None)
    run = await start(state, lease, generation, request)
    if isinstance(run, Response):
        return run
    reader = ReplyReader(None)
    await collect(run, reader)
    if reader.error is not None:
        return response_for_event(reader.error.kind, reader.error.message)
    if reader.finished is not None:
        usage = dataclasses.replace(reader.finished.usage, completion_tokens=0)
        reader.finished = dataclasses.replace(reader.finished, usage=usage, reason="length")
    return reader


async def _event_list(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def stop_of(reader: ReplyReader) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence of a reply."""
    reason = reader.reason
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if reader.stop_sequence is not None:
        return "stop_sequence", reader.stop_sequence
    return "end_turn", None


def usage_of(reader: ReplyReader) -> dict[str, int]:
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

    def __init__(self, model: str) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self._index = -1
        self._open: str | None = None  # the kind of the open text block

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def message(self, pieces: list[Piece], reader: ReplyReader) -> dict[str, Any]:
        stop_reason, stop_sequence = stop_of(reader)
        out = {**self._head(), "content": [block_json(p) for p in pieces],
               "stop_reason": stop_reason, "stop_sequence": stop_sequence,
               "usage": usage_of(reader)}
        if reader.finished is not None:
            out["outrider"] = finish_json(reader.finished)
        return out

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

    def pieces(self, pieces: list[Piece]) -> list[bytes]:
        out: list[bytes] = []
        for piece in pieces:
            if piece.kind == "tool_call" or piece.kind != self._open:
                out += self._begin(piece)
                self._open = piece.kind
            out.append(sse_event("content_block_delta", {"type": "content_block_delta",
                                                         "index": self._index,
                                                         "delta": _delta(piece)}))
        return out

    def closing(self, reader: ReplyReader) -> list[bytes]:
        stop_reason, stop_sequence = stop_of(reader)
        delta: dict[str, Any] = {"type": "message_delta",
                                 "delta": {"stop_reason": stop_reason,
                                           "stop_sequence": stop_sequence},
                                 "usage": usage_of(reader)}
        if reader.finished is not None:
            delta["outrider"] = finish_json(reader.finished)
        return [*self._close(), sse_event("message_delta", delta),
                sse_event("message_stop", {"type": "message_stop"})]


async def _events(run: Run, reader: ReplyReader, writer: MessageWriter) -> AsyncIterator[bytes]:
    for event in writer.opening():
        yield event
    async for pieces in stream_pieces(run, reader):
        for event in writer.pieces(pieces):
            yield event
    if reader.error is not None:
        status, _ = status_for_kind(reader.error.kind)
        message = stream_error_json(reader.error)["error"]["message"]
        yield sse_event("error", {"type": "error", "error": {
            "type": anthropic_error_type(status), "message": message}})
    elif reader.finished is not None:
        for event in writer.closing(reader):
            yield event

