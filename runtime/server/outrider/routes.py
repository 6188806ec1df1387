"""Outrider's own routes under `/api/`: load and unload a model, status, metrics.

`POST /api/load` answers a stream: `plan`, `progress` (0..1) events, then `loaded` or `error`.
The load runs in its own thread and holds the server's exclusive lock until llama.cpp is done,
even when the client leaves early, so two loads never overlap.

A file that cannot load is a plain 4xx, never a 200 stream that ends in `error`: the route runs
the preflight and asks the verdict store (a known llama.cpp crash) before it starts, then holds
the response until the load is past its own checks — the engine's probe child and llama.cpp's
refusals, which come before its first progress report — and answers an error there as a
status too. Only what fails later (rare: a context that cannot be allocated) arrives as an
SSE `error` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Body

from runtime.engine.api import LoadedModel
from runtime.errors import ModelNotFound, OutriderError, SettingsError, shown
from runtime.gguf.preflight import check_gguf
from runtime.gguf.verdicts import VerdictStore
from runtime.library.projectors import with_projector
from runtime.server.errors import response_for_event, status_for
from runtime.server.jsonable import to_jsonable
from runtime.server.models.router import plan_for
from runtime.server.outrider.metrics import metrics_snapshot
from runtime.server.sse import sse_event, sse_response
from runtime.server.state import ServerState
from runtime.settings.load import LoadSettings

log = logging.getLogger(__name__)

def model_json(model: LoadedModel) -> dict[str, Any]:
    data = to_jsonable(model)
    data["settings"] = to_jsonable(model.settings.to_dict())
    del data["family"], data["call_tokens"]  # how the server reads replies: its own business
    data["chat_family"] = model.chat_family
    return dict(data)


# Not Ollama's: its routes share the /api/ prefix (runtime.server.dialects.ollama).
OUTRIDER_PATHS = frozenset({"/api/load", "/api/unload", "/api/status", "/api/metrics",
                            "/api/metrics/stream"})


def api_router(state: ServerState) -> APIRouter:
    router = APIRouter(prefix="/api")

    @router.post("/load")
    async def load(body: Any = Body(default=None)) -> Any:  # noqa: B008 - FastAPI's idiom
        settings = LoadSettings.from_dict(body)
        settings = dataclasses.replace(settings, model_path=state.confine(settings.model_path))
        if settings.mmproj_path is not None:
            settings = dataclasses.replace(settings,
                                           mmproj_path=state.confine(settings.mmproj_path))
        settings = with_projector(settings, [state.models_dir])  # a library pair's projector
        if settings.draft.model_path is not None:
            draft = dataclasses.replace(settings.draft,
                                        model_path=state.confine(settings.draft.model_path))
            settings = dataclasses.replace(settings, draft=draft)
        for path in (settings.model_path, settings.draft.model_path, settings.mmproj_path):
            if path is not None and not path.is_file():  # inside the library: may look
                raise ModelNotFound(f"no model file at {shown(path)}")
        await anyio.to_thread.run_sync(_refuse_bad_files, settings)
        state.begin_exclusive("load")
        try:
            events = _load_events(state, settings)
        except BaseException:
            state.end_exclusive()
            raise
        head = await _until_started(events)
        name, data = head[-1]
        if name == "error":
            return response_for_event(data["kind"], data["message"])
        return sse_response(_encoded(head, events))

    @router.post("/unload")
    def unload(body: Any = Body(default=None)) -> dict[str, bool]:  # noqa: B008
        asked = body.get("model") if isinstance(body, dict) else None
        if body not in (None, {}) and not (isinstance(body, dict) and set(body) == {"model"}
                                           and isinstance(asked, str)):
            raise SettingsError('unload takes {} (the default model) or {"model": NAME}')
        state.begin_exclusive("unload")
        try:
            state.router.unload(asked)
        finally:
            state.end_exclusive()
        return {"unloaded": True}

    @router.get("/status")
    def status() -> dict[str, Any]:
        engine_status = state.engine.status()
        model = engine_status.model
        return {"state": "loading" if state.loading else engine_status.state,
                "model": None if model is None else model_json(model),
                "settings": None if model is None else to_jsonable(model.settings.to_dict()),
                "plan": state.plan if model is not None else None,
                "active_sequences": engine_status.active_sequences,
                "waiting_sequences": engine_status.waiting_sequences,
                "kv_cells_used": engine_status.kv_cells_used,
                "kv_cells_total": engine_status.kv_cells_total,
                "resident": state.router.resident()}

    @router.get("/metrics")
    def metrics() -> dict[str, Any]:
        return metrics_snapshot(state.engine, state.plan)

    @router.get("/metrics/stream")
    async def metrics_stream() -> Any:
        async def body() -> AsyncIterator[bytes]:
            while True:
                snapshot = await anyio.to_thread.run_sync(metrics_snapshot, state.engine,
                                                          state.plan)
                yield sse_event("metrics", snapshot)
                await anyio.sleep(state.limits.metrics_interval_s)

        return sse_response(body())

    return router


def _refuse_bad_files(settings: LoadSettings) -> None:
    """The preflight's typed error (400 `invalid_model_file`), or `LoadCrashed` for a file
    llama.cpp is known to crash on. The model only: a bad draft model turns drafting off
    (the loaded model's `draft_refused` says why), it does not refuse the load."""
    check_gguf(settings.model_path)
    VerdictStore().refuse_known_crash(settings.model_path)


async def _until_started(events: AsyncIterator[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The events up to and including the first one past the plan: the first progress
    report, or the outcome."""
    head: list[tuple[str, Any]] = []
    async for name, data in events:
        head.append((name, data))
        if name != "plan":
            break
    return head


async def _encoded(head: list[tuple[str, Any]],
                   rest: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[bytes]:
    for name, data in head:
        yield sse_event(name, data)
    if head[-1][0] in ("loaded", "error"):
        return
    async for name, data in rest:
        yield sse_event(name, data)


def _load_events(state: ServerState, settings: LoadSettings) -> AsyncIterator[tuple[str, Any]]:
    """Start the load thread now; the returned iterator reports on it, (name, data) per
    event, ending with `loaded` or `error`. The thread releases the exclusive lock when
    llama.cpp is done, whatever the client does."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(name: str, data: Any) -> None:
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(queue.put_nowait, (name, data))

    def run() -> None:
        outcome: tuple[str, Any] = ("error", {"kind": "LoadError", "message": "the load stopped"})
        try:
            if settings.workers:
                state.router.release_workers(settings.workers)
            plan = plan_for(settings)
            put("plan", plan)
            model = state.router.load_primary(
                settings, plan, on_progress=lambda f: put("progress", {"fraction": f}))
            outcome = ("loaded", {"model": model_json(model), "plan": plan,
                                  "measured": to_jsonable(model.allocated)})
        except OutriderError as exc:
            outcome = ("error", {"kind": type(exc).__name__, "message": str(exc),
                                 "code": status_for(type(exc))[1]})
        except Exception as exc:  # llama.cpp or engine bug: report it, keep serving
            log.exception("loading %s failed", settings.model_path)
            outcome = ("error", {"kind": type(exc).__name__, "message": f"internal error: {exc}"})
        finally:
            # Released before the last event: a client sends its first request the moment it
            # reads "loaded", and must not find the server still "loading" (a 503).
            state.end_exclusive()
            put(*outcome)

    threading.Thread(target=run, name="outrider-load", daemon=True).start()

    async def events() -> AsyncIterator[tuple[str, Any]]:
        while True:
            name, data = await queue.get()
            yield name, data
            if name in ("loaded", "error"):
                return

    return events()
