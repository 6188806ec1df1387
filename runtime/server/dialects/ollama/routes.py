"""Ollama's API on the same server: `/api/version`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/chat`, `/api/generate`, `/api/embed` and the older `/api/embeddings` (over
`EngineAPI.embed`, as `/v1/embeddings`), `/api/pull` (`runtime.server.ollama_pull`).

Chat and generate are read into the engine's request (`schema`) and answered by
`runtime.server.generation.answer`, so sampling, `format` (a JSON object or schema, by
constrained decoding), tools and thinking behave as for every other client. Replies stream as NDJSON by default (`"stream": false`: one object):

    {"model": "m", "created_at": "…", "message": {"role": "assistant", "content": "Hel"}, "done": false}
    {"model": "m", "created_at": "…", "message": {"role": "assistant", "thinking": "…"}, "done": false}
    {"model": "m", "created_at": "…", "message": {"role": "assistant", "content": "",
     "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}, "done": false}
    {"model": "m", "created_at": "…", "message": {"role": "assistant", "content": ""},
     "done": true, "done_reason": "stop", "total_duration": 1234567, "load_duration": 0,
     "prompt_eval_count": 12, "prompt_eval_duration": …, "eval_count": 8, "eval_duration": …,
     "outrider": {"timings": …, "usage": …, "speculative": …}}

Durations are nanoseconds, from the engine's timings (prompt evaluation = time to the first
token). A chat without messages, or a generate with an empty prompt, answers at once with
`done_reason: "load"`, as Ollama does to preload a model. Errors are `{"error": "..."}` with
the status (`error_json`); inside a stream, an `{"error": ...}` line.
Outrider's own `/api/load`, `/api/unload`, `/api/status`, `/api/metrics` keep their names:
Ollama has none of them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from runtime import __version__
from runtime.chat.families import capabilities, detect_family
from runtime.engine.api import LoadedModel
from runtime.errors import (
    HubServerError,
    HubUnreachable,
    ModelNotFound,
    RemoteFileNotFound,
    RepoNotFound,
    shown,
)
from runtime.events import ErrorEvent, Finished, ToolCall
from runtime.gguf.info import read_model_info
from runtime.server.dialects.ollama.pull import plan_pull, pull_lines
from runtime.server.dialects.ollama.schema import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaPullRequest,
    OllamaShowRequest,
    keep_alive_s,
)
from runtime.server.errors import status_for_kind
from runtime.server.generation import (
    Piece,
    Reply,
    Update,
    answer,
    arguments_object,
    finish_json,
    lease_for,
    prepared,
)
from runtime.server.logprobs import chat_logprobs
from runtime.server.models.names import NamedModel
from runtime.server.models.router import Slot
from runtime.server.sse import SSE_HEADERS, DisconnectAwareStreamingResponse
from runtime.server.state import ServerState

# The Ollama API level these routes follow (clients compare it to a minimum).
OLLAMA_API_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"


def ollama_router(state: ServerState) -> APIRouter:
    # Not in /openapi.json: that document describes OpenAI's error shape (openapi_doc).
    router = APIRouter(prefix="/api", include_in_schema=False)
    names = state.names

    @router.get("/version")
    def version() -> dict[str, str]:
        return {"version": OLLAMA_API_VERSION, "outrider": __version__}

    @router.get("/tags")
    async def tags() -> dict[str, Any]:
        listing = await anyio.to_thread.run_sync(names.listing)
        return {"models": [_tag(m) for m in listing]}

    @router.post("/show")
    async def show(body: OllamaShowRequest) -> dict[str, Any]:
        found = await anyio.to_thread.run_sync(names.find, body.asked)
        return await anyio.to_thread.run_sync(_show, found)

    @router.get("/ps")
    async def ps() -> dict[str, Any]:
        listing = await anyio.to_thread.run_sync(names.listing)
        plans = {slot.named.path.resolve(): slot for slot in state.router.slots()}
        return {"models": [_process(m, m.loaded, plans[m.path.resolve()])
                           for m in listing if m.loaded is not None
                           and m.path.resolve() in plans]}

    @router.post("/chat")
    async def chat(body: OllamaChatRequest, request: Request) -> Response:
        return await _answer(state, request, body)

    @router.post("/generate")
    async def generate(body: OllamaGenerateRequest, request: Request) -> Response:
        return await _answer(state, request, body)

    @router.post("/embed")
    async def embed(body: OllamaEmbedRequest, request: Request) -> dict[str, Any]:
        lease = await lease_for(state, request, body.model, keep_alive_s(body.keep_alive))
        inputs = body.inputs
        started = time.monotonic()
        result = await anyio.to_thread.run_sync(lease.engine.embed, inputs)
        return {"model": body.model,
                "embeddings": [[float(x) for x in v] for v in result.vectors],
                "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
                "prompt_eval_count": result.prompt_tokens}

    @router.post("/embeddings")
    async def embeddings(body: OllamaEmbeddingsRequest, request: Request) -> dict[str, Any]:
        lease = await lease_for(state, request, body.model, keep_alive_s(body.keep_alive))
        result = await anyio.to_thread.run_sync(lease.engine.embed, [body.prompt])
        return {"embedding": [float(x) for x in result.vectors[0]]}

    @router.post("/pull")
    async def pull(body: OllamaPullRequest) -> Response:
        try:
            plan = await anyio.to_thread.run_sync(plan_pull, body.asked, state.models_dir)
        except (RepoNotFound, RemoteFileNotFound) as exc:
            raise ModelNotFound(str(exc)) from None
        except (HubUnreachable, HubServerError) as exc:
            return JSONResponse(error_json(str(exc)), status_code=502)
        if body.stream:
            return DisconnectAwareStreamingResponse(_ndjson(pull_lines(plan)), media_type=NDJSON,
                                                    headers=SSE_HEADERS)
        last: dict[str, Any] = {}
        async for line in pull_lines(plan):
            last = line
        if "error" in last:
            return JSONResponse(error_json(last["error"]), status_code=500)
        return JSONResponse(last)

    return router


# --- models ---------------------------------------------------------------------------------

def _iso(timestamp: float | None = None) -> str:
    moment = datetime.now(UTC) if timestamp is None else datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _parameter_size(n_params: int | None) -> str:
    """    >>> _parameter_size(134_515_008), _parameter_size(7_615_616_512)
    ('134.52M', '7.6B')
    """
    if not n_params:
        return ""
    return f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.2f}M"


@dataclass(frozen=True)
class _Facts:
    """What /api/tags, /api/show and /api/ps say of a listed model."""

    size: int
    mtime: float
    architecture: str
    quant: str
    n_params: int | None
    digest: str  # a stable id of the file as it is (path, size, time): not its sha256,
    # which would mean reading gigabytes

    @classmethod
    def of(cls, m: NamedModel) -> _Facts:
        lib, loaded = m.library, m.loaded
        info = (lib.info or {}) if lib is not None else {}
        size = lib.size if lib is not None else (loaded.size_bytes if loaded is not None else 0)
        try:
            mtime = lib.mtime if lib is not None else m.path.stat().st_mtime
        except OSError:
            mtime = 0.0
        arch = str(info.get("architecture") or (loaded.architecture if loaded else "") or "")
        quant = str(info.get("quant") or (loaded.quant if loaded else "") or "")
        n_params = info.get("n_params") or (loaded.n_params if loaded else None)
        digest = hashlib.sha256(f"{m.path}|{size}|{mtime}".encode()).hexdigest()
        return cls(size, mtime, arch, quant, n_params, digest)

    def details(self) -> dict[str, Any]:
        arch = self.architecture
        return {"parent_model": "", "format": "gguf", "family": arch,
                "families": [arch] if arch else [],
                "parameter_size": _parameter_size(self.n_params),
                "quantization_level": self.quant}


def _tag(m: NamedModel) -> dict[str, Any]:
    facts = _Facts.of(m)
    return {"name": m.name, "model": m.name, "modified_at": _iso(facts.mtime),
            "size": facts.size, "digest": facts.digest, "details": facts.details()}


# Outrider's capability names → Ollama's ("completion": it writes; "embedding": it embeds).
_CAPABILITIES = {"chat": "completion", "tools": "tools", "reasoning": "thinking",
                 "embeddings": "embedding"}


def _show(m: NamedModel) -> dict[str, Any]:
    facts = _Facts.of(m)
    info = read_model_info(m.path)
    caps = (m.loaded.capabilities if m.loaded is not None
            else capabilities(detect_family(info.chat_template)))
    arch = info.architecture
    model_info: dict[str, Any] = {"general.architecture": arch, "general.name": info.name,
                                  "general.parameter_count": info.n_params,
                                  "general.file_type": info.file_type,
                                  f"{arch}.context_length": info.n_ctx_train,
                                  f"{arch}.block_count": info.block_count,
                                  f"{arch}.embedding_length": info.n_embd}
    return {"license": "", "modelfile": f"# served by Outrider as it is\nFROM {m.path}\n",
            "parameters": "" if m.loaded is None else f"num_ctx {m.loaded.n_ctx}",
            "template": info.chat_template or "", "details": facts.details(),
            "model_info": model_info, "modified_at": _iso(facts.mtime),
            "capabilities": [_CAPABILITIES[c] for c in caps if c in _CAPABILITIES]}


def _process(m: NamedModel, loaded: LoadedModel, slot: Slot) -> dict[str, Any]:
    """The resident model with its memory: the plan's total and its GPU share (else the file's
    size, all in RAM), and when its idle TTL unloads it (none: `expires_at` null)."""
    facts = _Facts.of(m)
    total, vram, plan = loaded.size_bytes, 0, slot.plan
    if isinstance(plan, dict):
        devices = plan.get("devices")
        total = int(plan.get("total") or total)
        vram = sum(int(d.get("total") or 0) for d in devices if isinstance(d, dict)
                   and d.get("kind") != "cpu") if isinstance(devices, list) else 0
    expires = None
    if slot.ttl_s is not None:
        expires = _iso(time.time() + max(0.0, slot.ttl_s - (time.monotonic() - slot.last_used)))
    return {"name": m.name, "model": m.name, "size": total, "size_vram": vram,
            "digest": facts.digest, "details": facts.details(), "expires_at": expires,
            "context_length": loaded.n_ctx}


# --- chat and generate ----------------------------------------------------------------------

def _loaded(model: str, *, chat: bool, stream: bool) -> Response:
    """Ollama's answer to a request without a prompt: the model is loaded (it is)."""
    reply: dict[str, Any] = {"model": model, "created_at": _iso()}
    reply.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    reply.update(done=True, done_reason="load")
    if stream:
        return Response((json.dumps(reply) + "\n").encode(), media_type=NDJSON)
    return JSONResponse(reply)


