"""Errors in OpenAI's JSON shape (or the shape of the dialect whose route it is), and which
HTTP status each Outrider error gets.

    >>> error_body("model 'x' is not loaded", code="model_not_found")  # doctest: +NORMALIZE_WHITESPACE
    {'error': {'message': "model 'x' is not loaded", 'type': 'invalid_request_error',
               'param': None, 'code': 'model_not_found'}}
    >>> status_for(errors.ContextOverflow)
    (400, 'context_length_exceeded')

The engine reports a request's failure as an `ErrorEvent` carrying the exception's class
name; `status_for_kind` maps that name back through the same table. Every error has a `code`
(a 4xx never says `null`), and its message is one line: characters that are not printable
(a newline in a file name, an ANSI escape in llama.cpp's log) are escaped (`errors.shown`).
`ErrorBody` is that shape as a schema, for `/openapi.json`.

An error raised before a route answers (a body that does not validate, a wrong key, a body
too large, a path nothing serves) takes the shape of the dialect that owns the path
(`ErrorShapes`, filled by `runtime.server.app` from each dialect's `owns` and `error_json`):

    Ollama (/api/… except Outrider's own)   {"error": "model 'x' not found; available: …"}
    Anthropic (/v1/messages…)               {"type": "error", "error": {"type":
                                              "invalid_request_error", "message": "…"}}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from starlette.responses import JSONResponse

from runtime import errors

# Most specific first: the first class the error is an instance of decides.
_STATUS: tuple[tuple[type[errors.OutriderError], int, str], ...] = (
    (errors.PathNotAllowed, 403, "path_not_allowed"),
    (errors.ModelNotFound, 404, "model_not_found"),
    (errors.ModelFileError, 400, "invalid_model_file"),
    (errors.ContextOverflow, 400, "context_length_exceeded"),
    (errors.WorkerError, 400, "worker_unavailable"),
    (errors.SettingsError, 400, "invalid_value"),
    (errors.ModelTooLarge, 400, "model_too_large"),
    (errors.ImageError, 400, "invalid_image"),
    (errors.DocumentError, 400, "invalid_document"),
    (errors.LoadError, 400, "load_failed"),
    (errors.EngineBusy, 409, "engine_busy"),
    (errors.NoModelLoaded, 503, "model_not_loaded"),
    (errors.WorkerLost, 503, "worker_lost"),
    (errors.EngineCrashed, 503, "engine_crashed"),
    (errors.OutriderError, 400, "invalid_request"),
)


def status_for(error_type: type[BaseException]) -> tuple[int, str]:
    """HTTP status and OpenAI `code` for an exception class; 500 for anything not a user's."""
    for cls, status, code in _STATUS:
        if issubclass(error_type, cls):
            return status, code
    return 500, "internal_error"


def status_for_kind(kind: str) -> tuple[int, str]:
    """Like `status_for`, from the class name an `ErrorEvent` carries."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return status_for(cls)
    return 500, "internal_error"


class ErrorDetail(BaseModel):
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None
    code: str


class ErrorBody(BaseModel):
    """What every error response holds (OpenAI's shape)."""

    error: ErrorDetail


def error_body(message: str, *, code: str, status: int = 400,
               param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": errors.shown(message), "type": kind, "param": param,
                      "code": code}}


def error_response(status: int, message: str, *, code: str,
                   param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, code=code, status=status, param=param),
                        status_code=status, headers=headers)


def response_for_exception(exc: BaseException) -> JSONResponse:
    status, code = status_for(type(exc))
    message = str(exc) if code != "internal_error" else f"internal error: {type(exc).__name__}: {exc}"
    return error_response(status, message, code=code)


def response_for_event(kind: str, message: str) -> JSONResponse:
    """Outrider's own errors keep their message (a 503 "no model is loaded" is not a bug);
    anything else is labelled an internal error, with its class."""
    status, code = status_for_kind(kind)
    if code == "internal_error":
        message = f"internal error: {kind}: {message}"
    return error_response(status, message, code=code)


DialectError = Callable[[int, str], dict[str, Any]]  # status, message → the dialect's body


@dataclass(frozen=True)
class ErrorShapes:
    """The error body for a path: the first dialect that owns it shapes it, else OpenAI's."""

    dialects: tuple[tuple[Callable[[str], bool], DialectError], ...] = ()

    def response(self, path: str, status: int, message: str, *, code: str,
                 param: str | None = None,
                 headers: dict[str, str] | None = None) -> JSONResponse:
        for owns, shape in self.dialects:
            if owns(path):
                return JSONResponse(shape(status, errors.shown(message)), status_code=status,
                                    headers=headers)
        return error_response(status, message, code=code, param=param, headers=headers)

    def for_exception(self, path: str, exc: BaseException) -> JSONResponse:
        status, code = status_for(type(exc))
        message = str(exc) if code != "internal_error" else f"internal error: {type(exc).__name__}: {exc}"
        return self.response(path, status, message, code=code)
