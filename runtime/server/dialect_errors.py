"""Errors in the shape of the API a route belongs to.

Every error the server makes starts in OpenAI's shape (`runtime.server.error_responses`):
the validation handler, `OutriderError`s, the key, body-size and browser guards, routing's
404 and 405. For the routes of other dialects, `DialectErrorMiddleware` rewrites such a body
on its way out, keeping the status and the one-line message:

    Ollama (/api/… except Outrider's own)   {"error": "model 'x' not found; available: …"}
    Anthropic (/v1/messages…)               {"type": "error", "error": {"type":
                                              "invalid_request_error", "message": "…"}}

    >>> ollama_error(404, {"error": {"message": "no such model", "code": "model_not_found"}})
    {'error': 'no such model'}
    >>> anthropic_error(401, {"error": {"message": "wrong API key", "code": "invalid_api_key"}})
    {'type': 'error', 'error': {'type': 'authentication_error', 'message': 'wrong API key'}}

The Responses API is OpenAI's own, so its errors need no rewriting. Outrider's routes under
`/api/` (load, unload, status, metrics) keep OpenAI's shape, as the desktop app reads it.
Only JSON bodies of 4xx/5xx answers are touched; streams carry their errors in their own
dialect already.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Shaper = Callable[[int, dict[str, Any]], dict[str, Any]]

# Outrider's own routes under /api/ (runtime.server.api_routes): not Ollama's.
OUTRIDER_API = frozenset({"/api/load", "/api/unload", "/api/status", "/api/metrics",
                          "/api/metrics/stream"})

_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def _message(body: dict[str, Any]) -> str:
    error = body.get("error")
    return str(error.get("message", "")) if isinstance(error, dict) else str(error)


def ollama_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"error": _message(body)}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_error_type(status),
                                       "message": _message(body)}}


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/") and path not in OUTRIDER_API


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def shaper_for(path: str) -> Shaper | None:
    if is_ollama_path(path):
        return ollama_error
    if is_anthropic_path(path):
        return anthropic_error
    return None


def _is_openai_error(body: Any) -> bool:
    return (isinstance(body, dict) and isinstance(body.get("error"), dict)
            and "message" in body["error"])


class DialectErrorMiddleware:
    """Rewrites OpenAI-shaped error bodies for the Ollama and Anthropic routes (module doc).
    Outermost, so the key and size guards' answers are rewritten too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shaper = shaper_for(scope["path"]) if scope["type"] == "http" else None
        if shaper is None:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshaping_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                if message["status"] >= 400 and headers.get(b"content-type", b"").startswith(
                        b"application/json"):
                    start = message
                    return
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                await _send_reshaped(send, start, b"".join(chunks), shaper)
                return
            await send(message)

        await self.app(scope, receive, reshaping_send)


async def _send_reshaped(send: Send, start: Message, body: bytes, shaper: Shaper) -> None:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if _is_openai_error(data):
        body = json.dumps(shaper(start["status"], data), ensure_ascii=False).encode()
    headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