def _stats(done: Finished | None) -> dict[str, Any]:
    if done is None:
        return {}
    timings, usage = done.timings, done.usage

    def ns(seconds: float) -> int:
        return int(max(seconds, 0.0) * 1e9)

    return {"total_duration": ns(timings.total_s), "load_duration": 0,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": ns(timings.ttft_s),
            "eval_count": usage.completion_tokens,
            "eval_duration": ns(timings.total_s - timings.ttft_s),
            "outrider": finish_json(done)}


def error_json(message: str) -> dict[str, Any]:
    """Ollama's error body: `{"error": "one line"}`."""
    return {"error": shown(message)}


def _call_json(call: ToolCall) -> dict[str, Any]:
    return {"function": {"name": call.name, "arguments": arguments_object(call.arguments)}}


class OllamaWriter:
    """A reply as Ollama's JSON: an object per batch of pieces (NDJSON), the last object
    with the stats, or the whole reply as one."""

    media_type = NDJSON

    def __init__(self, model: str, *, chat: bool, logprobs: bool = False) -> None:
        self.model = model
        self.chat = chat
        self.logprobs = logprobs
        self._sent = 0  # tokens whose logprobs went out

    def _object(self, pieces: list[Piece], update: Update | None, reply: Reply | None
                ) -> dict[str, Any]:
        content = "".join(p.text for p in pieces if p.kind == "content")
        thinking = "".join(p.text for p in pieces if p.kind == "reasoning")
        calls = [_call_json(p.call) for p in pieces if p.call is not None]
        out: dict[str, Any] = {"model": self.model, "created_at": _iso()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        choice = update.choice if update is not None else reply.choice(0) if reply else None
        if self.logprobs and choice is not None:  # the tokens since the last object
            out["logprobs"] = chat_logprobs(choice.tokens[self._sent:])["content"]
            self._sent = len(choice.tokens)
        out["done"] = reply is not None
        if reply is not None:
            done = reply.choice(0)
            out["done_reason"] = "length" if done.reason == "length" else "stop"
            out.update(_stats(done.finished))
        return out

    def opening(self) -> list[bytes]:
        return []

    def update(self, update: Update) -> list[bytes]:
        pieces = update.pieces + update.rest
        return [_line(self._object(pieces, update, None))] if pieces else []

    def closing(self, reply: Reply) -> list[bytes]:
        return [_line(self._object([], None, reply))] if reply.done else []

    def failure(self, error: ErrorEvent) -> list[bytes]:
        return [_line(error_json(error.message))]

    def whole(self, reply: Reply) -> dict[str, Any]:
        return self._object(reply.choice(0).pieces, None, reply)

    def error(self, error: ErrorEvent) -> Response:
        return JSONResponse(error_json(_message(error)), status_code=status_for_kind(error.kind)[0])


def _message(error: ErrorEvent) -> str:
    status, _ = status_for_kind(error.kind)
    return error.message if status < 500 else f"internal error: {error.kind}: {error.message}"


def _line(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


async def _answer(state: ServerState, request: Request,
                  body: OllamaChatRequest | OllamaGenerateRequest) -> Response:
    lease = await lease_for(state, request, body.model, keep_alive_s(body.keep_alive))
    chat = isinstance(body, OllamaChatRequest)
    if not (body.messages if isinstance(body, OllamaChatRequest) else body.prompt):
        return _loaded(body.model, chat=chat, stream=body.stream)
    ask = partial(body.ask, state.limits, lease.model.n_ctx)
    generation, reply = await prepared(
        state, request, lambda: ask().generation(lease.model, state.limits))
    writer = OllamaWriter(body.model, chat=chat, logprobs=generation.logprobs is not None)
    return await answer(request, lease, generation, reply, writer, stream=body.stream,
                        poll_s=state.limits.poll_interval_s)


async def _ndjson(lines: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for line in lines:
        yield _line(line)
