"""One generation, whichever dialect asked: every route that writes text (`/v1/chat/completions`,
`/v1/completions`, `/v1/responses`, `/v1/messages`, `/api/chat`, `/api/generate`) ends in
`answer`, with the dialect's `Writer`:

    lease = await lease_for(state, request, body.model)       # loads the model if need be
    generation, reply = await prepared(state, request, lambda: body.ask(limits).generation(
        lease.model, limits))
    return await answer(request, lease, generation, reply, writer, stream=body.stream,
                        poll_s=state.limits.poll_interval_s)

`answer` submits (the first call to the engine for this request), then collects the reply
whole or streams it as it comes; a stream's status waits for its first events — an error
there is the response, a status, as no byte has been sent yet. `Reply` reads the events
once for every dialect: per choice, the tokens, the pieces the template family's parser
finds (answer text, thinking text, whole tool calls: `runtime.chat.reply`), the finish
reason:

    Update(choice=0, pieces=[Piece("reasoning", "Plan."), Piece("content", "Hi")], ...)
    reply.choice(0).reason      # "stop", "length", "tool_calls", "malformed_tool_call", "cancelled"

Finish reasons: "tool_calls" when the reply holds calls; "malformed_tool_call" when the model
started a call and botched it (its raw text is then in the content, so nothing is lost; the
well-formed calls before it stay calls); otherwise the engine's. A botched call cut off by
max_tokens says "length": it was cut, not botched.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol, TypeVar

import anyio
import anyio.to_thread
from fastapi import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Send

from runtime.chat.reply import ParsedReply, ReplyParser
from runtime.events import (
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    ReasoningOpen,
    StepStats,
    TokenEvent,
    ToolCall,
)
from runtime.server.jsonable import to_jsonable
from runtime.server.models.router import KEEP, LEASES, Lease
from runtime.server.request.ask import ReplyOptions
from runtime.server.sse import (
    SSE_HEADERS,
    DisconnectAwareStreamingResponse,
    EventBridge,
    wait_for_disconnect,
)
from runtime.server.state import ServerState

PieceKind = Literal["content", "reasoning", "tool_call"]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Piece:
    """One ordered piece of a reply: answer or thinking text, or a whole tool call (`index`:
    its place among the reply's calls)."""

    kind: PieceKind
    text: str = ""
    call: ToolCall | None = None
    index: int = 0


def fold(pieces: list[Piece]) -> list[Piece]:
    """Adjacent text pieces of one kind joined: the blocks of a whole reply.

    >>> [(p.kind, p.text) for p in fold([Piece("reasoning", "a"), Piece("reasoning", "b"),
    ...                                  Piece("content", "c")])]
    [('reasoning', 'ab'), ('content', 'c')]
    """
    out: list[Piece] = []
    for piece in pieces:
        if out and piece.kind != "tool_call" and out[-1].kind == piece.kind:
            out[-1] = Piece(piece.kind, out[-1].text + piece.text)
        else:
            out.append(piece)
    return out


def arguments_object(text: str) -> dict[str, Any]:
    """A call's JSON arguments text as the object Ollama and Anthropic send (the parser's
    calls always hold an object; anything else becomes {}).

    >>> arguments_object('{"city":"Oslo"}'), arguments_object("[1]")
    ({'city': 'Oslo'}, {})
    """
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def finish_reason(engine_reason: str, parsed: ParsedReply) -> str:
    if engine_reason == "cancelled":
        return engine_reason
    if parsed.malformed is not None:
        return "malformed_tool_call" if engine_reason == "stop" else engine_reason
    if parsed.tool_calls:
        return "tool_calls"
    return engine_reason


class Choice:
    """One sample's reply as read so far."""

    def __init__(self, index: int, options: ReplyOptions | None, in_reasoning: bool) -> None:
        self.index = index
        self.tokens: list[TokenEvent] = []
        self.pieces: list[Piece] = []
        self.finished: Finished | None = None
        self.parsed: ParsedReply | None = None  # the whole reply, once finished (a parser's)
        self._parser = None if options is None else ReplyParser(
            options.family, in_reasoning=in_reasoning and options.thinks,
            tools=options.parse_calls, tool_specs=options.tools)
        self._ids: dict[int, str] = {}  # the id each call goes out with, by index

    def push(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._parser is None:
            self.pieces.append(Piece("content", text))
            return self.pieces[-1:]
        return self._pieces(self._parser.push(text))

    def finish(self, event: Finished) -> list[Piece]:
        """The pieces the parser held back until the end."""
        self.finished = event
        if self._parser is None:
            return []
        rest = self._pieces(self._parser.close())
        parsed = self._parser.finish()
        calls = tuple(self._with_id(i, call) for i, call in enumerate(parsed.tool_calls))
        self.parsed = dataclasses.replace(parsed, tool_calls=calls)
        return rest

    def _pieces(self, deltas: list[Any]) -> list[Piece]:
        out: list[Piece] = []
        for delta in deltas:
            if delta.kind == "tool_call":
                if delta.tool_call is not None:
                    out.append(Piece("tool_call", call=self._with_id(delta.tool_index,
                                                                     delta.tool_call),
                                     index=delta.tool_index))
            elif delta.text:
                out.append(Piece(delta.kind, delta.text))
        self.pieces += out
        return out

    def _with_id(self, index: int, call: ToolCall) -> ToolCall:
        """The call with the id it was (or will be) sent with; one is made, once, for a call
        that has none."""
        if index not in self._ids:
            self._ids[index] = call.id or "call_" + uuid.uuid4().hex[:24]
        return dataclasses.replace(call, id=self._ids[index])

    @property
    def reason(self) -> str:
        engine = self.finished.reason if self.finished is not None else "cancelled"
        return engine if self.parsed is None else finish_reason(engine, self.parsed)

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the reply, when the engine says which."""
        return getattr(self.finished, "stop_sequence", None)

    @property
    def malformed(self) -> str | None:
        """Why the parser refused a botched call."""
        return self.parsed.malformed if self.parsed is not None else None


@dataclass
class Update:
    """What one batch of events brought one choice: the pieces of its new `tokens`, its
    last `step`, and — when it `finished` — the pieces the parser held back (`rest`)."""

    choice: Choice
    pieces: list[Piece] = field(default_factory=list)
    tokens: list[TokenEvent] = field(default_factory=list)
    step: StepStats | None = None
    finished: Finished | None = None
    rest: list[Piece] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.tokens)


class Reply:
    """A request's reply read from the engine's events: its choices, and the error that
    ended it. A batch gives at most one update per choice (so a speculative round that
    accepted four tokens goes out as one chunk), in the order the choices finished, then
    the others by index."""

    def __init__(self, options: ReplyOptions | None, n: int = 1) -> None:
        self.options = options
        self.n = n
        self.in_reasoning = False
        self.choices: dict[int, Choice] = {}
        self.error: ErrorEvent | None = None

    def choice(self, index: int) -> Choice:
        if index not in self.choices:
            self.choices[index] = Choice(index, self.options, self.in_reasoning)
        return self.choices[index]

    @property
    def done(self) -> bool:
        finished = sum(1 for c in self.choices.values() if c.finished is not None)
        return self.error is not None or finished >= self.n

    def feed(self, batch: list[Event]) -> list[Update]:
        out: list[Update] = []
        pending: dict[int, Update] = {}
        for event in batch:
            if self.done:
                break
            if isinstance(event, ReasoningOpen):
                self.in_reasoning = True
            elif isinstance(event, TokenEvent):
                update = self._pending(pending, event.index)
                update.tokens.append(event)
                update.choice.tokens.append(event)
                update.pieces += update.choice.push(event.text)
            elif isinstance(event, StepStats):
                self._pending(pending, event.index).step = event
            elif isinstance(event, Finished):
                update = self._pending(pending, event.index)
                del pending[event.index]
                update.finished = event
                update.rest = update.choice.finish(event)
                out.append(update)
            elif isinstance(event, ErrorEvent):
                self.error = event
        return out + [pending[i] for i in sorted(pending)]

    def _pending(self, pending: dict[int, Update], index: int) -> Update:
        update = pending.get(index)
        if update is None:
            update = pending[index] = Update(self.choice(index))
        return update


class Writer(Protocol):
    """A dialect's shape of a reply: its stream (`media_type`; `opening`, an `update` per
    choice and batch, `closing` or `failure`), its whole body, its errors."""

    media_type: str

    def opening(self) -> list[bytes]: ...

    def update(self, update: Update) -> list[bytes]: ...

    def closing(self, reply: Reply) -> list[bytes]: ...

    def failure(self, error: ErrorEvent) -> list[bytes]: ...

    def whole(self, reply: Reply) -> dict[str, Any]: ...

    def error(self, error: ErrorEvent) -> Response: ...


async def lease_for(state: ServerState, request: Request, asked: str | None,
                    ttl_s: Any = KEEP) -> Lease:
    """The router's lease on the model a request names: at once when it is resident, else
    loaded just in time (off the event loop: a load blocks its thread); `ttl_s` sets its
    idle TTL (`router.KEEP`: as is).
    The lease is released when the response has been sent (`ReleaseLeasesMiddleware`)."""
    lease = state.router.acquire_resident(asked, ttl_s=ttl_s)
    if lease is None:
        lease = await anyio.to_thread.run_sync(partial(state.router.acquire, asked, ttl_s=ttl_s))
    request.scope.setdefault("state", {}).setdefault(LEASES, []).append(lease)
    return lease


SMALL_BODY = 4096  # bytes: a body this small is read on the event loop (`prepared`)


async def prepared(state: ServerState, request: Request, make: Callable[[], _T]) -> _T:
    """`make()` — a dialect's body made into the engine's request: the tools' grammar, a
    schema's check, images decoded — on the event loop when the body is small (its checks
    take less than a thread hop), else on a worker thread (a big schema or grammar takes a
    while to check, an image to decode). Never on the loop where an image URL may be
    fetched (`--allow-remote-images`): that waits on the network."""
    size = request.headers.get("content-length", "")
    if (size.isdigit() and int(size) <= SMALL_BODY
            and not state.limits.allow_remote_images):
        return make()
    return await anyio.to_thread.run_sync(make)


async def answer(request: Request, lease: Lease, generation: GenerationRequest,
                 options: ReplyOptions | None, writer: Writer, *, stream: bool,
                 poll_s: float = 0.2) -> Response:
    """Submit `generation` to the leased model's engine and answer in `writer`'s shape."""
    reply = Reply(options, generation.n)
    bridge = await _submit(lease, generation, poll_s)
    if stream:
        return _Streamed(bridge, reply, writer)
    try:
        await _collect(bridge, request, reply)
    finally:
        bridge.close()
    if reply.error is not None:
        return writer.error(reply.error)
    return JSONResponse(writer.whole(reply))


async def collected(request: Request, lease: Lease, generation: GenerationRequest,
                    poll_s: float = 0.2) -> Reply:
    """The whole reply to `generation` (its `error` set when it failed): for a route that
    needs the reply's facts, not its text (Anthropic's count_tokens)."""
    reply = Reply(None, generation.n)
    bridge = await _submit(lease, generation, poll_s)
    try:
        await _collect(bridge, request, reply)
    finally:
        bridge.close()
    return reply


async def _submit(lease: Lease, generation: GenerationRequest, poll_s: float) -> EventBridge:
    """The request submitted — the first call to its engine — and its events on their way."""
    handle = await anyio.to_thread.run_sync(lease.engine.submit, generation)
    bridge = EventBridge(handle, generation.n, poll_s)
    bridge.start()
    return bridge


class _Streamed(DisconnectAwareStreamingResponse):
    """A streamed answer, running as soon as its request is submitted; its status waits for
    the reply's first events past the admission: an error before any token (the prompt
    overflows the context) is the dialect's error with its status — no byte has gone out —
    else the stream. So the way from the route to the socket is taken while the engine
    prepares and decodes, and the first token only has to be written. The client leaving
    at any point cancels the request (`DisconnectAwareStreamingResponse`)."""

    def __init__(self, bridge: EventBridge, reply: Reply, writer: Writer) -> None:
        super().__init__(iter(()), media_type=writer.media_type, headers=SSE_HEADERS,
                         on_close=bridge.close)
        self.bridge, self.reply, self.writer = bridge, reply, writer

    async def stream_response(self, send: Send) -> None:
        bridge, reply = self.bridge, self.reply
        updates: list[Update] = []
        while True:  # up to the first event past the admission (`ReasoningOpen` first)
            batch = await bridge.next_batch()
            updates += reply.feed(batch)
            if not batch or any(not isinstance(event, ReasoningOpen) for event in batch):
                break
        if reply.error is not None and not updates:
            error = self.writer.error(reply.error)
            await send({"type": "http.response.start", "status": error.status_code,
                        "headers": error.raw_headers})
            await send({"type": "http.response.body", "body": error.body})
            return
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        async for chunk in _stream(bridge, reply, self.writer, updates):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _next_or_disconnect(bridge: EventBridge, request: Request) -> list[Event]:
    """The next batch; if the client leaves meanwhile, the request is cancelled."""
    batch: list[Event] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            await wait_for_disconnect(request.receive)
            bridge.close()

        group.start_soon(watch)
        batch = await bridge.next_batch()
        group.cancel_scope.cancel()
    return batch


async def _collect(bridge: EventBridge, request: Request, reply: Reply) -> None:
    while not reply.done and not bridge.done:
        reply.feed(await _next_or_disconnect(bridge, request))


async def _stream(bridge: EventBridge, reply: Reply, writer: Writer,
                  first: list[Update]) -> AsyncIterator[bytes]:
    try:
        for chunk in writer.opening():
            yield chunk
        updates = first
        while True:
            for update in updates:
                for chunk in writer.update(update):
                    yield chunk
            if reply.error is not None:
                for chunk in writer.failure(reply.error):
                    yield chunk
                return
            if reply.done:
                break
            batch = await bridge.next_batch()
            if not batch:
                break
            updates = reply.feed(batch)
        for chunk in writer.closing(reply):
            yield chunk
    finally:
        bridge.close()


# -- what every dialect's reply carries of Outrider's own ---------------------------------------

def usage_json(finished: list[Finished]) -> dict[str, Any]:
    """OpenAI usage for all choices: the prompt counts once (the first's), completions add up."""
    if not finished:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                "prompt_tokens_details": {"cached_tokens": 0}}
    first = min(finished, key=lambda f: f.index).usage
    completion = sum(f.usage.completion_tokens for f in finished)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}


def finish_json(done: Finished) -> dict[str, Any]:
    """The `outrider` object of a reply's end, in every dialect. Its usage also says how many
    prompt tokens middle truncation dropped (never silently) and how many of the cached ones
    were read back from a saved KV cache (`timings.restore_s` says how long that took)."""
    usage = usage_json([done])
    usage["truncated_tokens"] = getattr(done.usage, "truncated_tokens", 0)
    usage["resumed_tokens"] = getattr(done.usage, "resumed_tokens", 0)
    return {"timings": to_jsonable(done.timings), "usage": usage,
            "speculative": to_jsonable(done.speculative)}
