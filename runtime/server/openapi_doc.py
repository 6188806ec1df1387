"""What `/openapi.json` says: the statuses each route really answers with, in the error shape
they really have, the key when one is set, and the caps this server was started with.

FastAPI's own document promises a 422 `HTTPValidationError` for every route with a body, but
this server answers 400 (`runtime.server.app`), and FastAPI knows nothing of the middlewares
(401, 403, 413) or of the errors routes raise (404, 409, 503). Schema-driven clients and
fuzzers read the document (tests/server/test_schemathesis.py runs schemathesis over it), so
it is rewritten here to say what the server sends:

    doc = openapi_document(app, limits=ServerLimits(), api_key=True)
    sorted(doc["paths"]["/api/load"]["post"]["responses"])
    → ['200', '400', '401', '403', '404', '409', '413', '500']
    doc["paths"]["/api/load"]["post"]["responses"]["409"]["content"]
    → {'application/json': {'schema': {'$ref': '#/components/schemas/ErrorBody'}}}

Why not `responses=` on each route decorator: the statuses the middlewares add apply to every
route, and which of them apply depends on how the app was made (a key or none).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from runtime.events import MAX_SAMPLES
from runtime.server.errors import ErrorBody
from runtime.server.state import ServerLimits
from runtime.settings.load import KV_CACHE_TYPES, LoadSettings

_REF = "#/components/schemas/{model}"
_ERROR = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}}
# Before OpenAPI 3.2 (`itemSchema`) an event stream's `schema` describes one event.
_EVENT = {"type": "object", "required": ["data"],
          "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
_SSE = {"text/event-stream": {"schema": _EVENT}}

# What any request may get, whatever the route: the middlewares answer these.
_EVERY_ROUTE = {
    "400": "`invalid_json`, `invalid_encoding`, `number_too_large`, `nesting_too_deep`, "
           "`invalid_value`: the body cannot be read or holds a wrong value",
    "403": "`origin_not_allowed`: a web page's Origin, or a Host that is not loopback",
    "413": "`request_too_large`: the body is over the server's limit",
}
_WITH_KEY = {"401": "`invalid_api_key`: the key is missing or wrong"}
_ENGINE_BUG = {"500": "`internal_error`: an engine bug; the server keeps serving"}
_GENERATION = {
    "400": "`invalid_value` (also a schema or grammar the constraint compiler refuses, "
           "naming the keyword and its path), `context_length_exceeded`, `invalid_request` (a "
           "chat template that fails, tools the model's template cannot call), or an "
           "unreadable body",
    "404": "`model_not_found`: `model` names nothing in the library",
    "503": "`model_not_loaded`: no `model` named and none loaded; `engine_crashed`: the "
           "model's engine process died (the next request loads it again)",
    **_ENGINE_BUG,
}
# (method, path) → statuses beyond `_EVERY_ROUTE` (and 401 with a key).
_ROUTES: dict[tuple[str, str], dict[str, str]] = {
    ("post", "/v1/chat/completions"): _GENERATION,
    ("post", "/v1/completions"): _GENERATION,
    ("post", "/v1/responses"): _GENERATION,
    ("get", "/v1/responses/{response_id}"): {
        "404": "`not_found`: responses are not stored on this server"},
    ("post", "/v1/embeddings"): {
        "400": "`invalid_value` (no input, an empty one, a token id beyond the vocabulary, "
               "`dimensions`), `context_length_exceeded` (an input over the embedding limit), "
               "`invalid_request` (a model that cannot embed: a reranker, T5)",
        "404": "`model_not_found`: `model` names nothing in the library",
        "503": "`model_not_loaded`: no `model` named and none loaded; `engine_crashed`",
        **_ENGINE_BUG,
    },
    ("post", "/tokenize"): {
        "400": "`invalid_value`: `content` missing or not text",
        "404": "`model_not_found`: `model` names nothing in the library",
        "503": "`model_not_loaded`: no `model` named and none loaded; `engine_crashed`",
        **_ENGINE_BUG,
    },
    ("post", "/api/load"): {
        "400": "`invalid_value` (a load setting), `invalid_model_file`, `load_failed`",
        "403": "`path_not_allowed`: the file is outside the models library, or "
               "`origin_not_allowed`",
        "404": "`model_not_found`: no such file",
        "409": "`engine_busy`: a load or unload is under way",
        **_ENGINE_BUG,
    },
    ("post", "/api/unload"): {"400": "`invalid_value`: a body other than {} or {\"model\": NAME}",
                              "404": "`model_not_found`: that model is not resident",
                              "409": "`engine_busy`: a load or unload is under way",
                              **_ENGINE_BUG},
    ("get", "/v1/models"): _ENGINE_BUG,
    ("get", "/api/status"): _ENGINE_BUG,
    ("get", "/api/metrics"): _ENGINE_BUG,
    ("get", "/api/metrics/stream"): _ENGINE_BUG,
}
# 200 bodies FastAPI cannot see: these routes answer server-sent events.
_STREAMS = {("post", "/v1/chat/completions"): "json or sse",
            ("post", "/v1/completions"): "json or sse",
            ("post", "/v1/responses"): "json or sse",
            ("post", "/api/load"): "sse", ("get", "/api/metrics/stream"): "sse"}
_OPEN = {("get", "/health")}  # no key needed (middleware.OPEN_PATHS)


def install_openapi(app: FastAPI, *, limits: ServerLimits, api_key: bool) -> None:
    """Make `app` serve `openapi_document` (built once, on the first request for it)."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app, limits=limits, api_key=api_key)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def openapi_document(app: FastAPI, *, limits: ServerLimits, api_key: bool) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description,
                      routes=app.routes)
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    _add_schema(schemas, "ErrorBody", ErrorBody.model_json_schema(ref_template=_REF))
    _add_schema(schemas, "LoadSettings", _load_settings_schema())
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            _describe(operation, method, path, api_key=api_key)
    doc["paths"]["/api/load"]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="LoadSettings")}}}}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        if name in schemas:
            _apply_limits(schemas[name]["properties"], limits)
    return doc


