"""OpenAI's routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions` (embeddings in
`runtime.server.dialects.openai.embeddings`).

A body is read into an `Ask` (`schema`), made into the engine's request against the leased
model, and answered by `runtime.server.generation.answer` in OpenAI's shape (`writer`): the
response status is decided by the first batch of events, so a prompt that overflows the
context is a 400 even when the client asked for a stream, because no byte has been sent yet.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import Response

from runtime.server.dialects.openai.schema import ChatCompletionRequest, CompletionRequest
from runtime.server.dialects.openai.writer import OpenAIWriter
from runtime.server.generation import answer, lease_for, prepared
from runtime.server.models.names import NamedModel
from runtime.server.models.router import KEEP
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
        """A chat, rendered with the model's template; tools, thinking, structured output."""
        return await _complete(state, body, request)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """A raw prompt (text or token ids), continued as it is: no template."""
        return await _complete(state, body, request)

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


async def _complete(state: ServerState, body: ChatCompletionRequest | CompletionRequest,
                    request: Request) -> Response:
    lease = await lease_for(state, request, body.model, KEEP if body.ttl is None else body.ttl)
    chat = isinstance(body, ChatCompletionRequest)
    ask = (partial(body.ask, state.limits) if isinstance(body, ChatCompletionRequest)
           else partial(body.ask, state.limits, lease.model.n_vocab))
    # Off the event loop: checking a big schema or tool grammar takes a while.
    generation, reply = await prepared(
        state, request, lambda: ask().generation(lease.model, state.limits))
    writer = OpenAIWriter(chat=chat, model=lease.model.name, include_usage=body.include_usage,
                          logprobs=generation.logprobs is not None)
    return await answer(request, lease, generation, reply, writer, stream=body.stream,
                        poll_s=state.limits.poll_interval_s)
