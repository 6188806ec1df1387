"""The FastAPI application: routes, middlewares and error handlers around one engine.

    engine = Engine(); engine.start()
    app = create_app(engine, api_key="secret", models_dir=user_dirs().models,
                     limits=ServerLimits())
    uvicorn.run(app, host="127.0.0.1", port=1234)

Every error leaves in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`), or
on another dialect's routes in that dialect's (`runtime.server.errors.ErrorShapes`), always
with a `code`: validation failures are 400 (not FastAPI's 422), a body that cannot be
read as JSON a 400 saying why (`unreadable_body`), `OutriderError`s get the status
`errors.status_for` assigns, and anything unexpected a 500 that names it.
`/openapi.json` says so too (`runtime.server.openapi_doc`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from runtime import __version__
from runtime.engine.api import EngineAPI
from runtime.errors import OutriderError
from runtime.server.dialects.anthropic import routes as anthropic
from runtime.server.dialects.ollama import routes as ollama
from runtime.server.dialects.openai.embeddings import embeddings_router
from runtime.server.dialects.openai.routes import openai_router
from runtime.server.dialects.responses.routes import responses_router
from runtime.server.errors import ErrorShapes
from runtime.server.middleware import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    BrowserGuardMiddleware,
    JsonBodyMiddleware,
    ReleaseLeasesMiddleware,
)
from runtime.server.models.names import ModelNames
from runtime.server.models.router import ModelRouter, RouterOptions
from runtime.server.openapi_doc import install_openapi
from runtime.server.outrider.routes import OUTRIDER_PATHS, api_router
from runtime.server.outrider.tokenize import tokenize_router
from runtime.server.state import ServerLimits, ServerState
from runtime.settings.load import LoadSettings

# Ollama's routes are under /api/ (no name of Outrider's own taken); Anthropic's under
# /v1/messages. Their errors leave in their own shape.
SHAPES = ErrorShapes((
    (lambda path: path.startswith("/api/") and path not in OUTRIDER_PATHS,
     lambda status, message: ollama.error_json(message)),
    (lambda path: path == "/v1/messages" or path.startswith("/v1/messages/"),
     anthropic.error_json),
))

log = logging.getLogger(__name__)


def _is_union_tag(part: Any) -> bool:
    """pydantic names the union member it tried in `loc`: "str", "list[int]", "function-..."."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "list", "dict"}
                                      or "[" in part or part.startswith("function-"))


# The `code`s of HTTP errors Starlette raises itself (routing) rather than a route.
_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}


def unreadable_body(cause: BaseException) -> tuple[str, str]:
    """Message and `code` for a body `json.loads` could not read (FastAPI turns these into a
    bare 400 "There was an error parsing the body", the error as its `__cause__`).

    >>> unreadable_body(RecursionError("maximum recursion depth exceeded"))
    ('the request body nests arrays or objects too deeply', 'nesting_too_deep')
    """
    if isinstance(cause, UnicodeDecodeError):  # before ValueError: it is one
        return "the request body is not UTF-8 text", "invalid_encoding"
    if isinstance(cause, RecursionError):
        return "the request body nests arrays or objects too deeply", "nesting_too_deep"
    if isinstance(cause, ValueError) and "digits" in str(cause):  # int_max_str_digits
        return (f"a number in the request body has more than {sys.get_int_max_str_digits()} "
                "digits", "number_too_large")
    return "the request body is not valid JSON", "invalid_json"


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None, str]:
    """A one-line message, the offending parameter and the `code`, from pydantic's errors.

    >>> validation_message([{"type": "int_type", "loc": ("body", "max_tokens"),
    ...                      "msg": "Input should be a valid integer"}])
    ('max_tokens: Input should be a valid integer', 'max_tokens', 'invalid_value')
    """
    if not errors:
        return "invalid request", None, "invalid_value"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None, "invalid_json"
    if len(first.get("loc", ())) <= 1:
        if first.get("type") == "missing":
            return "the request body is missing", None, "invalid_json"
        return "the request body must be a JSON object", None, "invalid_value"
    # A union field fails once per member ("str", "list[int]", ...): the deepest failure is
    # the one that says what is wrong.
    top = first.get("loc", ())[:2]
    first = max((e for e in errors if e.get("loc", ())[:2] == top),
                key=lambda e: len(e.get("loc", ())))
    parts = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_union_tag(p)]
    where = ".".join(parts)
    message = f"{where}: {first.get('msg', 'invalid value')}" if where else str(first.get("msg"))
    return message, where or None, "invalid_value"


def create_app(engine: EngineAPI, *, api_key: str | None, models_dir: Path,
               cors_origins: Sequence[str] = (), limits: ServerLimits,
               allowed_models: Iterable[Path] = (), allow_any_path: bool = False,
               local_only: bool = False,
               make_engine: Callable[[], EngineAPI] | None = None,
               settings_for: Callable[[Path], LoadSettings] | None = None,
               router_options: RouterOptions | None = None) -> FastAPI:
    """The server for `engine` (the primary: the start-up model's, what /api/load loads).
    With `make_engine`, a request naming another library model loads it just in time in an
    engine of its own, with `settings_for(path)` (`runtime.server.models.router`); without, the
    server holds the primary's one model. `allowed_models` may be loaded from outside
    `models_dir` (the model the server was started with); `allow_any_path` lifts the
    confinement. `local_only` (a loopback-bound server) refuses Host headers that are not
    loopback."""
    models_dir = models_dir.expanduser().resolve()
    names: list[ModelNames] = []
    router = ModelRouter(engine, find=lambda asked: names[0].find_in_library(asked),
                         make_engine=make_engine, settings_for=settings_for,
                         options=router_options)
    names.append(ModelNames(models_dir, router.named))
    state = ServerState.create(router, api_key=api_key, models_dir=models_dir, limits=limits,
                               allowed_models=allowed_models, allow_any_path=allow_any_path)
    app = FastAPI(title="Outrider", version=__version__,
                  description="OpenAI-compatible local server (see docs/api.md)")
    app.state.outrider = state

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(openai_router(state))
    app.include_router(embeddings_router(state))
    app.include_router(tokenize_router(state))
    app.include_router(responses_router(state))
    app.include_router(api_router(state))
    app.include_router(ollama.ollama_router(state))
    app.include_router(anthropic.anthropic_router(state))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = validation_message(exc.errors())
        return SHAPES.response(request.url.path, 400, message, code=code, param=param)

    @app.exception_handler(OutriderError)
    async def on_outrider_error(request: Request, exc: OutriderError) -> JSONResponse:
        return SHAPES.for_exception(request.url.path, exc)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        if exc.status_code == 400 and exc.__cause__ is not None:
            message, code = unreadable_body(exc.__cause__)
        return SHAPES.response(request.url.path, exc.status_code, message, code=code,
                               headers=dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return SHAPES.for_exception(request.url.path, exc)

    # Added innermost first: Starlette wraps each new middleware around the previous ones.
    app.add_middleware(ReleaseLeasesMiddleware)
    app.add_middleware(JsonBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes, shapes=SHAPES)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, shapes=SHAPES)
    app.add_middleware(BrowserGuardMiddleware, allowed_origins=list(cors_origins),
                       local_only=local_only, shapes=SHAPES)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key",
                                      "anthropic-version"])
    install_openapi(app, limits=limits, api_key=bool(api_key))
    return app
