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
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from runtime.chat.reply import starts_in_reasoning
from runtime.chat.tool_grammar import call_markers
from runtime.engine.api import LoadedModel
from runtime.events import ErrorEvent, Event, GenerationRequest
from runtime.server.chat_reply import ReplyOptions
from runtime.server.completion import ChunkWriter, ResponseCollector
from runtime.server.error_responses import error_response, response_for_event
from runtime.server.openai_schema import ChatCompletionRequest, CompletionRequest
from runtime.server.sse import SSE_DONE, EventBridge, sse_data, sse_response, wait_for_disconnect
from runtime.server.state import ServerState


def openai_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    def list_models() -> dict[str, Any]:
        model = state.engine.status().model
        data = [] if model is None else [model_card(model)]
        return {"object": "list", "data": data}

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _generate(state, body, request, chat=True)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _generate(state, body, request, chat=False)

    return router


def model_card(model: LoadedModel) -> dict[str, Any]:
    return {"id": model.name, "object": "model", "created": 0, "owned_by": "outrider",
            "outrider": {"architecture": model.architecture, "quant": model.quant,
                         "n_ctx": model.n_ctx, "n_params": model.n_params,
                         "draft": model.draft, "chat_family": model.chat_family,
                         "capabilities": list(model.capabilities)}}


def _check_model_name(asked: str | None, model: LoadedModel) -> Response | None:
    if asked is None or asked in (model.name, model.path.name, str(model.path)):
        return None
    return error_response(404, f"model {asked!r} is not loaded; this server has {model.name!r}",
                          code="model_not_found", param="model")


async def _generate(state: ServerState, body: ChatCompletionRequest | CompletionRequest,
                    request: Request, *, chat: bool) -> Response:
    model = await anyio.to_thread.run_sync(state.loaded_model)
    wrong_model = _check_model_name(body.model, model)
    if wrong_model is not None:
        return wrong_model
    # Off the event loop: checking a big schema or tool grammar takes a while.
    generation, reply = await anyio.to_thread.run_sync(partial(read_request, state, body, model))
    started = await submit(state, generation, request)
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


async def submit(state: ServerState, generation: GenerationRequest,
                 request: Request) -> tuple[EventBridge, list[Event]] | Response:
    """Submit and wait for the first batch of events: an error there is the response (a
    status, as no byte has been sent yet), else the running bridge and that batch. Every
    dialect starts its generations here."""
    handle = await anyio.to_thread.run_sync(state.engine.submit, generation)
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
          model: LoadedModel) -> tuple[GenerationRequest, ReplyOptions | None]:
    """The engine's request, and how its chat replies are read (None: all content)."""
    if isinstance(body, CompletionRequest):
        return body.to_generation(state.limits, n_ctx=model.n_ctx, n_vocab=model.n_vocab), None
    engine = state.engine
    family = engine.template_family()
    in_reasoning = False
    if family.reasoning != "none":
        prompt = engine.render_chat(body.chat_messages(), tools=body.tools_json(),
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
