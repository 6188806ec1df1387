"""OpenAI's Responses API on the same server: `POST /v1/responses` (nothing stored: see
`runtime.server.dialects.responses.schema`).

A request is read into the engine's request (`schema`) and answered by
`runtime.server.generation.answer`; the reply's pieces become output items in order — `reasoning`
(its text as `reasoning_text` content), `message` (one `output_text` part), `function_call`
(`call_id`, `name`, `arguments` as JSON text):

    {"id": "resp_…", "object": "response", "status": "completed", "model": "m",
     "output": [{"type": "message", "id": "msg_…", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}],
     "usage": {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11, …}, "store": false}

`status` is "incomplete" (with `incomplete_details.reason: "max_output_tokens"`) when the
reply was cut by the token limit. Streamed, each item comes as OpenAI sends it:

    response.created, response.in_progress,
    response.output_item.added, response.content_part.added,
        response.output_text.delta … response.output_text.done (reasoning:
        response.reasoning_text.delta … .done; a call: response.function_call_arguments.delta
        and .done), response.content_part.done, response.output_item.done   (per item)
    response.completed (or response.incomplete)

every event with its `type` and a rising `sequence_number`; a failure after the first byte
is an `error` event followed by `response.failed`. `GET /v1/responses/{id}` is a 404 that
says nothing is stored.

With `include: ["message.output_text.logprobs"]` the message's `output_text` part carries
`logprobs` — one `{"token", "logprob", "bytes", "top_logprobs": [...]}` per generated token,
the chat route's entries (`runtime.server.logprobs`) — and each streamed
`response.output_text.delta` the entries of the tokens that arrived since the last delta
(an empty delta carries the last ones if no text came with them), so the deltas' entries add
up to the whole reply's. As on the chat route, every generated token counts, thinking
included.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from runtime.errors import shown
from runtime.events import ErrorEvent, TokenEvent
from runtime.server.dialects.responses.schema import NOT_STORED, ResponsesRequest
from runtime.server.errors import error_body, error_response, response_for_event, status_for_kind
from runtime.server.generation import (
    Choice,
    Piece,
    Reply,
    Update,
    answer,
    finish_json,
    fold,
    lease_for,
    prepared,
)
from runtime.server.logprobs import chat_logprobs
from runtime.server.sse import sse_event
from runtime.server.state import ServerState


def responses_router(state: ServerState) -> APIRouter:
    router = APIRouter(prefix="/v1/responses")

    @router.post("")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        lease = await lease_for(state, request, body.model)
        generation, reply = await prepared(
            state, request, lambda: body.ask(state.limits).generation(lease.model, state.limits))
        return await answer(request, lease, generation, reply, ResponseWriter(body),
                            stream=body.stream, poll_s=state.limits.poll_interval_s)

    @router.get("/{response_id}")
    def stored(response_id: str) -> Response:
        return error_response(404, f"no response {shown(response_id)!r}: {NOT_STORED}",
                              code="not_found")

    return router


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def usage_json(reader: Choice) -> dict[str, Any] | None:
    done = reader.finished
    if done is None:
        return None
    usage = done.usage
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


class ResponseWriter:
    """One reply as a Response object, whole or as stream events."""

    media_type = "text/event-stream"

    def __init__(self, body: ResponsesRequest) -> None:
        self.body = body
        self.id = _id("resp_")
        self.created = int(time.time())
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # finished items (streaming)
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._open_kind: str | None = None
        self._text: list[str] = []
        self.logprobs = body.logprobs
        self._sent = 0  # tokens whose logprobs went out on a delta
        self._entries: list[dict[str, Any]] = []  # the open message's logprobs (streaming)

    # -- whole ----------------------------------------------------------------------------

    def response(self, output: list[dict[str, Any]], reader: Choice | None,
                 status: str | None = None) -> dict[str, Any]:
        body = self.body
        if status is None and reader is not None:
            status = "incomplete" if reader.reason == "length" else "completed"
        tool_choice: Any = body.tool_choice if isinstance(body.tool_choice, str) else (
            body.tool_choice.model_dump() if body.tool_choice is not None else "auto")
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status or "in_progress", "model": body.model, "output": output,
            "error": None,
            "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                                   else None),
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None, "store": False,
            "temperature": body.temperature, "top_p": body.top_p,
            "tool_choice": tool_choice,
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "text": {"format": (body.text.format.model_dump(by_alias=True, exclude_none=True)
                                if body.text is not None and body.text.format is not None
                                else {"type": "text"})},
            "reasoning": ({"effort": body.reasoning.effort, "summary": None}
                          if body.reasoning is not None else None),
            "truncation": body.truncation or "disabled",
            "metadata": body.metadata or {}, "usage": None,
        }
        if reader is not None:
            out["usage"] = usage_json(reader)
            if reader.finished is not None:
                out["outrider"] = finish_json(reader.finished)
        return out

    def items(self, pieces: list[Piece], tokens: list[TokenEvent]) -> list[dict[str, Any]]:
        """The whole reply's output items; the first message carries every token's logprobs
        (when asked for)."""
        out = [_item(piece, _id(_PREFIX[piece.kind]), "completed") for piece in pieces]
        if self.logprobs:
            message = next((item for item in out if item["type"] == "message"), None)
            if message is not None and message["content"]:
                message["content"][0]["logprobs"] = _entries(tokens)
        return out

    def _new_entries(self, tokens: list[TokenEvent]) -> list[dict[str, Any]]:
        """The logprobs of the tokens since the last delta that carried some."""
        if not self.logprobs:
            return []
        entries = _entries(tokens[self._sent:])
        self._sent = len(tokens)
        self._entries += entries
        return entries

    def whole(self, reply: Reply) -> dict[str, Any]:
        choice = reply.choice(0)
        return self.response(self.items(fold(choice.pieces), choice.tokens), choice)

    def error(self, error: ErrorEvent) -> Response:
        return response_for_event(error.kind, error.message)

    # -- streaming ------------------------------------------------------------------------

    def _event(self, kind: str, /, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return sse_event(kind, payload)

    def opening(self) -> list[bytes]:
        head = self.response([], None, "in_progress")
        return [self._event("response.created", response=head),
                self._event("response.in_progress", response=head)]

    def _begin(self, piece: Piece) -> list[bytes]:
        out = self._close()
        item = _item(piece, _id(_PREFIX[piece.kind]), "in_progress", empty=True)
        self._open, self._open_kind, self._text, self._entries = item, piece.kind, [], []
        index = len(self._items)
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        part = _part(piece.kind, "")
        if part is not None:
            out.append(self._event("response.content_part.added", item_id=item["id"],
                                   output_index=index, content_index=0, part=part))
        return out

    def _close(self) -> list[bytes]:
        item, kind = self._open, self._open_kind
        if item is None or kind is None:
            return []
        index = len(self._items)
        text = "".join(self._text)
        out: list[bytes] = []
        where = {"item_id": item["id"], "output_index": index}
        if kind == "content":
            out.append(self._event("response.output_text.done", **where, content_index=0,
                                   text=text, logprobs=self._entries))
        elif kind == "reasoning":
            out.append(self._event("response.reasoning_text.done", **where, content_index=0,
                                   text=text))
        else:
            out.append(self._event("response.function_call_arguments.done", **where,
                                   name=item["name"], arguments=item["arguments"]))
        done = {**item, "status": "completed"}
        part = _part(kind, text, self._entries)
        if part is not None:
            done["content"] = [part]
            out.append(self._event("response.content_part.done", **where, content_index=0,
                                   part=part))
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        self._items.append(done)
        self._open = self._open_kind = None
        return out

    def update(self, update: Update) -> list[bytes]:
        """The events of one batch's pieces."""
        out: list[bytes] = []
        tokens = update.choice.tokens
        for piece in update.pieces + update.rest:
            if piece.kind == "tool_call" or piece.kind != self._open_kind:
                out += self._flush(tokens)  # the tokens so far ride on the message closing
                out += self._begin(piece)
            item = self._open
            if item is None:
                continue
            where = {"item_id": item["id"], "output_index": len(self._items)}
            if piece.call is not None:
                item["arguments"] = piece.call.arguments
                out.append(self._event("response.function_call_arguments.delta", **where,
                                       delta=piece.call.arguments))
                out += self._close()
            elif piece.kind == "reasoning":
                self._text.append(piece.text)
                out.append(self._event("response.reasoning_text.delta", **where,
                                       content_index=0, delta=piece.text))
            else:
                self._text.append(piece.text)
                out.append(self._event("response.output_text.delta", **where, content_index=0,
                                       delta=piece.text, logprobs=self._new_entries(tokens)))
        return out

    def _flush(self, tokens: list[TokenEvent]) -> list[bytes]:
        """An empty delta carrying the logprobs of tokens that brought the open message no
        text of their own (a held-back stop string, the start of a call), as the whole
        reply counts them."""
        item = self._open
        if item is None or self._open_kind != "content" or not self.logprobs:
            return []
        rest = self._new_entries(tokens)
        if not rest:
            return []
        return [self._event("response.output_text.delta", item_id=item["id"],
                            output_index=len(self._items), content_index=0, delta="",
                            logprobs=rest)]

    def closing(self, reply: Reply) -> list[bytes]:
        reader = reply.choice(0)
        if reader.finished is None:
            return []
        out = self._flush(reader.tokens)
        out += self._close()
        final = self.response(self._items, reader)
        name = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self._event(name, response=final))
        return out

    def failure(self, error: ErrorEvent) -> list[bytes]:
        status, code = status_for_kind(error.kind)
        message = error_body(error.message, code=code, status=status)["error"]["message"]
        out = self._close()
        failed = {**self.response(self._items, None, "failed"),
                  "error": {"code": code, "message": message}}
        out.append(self._event("error", code=code, message=message, param=None))
        out.append(self._event("response.failed", response=failed))
        return out


_PREFIX = {"content": "msg_", "reasoning": "rs_", "tool_call": "fc_"}


def _entries(tokens: list[TokenEvent]) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = chat_logprobs(tokens)["content"]
    return content


def _part(kind: str, text: str,
          logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    if kind == "content":
        return {"type": "output_text", "text": text, "annotations": [],
                "logprobs": list(logprobs or ())}
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return None


def _item(piece: Piece, item_id: str, status: str, empty: bool = False) -> dict[str, Any]:
    """An output item; `empty`: as `output_item.added` opens it."""
    if piece.call is not None:
        return {"type": "function_call", "id": item_id, "status": status,
                "call_id": piece.call.id, "name": piece.call.name,
                "arguments": "" if empty else piece.call.arguments}
    part = _part(piece.kind, piece.text)
    content = [] if empty or part is None else [part]
    if piece.kind == "reasoning":
        return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
                "content": content}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}
