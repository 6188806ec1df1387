"""The OpenAI-compatible routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

A generation is submitted to the engine, then answered either whole or as SSE. The response
status is decided by the first batch of events: a prompt that overflows the context is a 400
even when the client asked for a stream, because no byte has been sent yet.

A chat request is read against the loaded model's template family (`runtime.chat.families`):
tools need one with a call format, and the replies of a family that thinks or calls are split
into `content`, `reasoning_content` and `tool_calls` (`runtime.server.chat_reply`). Whether a
reply starts inside the thinking block depends on the rendered prompt (a template may open
`<think>` itself), so for such families the prompt is rendered here once more; a call
forced after the thinking is allowed to think first. Call markers the vocabulary holds as
special tokens are asked for as those tokens (`EngineAPI.special_tokens`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from runtime.chat.reply import starts_in_reasoning
from runtime.chat.tool_grammar import call_markers
from runtime.events import ErrorEvent, Event, GenerationRequest
from runtime.server.capability import require_generation
from runtime.server.chat_reply import ReplyOptions
from runtime.server.completion import ChunkWriter, ResponseCollector
from runtime.server.error_responses import response_for_event
from runtime.server.model_names import NamedModel
from runtime.server.openai_schema import ChatCompletionRequest, CompletionRequest
from runtime.server.router import KEEP, LEASES, Lease
from runtime.server.sse import SSE_DONE, EventBridge, sse_data, sse_response, wait_for_disconnect
from runtime.server.state import ServerState


def openai_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        listing = await anyio.to_thread.run_sync(state.names.listing)
        states = {Path(r["path"]).resolve(): r["state"] for r in state.router.resident()}
        return {"object": "list",
                "data": [model_card(m, states.get(m.path.resolve(), "on_disk"))
                         for m in listing]}

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _generate(state, body, request, chat=True)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _generate(state, body, request, chat=False)

    return router


def model_card(model: NamedModel, state: str = "ready") -> dict[str, Any]:
    """A `/v1/models` entry: the model's id, and Outrider's facts about it; `state` is
    "ready", "loading" or "on_disk" (loaded just in time when asked for)."""
    card: dict[str, Any] = {"id": model.path.stem, "object": "model", "created": 0,
                            "owned_by": "outrider"}
    loaded = model.loaded
    if loaded is None:
        info = (model.library.info or {}) if model.library is not None else {}
        card["outrider"] = {"state": state, "name": model.name, "path": str(model.path),
                            "architecture": info.get("architecture"), "quant": info.get("quant"),
                            "n_params": info.get("n_params")}
        return card
    card["outrider"] = {"state": state, "name": model.name, "path": str(loaded.path),
                        "architecture": loaded.architecture, "quant": loaded.quant,
                        "n_ctx": loaded.n_ctx, "n_params": loaded.n_params,
                        "draft": loaded.draft, "chat_family": loaded.chat_family,
                        "capabilities": list(loaded.capabilities)}
    return card


async def lease_for(state: ServerState, request: Request, asked: str | None,
                    ttl_s: Any = KEEP) -> Lease:
    """The router's lease on the model a request names, loading it just in time (off the
    event loop: a load blocks its thread); `ttl_s` sets its idle TTL (`router.KEEP`: as is).
    The lease is released when the response has been sent (`ReleaseLeasesMiddleware`)."""
    lease: Lease = await anyio.to_thread.run_sync(
        partial(state.router.acquire, asked, ttl_s=ttl_s))
    request.scope.setdefault("state", {}).setdefault(LEASES, []).append(lease)
    return lease


async def _generate(state: ServerState, body: ChatCompletionRequest | CompletionRequest,
                    request: Request, *, chat: bool) -> Response:
    lease = await lease_for(state, request, body.model, KEEP if body.ttl is None else body.ttl)
    model = lease.model
    # Off the event loop: checking a big schema or tool grammar takes a while.
    generation, reply = await anyio.to_thread.run_sync(partial(read_request, state, body, lease))
    started = await submit(state, lease, generation, request)
    if isinstance(started, Response):
        return started
    bridge, first = started
    if body.stream:
        writer = ChunkWriter(chat=chat, model=model.name, n=generation.n,
                             include_usage=body.include_usage, reply=reply,
                             logprobs=generation.logprobs is not None)
        return sse_response(_stream(bridge, writer, first), on_close=bridge.close)
    try:
        collector = ResponseCollector(chat=chat, model=model.name, n=generation.n, reply=reply,
                                      logprobs=generation.logprobs is not None)
        return await _collect(bridge, request, first, collector)
    finally:
        bridge.close()


async def submit(state: ServerState, lease: Lease, generation: GenerationRequest,
                 request: Request) -> tuple[EventBridge, list[Event]] | Response:
    """Submit to the leased model's engine and wait for the first batch of events: an error
    there is the response (a status, as no byte has been sent yet), else the running bridge
    and that batch. Every dialect starts its generations here."""
    handle = await anyio.to_thread.run_sync(lease.engine.submit, generation)
    bridge = EventBridge(handle, generation.n, state.limits.poll_interval_s)
    bridge.start()
    try:
        first = await next_or_disconnect(bridge, request)
    except BaseException:
        bridge.close()
        raise
    if first and isinstance(first[0], ErrorEvent):
        bridge.close()
        return response_for_event(first[0].kind, first[0].message)
    return bridge, first


def read_request(state: ServerState, body: ChatCompletionRequest | CompletionRequest,
                 lease: Lease) -> tuple[GenerationRequest, ReplyOptions | None]:
    """The engine's request, and how its chat replies are read (None: all content)."""
    model, engine = lease.model, lease.engine
    require_generation(model)
    if isinstance(body, CompletionRequest):
        return body.to_generation(state.limits, n_ctx=model.n_ctx, n_vocab=model.n_vocab), None
    family = engine.template_family()
    in_reasoning = False
    if family.reasoning != "none":
        prompt = engine.render_chat(body.chat_messages(state.limits.allow_remote_images),
                                    tools=body.tools_json(),
                                    extra=dict(body.template_kwargs()))
        in_reasoning = starts_in_reasoning(family, prompt)
    markers = engine.special_tokens(call_markers(family)) if body.tools and family.tools else {}
    plan = body.tool_plan(family, in_reasoning=in_reasoning, special_tokens=markers)
    generation = body.to_generation(state.limits, n_ctx=model.n_ctx, n_vocab=model.n_vocab,
                                    family=family, plan=plan)
    if family.reasoning == "none" and not plan.parse_calls:
        return generation, None
    # A schema or grammar holds the reply from its first token: no thinking comes first.
    shaped = generation.constraint is not None and generation.constraint is not plan.constraint
    return generation, ReplyOptions(family, in_reasoning and not shaped, plan.parse_calls,
                                    plan.tools)


async def next_or_disconnect(bridge: EventBridge, request: Request) -> list[Event]:
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


async def _collect(bridge: EventBridge, request: Request, first: list[Event],
                   collector: ResponseCollector) -> Response:
    collector.add(first)
    while not bridge.done:
        collector.add(await next_or_disconnect(bridge, request))
    if collector.error is not None:
        return response_for_event(collector.error.kind, collector.error.message)
    return JSONResponse(collector.response())


async def _stream(bridge: EventBridge, writer: ChunkWriter,
                  first: list[Event]) -> AsyncIterator[bytes]:
    try:
        batch = first
        while batch:
            for chunk in writer.chunks(batch):
                yield sse_data(chunk)
                if "error" in chunk:
                    yield SSE_DONE
                    return
            batch = await bridge.next_batch()
        for chunk in writer.closing_chunks():
            yield sse_data(chunk)
        yield SSE_DONE
    finally:
        bridge.close()
