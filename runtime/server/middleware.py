"""Plain ASGI middlewares that run before any route: browser guard, API key, body limit.

Order matters (outermost first): CORS (answers preflights of allowed origins),
`BrowserGuardMiddleware` (other web pages and DNS-rebound host names), `ApiKeyMiddleware` (a
stranger makes us buffer nothing), `BodyLimitMiddleware` (reads the whole body, at most N
bytes, before the app parses it), `JsonBodyMiddleware`, then the app.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.server.errors import ErrorShapes
from runtime.server.models.router import LEASES

OPEN_PATHS = frozenset({"/health"})


def host_is_loopback(host_header: str) -> bool:
    """Whether a Host header names this machine's loopback: `localhost`, `127.x.x.x` or
    `[::1]`, each with an optional `:port`.

    >>> host_is_loopback("127.0.0.1:1234"), host_is_loopback("[::1]:80")
    (True, True)
    >>> host_is_loopback("evil.example:1234"), host_is_loopback("[::1].evil.example")
    (False, False)

    The header is parsed whole (RFC 3986's `host [":" port]`): after `]` only `:port` may
    follow, an IPv6 address must be in brackets, a port is digits. Anything else is not
    loopback, so no hostile name that merely starts like one gets through.
    """
    host = host_header.strip().lower()
    if host.startswith("["):
        address, bracket, rest = host[1:].partition("]")
        if not bracket or not _is_port_suffix(rest):
            return False
        return _is_loopback_ip(address, version=6)
    name, colon, port = host.partition(":")
    if colon and not _is_port_suffix(colon + port):
        return False
    return name == "localhost" or _is_loopback_ip(name, version=4)


def _is_port_suffix(text: str) -> bool:
    """Nothing, or `:` and a port number."""
    return text == "" or (text.startswith(":") and text[1:].isascii()
                          and text[1:].isdigit() and len(text) <= 6)


def _is_loopback_ip(text: str, *, version: int) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return address.version == version and address.is_loopback


class BrowserGuardMiddleware:
    """Keeps web pages out unless allowed. A request with an `Origin` header comes from a
    browser; it is refused unless that origin was allowed (`--cors-origin`), so a page the
    user happens to visit cannot drive a key-less local server. With `local_only`, the Host
    header must name loopback too, which defeats DNS rebinding (a hostile name resolving to
    127.0.0.1 makes the browser send `Host: hostile.example`)."""

    def __init__(self, app: ASGIApp, allowed_origins: Sequence[str], local_only: bool,
                 shapes: ErrorShapes) -> None:
        self.app = app
        self.shapes = shapes
        self.allowed_origins = frozenset(allowed_origins)
        self.local_only = local_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            host = headers.get("host")
            message = None
            if origin is not None and origin not in self.allowed_origins \
                    and "*" not in self.allowed_origins:
                message = (f"requests from web pages ({origin}) are not allowed; "
                           "start the server with --cors-origin ORIGIN to allow one")
            elif self.local_only and host is not None and not host_is_loopback(host):
                message = f"this server answers only to a loopback host name, not {host!r}"
            if message is not None:
                await self.shapes.response(scope["path"], 403, message,
                                           code="origin_not_allowed")(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiKeyMiddleware:
    """Every route except `/health` needs `Authorization: Bearer KEY`, or `x-api-key: KEY`
    (how Anthropic's clients send it).

    The comparison is constant-time (`hmac.compare_digest`), so response timing does not tell
    an attacker how much of a guessed key was right.
    """

    def __init__(self, app: ASGIApp, api_key: str, shapes: ErrorShapes) -> None:
        self.app = app
        self.shapes = shapes
        self._expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        value = headers.get("authorization", "")
        scheme, _, token = value.partition(" ")
        given = token.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() == "bearer" and hmac.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        other = headers.get("x-api-key")
        if not value and other is not None and hmac.compare_digest(
                other.strip().encode("utf-8", "surrogateescape"), self._expected):
            await self.app(scope, receive, send)
            return
        message = ("missing API key: send the header 'Authorization: Bearer KEY' "
                   "(or 'x-api-key: KEY')" if not value and other is None else "wrong API key")
        response = self.shapes.response(scope["path"], 401, message, code="invalid_api_key",
                                        headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class JsonBodyMiddleware:
    """Every body this API takes is JSON: read it as such whatever Content-Type says, so
    `curl -d '{...}'` (form-encoded by default) works as it does with other local servers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse request bodies over `max_bytes` with 413, whatever Content-Length claims.

    The body is read here (bounded) and replayed to the app, so the app never sees more than
    the limit; after the replay, `receive` passes through (disconnect detection needs it).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, shapes: ErrorShapes) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shapes = shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.isdigit():
                await self.shapes.response(scope["path"], 400, "Content-Length is not a number",
                                           code="invalid_request")(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = self.shapes.response(
            scope["path"], 413, f"request body is larger than the server's limit of {self.max_bytes} bytes",
            code="request_too_large", headers={"Connection": "close"})
        await response(scope, receive, send)


class ReleaseLeasesMiddleware:
    """Releases the router leases a request took (`runtime.server.models.router`) once its response
    is sent, however it ends: a stream runs to its end inside the app call, and an error or
    a client leaving ends that call too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in scope.get("state", {}).pop(LEASES, []):
                lease.release()
