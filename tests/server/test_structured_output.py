"""Structured output over HTTP: `response_format` (json_object, json_schema), llama-server's
`grammar` / `json_schema` fields, and the 400s for what cannot be compiled — on the scripted
engine (what reaches the engine) and on the tiny model (what comes out under the constraint)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtime.events import ConstraintSpec
from tests.server.conftest import API_KEY, Served, loaded_fake
from tests.server.scripted_engine import ScriptedEngine


def model_of(api: openai.OpenAI) -> str:
    """The id of the one model the server has loaded."""
    return api.models.list().data[0].id


AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"messages": [{"role": "user", "content": "Give me JSON"}], "max_tokens": 32}
PROMPT = {"prompt": "JSON:", "max_tokens": 32}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
# Finite: every document it allows is short, so a random model must finish with "stop".
SMALL_SCHEMA = {"type": "object",
                "properties": {"colour": {"enum": ["red", "green", "blue"]},
                               "ok": {"type": "boolean"}},
                "required": ["colour", "ok"], "additionalProperties": False}


@pytest.fixture
def engine(models_dir: Path) -> Iterator[ScriptedEngine]:
    scripted = loaded_fake(ScriptedEngine(['{"name": "Ada", "age": 36}']), models_dir)
    yield scripted
    scripted.stop()


@pytest.fixture
def client(engine: ScriptedEngine, make_app: Callable[..., FastAPI]) -> TestClient:
    return TestClient(make_app(engine), headers=AUTH)


def one_line_400(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] and error["message"] and "\n" not in error["message"]
    return str(error["message"])


# --- what reaches the engine -----------------------------------------------------------------

@pytest.mark.parametrize(("fields", "expected"), [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, ConstraintSpec("json_object")),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}},
     ConstraintSpec("json_schema", json.dumps(SCHEMA))),
    ({"response_format": {"type": "json_object", "schema": SCHEMA}},  # llama-server's spelling
     ConstraintSpec("json_schema", json.dumps(SCHEMA))),
    ({"json_schema": SCHEMA}, ConstraintSpec("json_schema", json.dumps(SCHEMA))),
    ({"grammar": 'root ::= "yes" | "no"'}, ConstraintSpec("gbnf", 'root ::= "yes" | "no"')),
])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_each_form_reaches_the_engine_as_its_constraint(
        client: TestClient, engine: ScriptedEngine, route: str, fields: dict[str, Any],
        expected: ConstraintSpec | None) -> None:
    body = CHAT if route.endswith("chat/completions") else PROMPT
    response = client.post(route, json={**body, **fields})
    assert response.status_code == 200, response.text
    assert engine.requests[-1].constraint == expected


def test_the_reply_is_the_engines_text(client: TestClient) -> None:
    response = client.post("/v1/chat/completions",
                           json={**CHAT, "response_format": {"type": "json_object"}})
    message = response.json()["choices"][0]["message"]
    assert json.loads(message["content"]) == {"name": "Ada", "age": 36}


@pytest.mark.parametrize(("fields", "words"), [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": 5}}}}, "response_format"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"schema": {"type": "object",
                                                     "properties": {"a": {"type": "string",
                                                                          "format": "no-such"}}}}}},
     "response_format"),
    ({"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}, "json_schema"),
    ({"grammar": "root ::= ( unclosed"}, "grammar"),
    ({"grammar": 'root ::= "x" root'}, "cannot end"),
    ({"grammar": "   "}, "grammar"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "not both"),
    ({"json_schema": SCHEMA, "grammar": 'root ::= "a"'}, "not both"),
    ({"json_schema": "{}"}, "json_schema"),
])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_what_cannot_be_compiled_is_a_one_line_400_and_the_server_goes_on(
        client: TestClient, engine: ScriptedEngine, route: str, fields: dict[str, Any],
        words: str) -> None:
    body = CHAT if route.endswith("chat/completions") else PROMPT
    message = one_line_400(client.post(route, json={**body, **fields}))
    assert words in message
    assert engine.requests == []  # refused at the edge: the engine never saw it
    assert client.post(route, json=body).status_code == 200


def test_an_unsupported_keyword_is_named_with_its_path(client: TestClient) -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    message = one_line_400(client.post("/v1/chat/completions", json={
        **CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}))
    assert "uniqueItems" in message and "/properties/tags" in message, message


# --- the tiny model under the constraint ----------------------------------------------------

@pytest.fixture
def tiny_client(tiny_server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as api:
        yield api


def test_a_random_model_under_a_schema_writes_a_valid_document(tiny_client: openai.OpenAI) -> None:
    for seed in range(3):
        reply = tiny_client.chat.completions.create(
            model=model_of(tiny_client), messages=[{"role": "user", "content": "colour?"}], max_tokens=64,
            temperature=1.0, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "c", "schema": SMALL_SCHEMA, "strict": True}})
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content or ""), SMALL_SCHEMA)


def test_streamed_constrained_text_equals_the_whole_at_t0(tiny_client: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"model": model_of(tiny_client), "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": 64, "temperature": 0.0,
                              "response_format": {"type": "json_object"}}
    whole = tiny_client.chat.completions.create(**fields)
    parts = list(tiny_client.chat.completions.create(**fields, stream=True))
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == whole.choices[0].message.content
    if whole.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_llama_server_fields_on_text_completions(tiny_server: Served) -> None:
    with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=120) as http:
        reply = http.post("/v1/completions", json={"prompt": "Answer:", "max_tokens": 16,
                                                   "temperature": 1.0, "seed": 3,
                                                   "grammar": 'root ::= ("yes" | "no") "."'})
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["text"] in ("yes.", "no.") and choice["finish_reason"] == "stop"

        reply = http.post("/v1/completions", json={"prompt": "JSON:", "max_tokens": 64,
                                                   "temperature": 1.0, "seed": 4,
                                                   "json_schema": SMALL_SCHEMA})
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["text"]), SMALL_SCHEMA)


def test_a_bad_grammar_on_the_real_engine_is_400_and_it_keeps_serving(tiny_server: Served) -> None:
    with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=120) as http:
        one_line_400(http.post("/v1/chat/completions",
                               json={**CHAT, "grammar": "root ::= undefined_rule"}))
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
