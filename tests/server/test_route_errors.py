"""Bad input on every route of every dialect, in one table: an unknown model (404 naming it
and listing the names the server answers to), a field of the wrong type, a required field
left out — each a one-line error in the route's own shape, after which the server keeps
serving:

    OpenAI (chat, completions, embeddings, responses)  {"error": {"message", "type", "code", …}}
    Anthropic (messages, count_tokens)                 {"type": "error", "error": {"type", "message"}}
    Ollama (chat, generate, embed, embeddings, show, pull)   {"error": "…"}

One fake-engine server serves the whole module (the dialects' own modules test what their
clients make of these errors; this one checks that no route was left out).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest

from tests.server.conftest import API_KEY, ServerThread, fake_app, loaded_fake
from tests.server.fake_engine import FakeEngine

Dialect = Literal["openai", "anthropic", "ollama"]
STEM = "fake"
ASK = [{"role": "user", "content": "Hi"}]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}

# route → (dialect, a minimal valid body, its required fields)
ROUTES: dict[str, tuple[Dialect, dict[str, Any], tuple[str, ...]]] = {
    "/v1/chat/completions": ("openai", {"model": STEM, "messages": ASK, "max_tokens": 2},
                             ("messages",)),
    "/v1/completions": ("openai", {"model": STEM, "prompt": "Hi", "max_tokens": 2}, ("prompt",)),
    "/v1/embeddings": ("openai", {"model": STEM, "input": "Hi"}, ("input",)),
    "/v1/responses": ("openai", {"model": STEM, "input": "Hi", "max_output_tokens": 2},
                      ("model", "input")),
    "/v1/messages": ("anthropic", {"model": STEM, "max_tokens": 2, "messages": ASK},
                     ("model", "max_tokens", "messages")),
    "/v1/messages/count_tokens": ("anthropic", {"model": STEM, "messages": ASK},
                                  ("model", "messages")),
    "/api/chat": ("ollama", {"model": STEM, "messages": ASK, "stream": False,
                             "options": {"num_predict": 2}}, ("model",)),
    "/api/generate": ("ollama", {"model": STEM, "prompt": "Hi", "stream": False,
                                 "options": {"num_predict": 2}}, ("model",)),
    "/api/embed": ("ollama", {"model": STEM, "input": "Hi"}, ("model", "input")),
    "/api/embeddings": ("ollama", {"model": STEM, "prompt": "Hi"}, ("model", "prompt")),
    "/api/show": ("ollama", {"model": STEM}, ("model",)),
    "/api/pull": ("ollama", {"model": "owner/repo:Q4_0"}, ("model",)),  # no valid call: no hub
}
# Pulling needs a hub (test_ollama_api runs one): here only the refusals before it is asked.
ANSWERING = [path for path in ROUTES if path != "/api/pull"]

# route → a field of the wrong type for it (and the field the message must name)
WRONG_TYPES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"messages": "Hi"}, "messages"),
    ("/v1/chat/completions", {"max_tokens": "2"}, "max_tokens"),
    ("/v1/chat/completions", {"model": 5}, "model"),
    ("/v1/completions", {"prompt": {"text": "Hi"}}, "prompt"),
    ("/v1/completions", {"temperature": "hot"}, "temperature"),
    ("/v1/embeddings", {"input": 5}, "input"),
    ("/v1/embeddings", {"encoding_format": 1}, "encoding_format"),
    ("/v1/responses", {"input": 5}, "input"),
    ("/v1/responses", {"instructions": ["Be brief."]}, "instructions"),
    ("/v1/responses", {"model": 5}, "model"),
    ("/v1/messages", {"max_tokens": "2"}, "max_tokens"),
    ("/v1/messages", {"messages": "Hi"}, "messages"),
    ("/v1/messages", {"system": 5}, "system"),
    ("/v1/messages", {"model": ["x"]}, "model"),
    ("/v1/messages/count_tokens", {"messages": "Hi"}, "messages"),
    ("/api/chat", {"messages": "Hi"}, "messages"),
    ("/api/chat", {"options": {"num_predict": "2"}}, "options.num_predict"),
    ("/api/generate", {"prompt": 5}, "prompt"),
    ("/api/generate", {"system": ["x"]}, "system"),
    ("/api/embed", {"input": 5}, "input"),
    ("/api/embeddings", {"prompt": ["Hi"]}, "prompt"),
    ("/api/show", {"model": 5}, "model"),
    ("/api/pull", {"model": 5}, "model"),
]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    models_dir = tmp_path_factory.mktemp("models")
    engine = loaded_fake(FakeEngine(), models_dir, STEM)
    try:
        with ServerThread(fake_app(engine, models_dir)) as server:
            yield server.url
    finally:
        engine.stop()


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=HEADERS, timeout=60)


def one_line_error(response: httpx.Response, dialect: Dialect, status: int) -> str:
    """The message of an error in `dialect`'s shape with this status (checked)."""
    assert response.status_code == status, response.text
    body = response.json()
    if dialect == "openai":
        error = body["error"]
        assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
        assert error["code"], body
        message = error["message"]
    elif dialect == "anthropic":
        assert body["type"] == "error", body
        kind = {400: "invalid_request_error", 404: "not_found_error"}[status]
        assert body["error"]["type"] == kind, body
        message = body["error"]["message"]
    else:
        assert set(body) == {"error"}, body
        message = body["error"]
    assert isinstance(message, str) and message and "\n" not in message
    return message


def still_serving(url: str, path: str) -> None:
    """The route answers its valid body (pull: chat answers; pulling needs a hub)."""
    path = path if path in ANSWERING else "/api/chat"
    assert post(url, path, ROUTES[path][1]).status_code == 200, path


def test_every_valid_minimal_body_is_answered(url: str) -> None:
    for path in ANSWERING:
        still_serving(url, path)


@pytest.mark.parametrize("path", ANSWERING)
def test_an_unknown_model_is_a_404_listing_the_names(url: str, path: str) -> None:
    dialect, body, _ = ROUTES[path]
    message = one_line_error(post(url, path, {**body, "model": "no-such-model"}), dialect, 404)
    assert "no-such-model" in message
    assert STEM in message or "owner/repo:" in message  # a name the server answers to
    still_serving(url, path)


@pytest.mark.parametrize(("path", "change", "field"), WRONG_TYPES,
                         ids=[f"{p}:{f}" for p, _, f in WRONG_TYPES])
def test_a_wrong_type_is_a_400_naming_the_field(url: str, path: str, change: dict[str, Any],
                                                field: str) -> None:
    dialect, body, _ = ROUTES[path]
    message = one_line_error(post(url, path, {**body, **change}), dialect, 400)
    assert field in message, message
    still_serving(url, path)


@pytest.mark.parametrize(("path", "field"),
                         [(path, field) for path, (_, _, fields) in ROUTES.items()
                          for field in fields])
def test_a_missing_required_field_is_a_400_naming_it(url: str, path: str, field: str) -> None:
    dialect, body, _ = ROUTES[path]
    message = one_line_error(post(url, path, {k: v for k, v in body.items() if k != field}),
                             dialect, 400)
    assert field in message, message
    still_serving(url, path)


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_body_that_is_not_an_object_is_a_400(url: str, path: str) -> None:
    dialect = ROUTES[path][0]
    for raw in (b"[1, 2]", b"{not json", b'"text"'):
        response = httpx.post(f"{url}{path}", content=raw, timeout=60,
                              headers={**HEADERS, "Content-Type": "application/json"})
        one_line_error(response, dialect, 400)
    still_serving(url, path)