def _describe(operation: dict[str, Any], method: str, path: str, *, api_key: bool) -> None:
    responses = operation["responses"]
    responses.pop("422", None)
    statuses = dict(_EVERY_ROUTE)
    if api_key and (method, path) not in _OPEN:
        statuses.update(_WITH_KEY)
    statuses.update(_ROUTES.get((method, path), {}))
    for status, description in sorted(statuses.items()):
        responses[status] = {"description": description, "content": _ERROR}
    stream = _STREAMS.get((method, path))
    if stream == "sse":
        responses["200"]["content"] = _SSE
    elif stream == "json or sse":
        responses["200"]["content"] = {**responses["200"].get("content", {}), **_SSE}
        responses["200"]["description"] = "the reply; server-sent events with `stream: true`"
    if (method, path) in _OPEN:
        operation["security"] = []


def _load_settings_schema() -> dict[str, Any]:
    """`LoadSettings` as the route reads it: unknown keys refused, K/V types by name. Its
    ranges (context ≥ 16, ...) are `LoadSettings`' own checks and are not repeated here."""
    schema = TypeAdapter(LoadSettings).json_schema(ref_template=_REF)
    schema["additionalProperties"] = False
    schema["required"] = ["model_path"]
    for key in ("type_k", "type_v"):
        schema["properties"][key]["enum"] = list(KV_CACHE_TYPES)
    for nested in schema.get("$defs", {}).values():
        nested["additionalProperties"] = False
    return schema


def _apply_limits(properties: dict[str, Any], limits: ServerLimits) -> None:
    """The caps of this server (`ServerLimits`) into the generation bodies' schema.
    `max_completion_tokens` keeps its static range: beside `max_tokens` it is ignored, so
    the cap is not checked on it then."""
    _bound(properties["max_tokens"], "integer", maximum=limits.max_tokens)
    _bound(properties["n"], "integer", maximum=min(limits.max_n, MAX_SAMPLES))
    _bound(properties["stop"], "array", maxItems=limits.max_stop)
    _bound(properties["stop"], "string", minLength=1)


def _bound(schema: dict[str, Any], kind: str, **bounds: int) -> None:
    """Set `bounds` on `schema`, or on its `anyOf` members of JSON type `kind` (and on an
    array's string items, for `minLength`)."""
    members = schema.get("anyOf", [schema])
    for member in members:
        if member.get("type") == kind:
            member.update(bounds)
        elif kind == "string" and member.get("type") == "array":
            _bound(member.get("items", {}), kind, **bounds)


def _add_schema(schemas: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    schemas.update(schema.pop("$defs", {}))
    schemas[name] = schema
