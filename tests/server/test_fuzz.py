"""Hypothesis-generated request bodies against the API: never a 5xx, always OpenAI's error
shape for a 4xx, and the server (and the engine thread behind it) keeps serving."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.server import ServerLimits
from tests.server.conftest import API_KEY, serving
from tests.server.fake_engine import FakeEngine

AUTH = {"Authorization": f"Bearer {API_KEY}"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8)


@st.composite
def bodies(draw: st.DrawFn, required: dict[str, st.SearchStrategy[Any]],
           optional: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A plausible body; half of them with one field replaced by any JSON value at all."""
    body = draw(st.fixed_dictionaries(required, optional=optional))
    if draw(st.booleans()):
        body[draw(st.sampled_from(sorted({*required, *optional})))] = draw(json_values)
    return body


text = st.text(max_size=40)
token_ids = st.lists(st.integers(-5, 300), min_size=0, max_size=12)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
     "content": st.one_of(text, st.none(), st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "text", "image_url"]), "text": text}), max_size=2))})
sampling_fields = {
    "model": st.sampled_from(["fake", "fake", "fake", "nope"]),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "max_tokens": st.integers(-1, 40),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "top_k": st.integers(0, 100),
    "min_p": st.floats(0, 0.5),
    "seed": st.integers(-(2**64), 2**64),
    "stop": st.one_of(text, st.lists(text, max_size=4)),
    "n": st.integers(0, 4),
    "frequency_penalty": st.floats(-2.5, 2.5),
    "presence_penalty": st.floats(-2.5, 2.5),
    "repeat_penalty": st.floats(0, 2),
    "repeat_last_n": st.integers(-1, 100),
    "truncate_middle": st.booleans(),
    "logprobs": st.sampled_from([None, False, False, True]),
}
chat_bodies = bodies({"messages": st.lists(message, max_size=3)},
                     {**sampling_fields, "max_completion_tokens": st.integers(-1, 40),
                      "tools": st.sampled_from([None, [], [{"type": "function"}]])})
completion_bodies = bodies(
    {"prompt": st.one_of(text, token_ids, st.lists(text, max_size=2),
                         st.lists(token_ids, max_size=2))},
    {**sampling_fields, "echo": st.sampled_from([False, False, True]),
     "suffix": st.sampled_from([None, "", "x"]), "best_of": st.integers(0, 3)})
load_bodies = st.one_of(json_values, bodies(
    {"model_path": st.sampled_from(["owner/repo/fake.gguf", "../x.gguf", "/etc/passwd",
                                    "missing.gguf", "", ".", "owner"])},
    {"n_ctx": st.integers(-5, 10**6), "type_k": st.sampled_from(["f16", "q8_0", "q4_0", "x"]),
     "gpu_layers": st.integers(-2, 100), "n_parallel": st.integers(-1, 300),
     "draft": st.fixed_dictionaries({"kind": st.sampled_from(["none", "ngram", "model", "x"])})}))
requests = st.one_of(
    st.tuples(st.just("/v1/chat/completions"), chat_bodies),
    st.tuples(st.just("/v1/completions"), completion_bodies),
    st.tuples(st.just("/api/load"), load_bodies),
    st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/api/load"]),
              json_values),
)


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"].isprintable()
        assert isinstance(error["code"], str) and error["code"], response.text


@pytest.fixture
def fake_client(fake_engine: FakeEngine, make_app: Callable[..., FastAPI]) -> TestClient:
    app = make_app(fake_engine, limits=ServerLimits(max_tokens=32))
    return TestClient(app, headers=AUTH)


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=requests)
def test_fake_engine_fuzz_never_500(fake_client: TestClient, request: tuple[str, Any]) -> None:
    path, body = request
    check(fake_client.post(path, content=json.dumps(body),
                           headers={"Content-Type": "application/json"}))


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_raw_bytes_are_400(fake_client: TestClient, raw: bytes) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/api/load"):
        response = fake_client.post(path, content=raw, headers={"Content-Type": "application/json"})
        check(response)


def test_real_engine_survives_fuzzing(tiny_target: Path, tmp_path: Path) -> None:
    """The same bodies through a real server into the real engine on the tiny model."""
    models = tmp_path / "models"
    models.mkdir()
    with serving(tiny_target, models, ServerLimits(max_tokens=16), n_parallel=4) as served, \
            httpx.Client(base_url=served.url, headers=AUTH, timeout=60) as http:
        generation = st.one_of(st.tuples(st.just("/v1/chat/completions"), chat_bodies),
                               st.tuples(st.just("/v1/completions"), completion_bodies))

        @settings(max_examples=60, deadline=None, database=None)
        @given(request=generation)
        def run(request: tuple[str, Any]) -> None:
            path, body = request
            if isinstance(body, dict) and body.get("model") == "fake":
                body = {**body, "model": served.engine.status().model.name}
            check(http.post(path, json=body))

        run()
        after = http.post("/v1/completions", json={"prompt": "still there?", "max_tokens": 4})
        assert after.status_code == 200, after.text
        status = http.get("/api/status").json()
        assert status["state"] == "ready"
        assert status["active_sequences"] == status["waiting_sequences"] == 0
