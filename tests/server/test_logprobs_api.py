"""logprobs and top_logprobs over HTTP, in OpenAI's shapes: chat's `logprobs.content` entries
and the legacy completions' parallel lists, whole and streamed — on the scripted engine (exact
numbers) and on the tiny model (the engine's own numbers, streamed equal to whole)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.server.conftest import API_KEY, Served, loaded_fake
from tests.server.scripted_engine import ScriptedEngine
from tests.server.sse_parse import chunks


def model_of(api: openai.OpenAI) -> str:
    """The id of the one model the server has loaded."""
    return api.models.list().data[0].id


AUTH = {"Authorization": f"Bearer {API_KEY}"}
REPLY = "Hello world"  # six tokens of two characters: "He" "ll" "o " "wo" "rl" "d"
PIECES = ["He", "ll", "o ", "wo", "rl", "d"]
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
PROMPT = {"prompt": "Hi", "max_tokens": 16}


@pytest.fixture
def engine(models_dir: Path) -> Iterator[ScriptedEngine]:
    scripted = loaded_fake(ScriptedEngine([REPLY]), models_dir)
    yield scripted
    scripted.stop()


@pytest.fixture
def http(engine: ScriptedEngine, make_app: Callable[..., FastAPI]) -> TestClient:
    return TestClient(make_app(engine), headers=AUTH)


def expected_chat(top: int) -> list[dict[str, Any]]:
    return [{"token": piece, "logprob": -0.5 * k, "bytes": list(piece.encode()),
             "top_logprobs": [{"token": piece if j == 0 else f"alt{j}", "logprob": -0.5 * k - j,
                               "bytes": list((piece if j == 0 else f"alt{j}").encode())}
                              for j in range(top)]}
            for k, piece in enumerate(PIECES)]


@pytest.mark.parametrize("top", [0, 3])
def test_chat_logprobs_whole(http: TestClient, engine: ScriptedEngine, top: int) -> None:
    body = {**CHAT, "logprobs": True, "top_logprobs": top}
    choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert engine.requests[-1].logprobs == top
    assert choice["logprobs"]["content"] == expected_chat(top)
    assert choice["message"]["content"] == REPLY


def test_chat_logprobs_streamed_add_up_to_the_whole(http: TestClient) -> None:
    body = {**CHAT, "logprobs": True, "top_logprobs": 2, "stream": True}
    parts = chunks(http.post("/v1/chat/completions", json=body).text)
    entries = [e for p in parts for e in ((p["choices"][0]["logprobs"] or {}).get("content") or [])]
    assert entries == expected_chat(2)
    assert parts[-1]["choices"][0]["logprobs"] is None  # the finish chunk carries no tokens


def test_no_logprobs_unless_asked(http: TestClient, engine: ScriptedEngine) -> None:
    choice = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]
    assert choice["logprobs"] is None and engine.requests[-1].logprobs is None
    http.post("/v1/chat/completions", json={**CHAT, "logprobs": False})
    assert engine.requests[-1].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_in_the_legacy_shape(http: TestClient, stream: bool) -> None:
    response = http.post("/v1/completions", json={**PROMPT, "logprobs": 2, "stream": stream})
    if stream:
        parts = [p["choices"][0]["logprobs"] for p in chunks(response.text)]
        merged: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                        "text_offset": []}
        for part in parts:
            for key in merged:
                merged[key] += (part or {}).get(key, [])
        logprobs = merged
    else:
        logprobs = response.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == PIECES
    assert logprobs["token_logprobs"] == [-0.5 * k for k in range(6)]
    assert logprobs["top_logprobs"] == [{piece: -0.5 * k, "alt1": -0.5 * k - 1}
                                        for k, piece in enumerate(PIECES)]
    assert logprobs["text_offset"] == [0, 2, 4, 6, 8, 10]
    assert [REPLY[o:o + 2] for o in logprobs["text_offset"]] == PIECES


@pytest.mark.parametrize(("route", "fields", "param"), [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
])
def test_out_of_range_is_a_one_line_400(http: TestClient, route: str, fields: dict[str, Any],
                                        param: str) -> None:
    body = CHAT if route.endswith("chat/completions") else PROMPT
    response = http.post(route, json={**body, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]
    assert http.post(route, json=body).status_code == 200


# --- the tiny model's own numbers --------------------------------------------------------

@pytest.fixture
def tiny(tiny_server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as api:
        yield api


def test_tiny_chat_logprobs_streamed_equal_whole(tiny: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"model": model_of(tiny), "messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 12, "temperature": 0.0, "logprobs": True,
                              "top_logprobs": 5}
    whole = tiny.chat.completions.create(**fields)
    choice = whole.choices[0]
    entries = choice.logprobs.content if choice.logprobs else None
    assert entries
    for entry in entries:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 5
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert math.isclose(entry.logprob, values[0], abs_tol=1e-4)  # greedy takes the top one
    token_ids = (whole.model_extra or {})["outrider"]["choices"][0]["token_ids"]
    assert len(entries) == len(token_ids)  # one entry per generated token
    streamed = [e for part in tiny.chat.completions.create(**fields, stream=True)
                if part.choices and part.choices[0].logprobs
                for e in part.choices[0].logprobs.content or ()]
    # The second request reuses the first's cached prompt cells: the same tokens, logits
    # equal up to llama.cpp's batch-shape rounding.
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert all(math.isclose(a.logprob, b.logprob, abs_tol=0.01)
               for a, b in zip(streamed, entries, strict=True))


def test_tiny_completion_logprobs(tiny_server: Served) -> None:
    with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=120) as api:
        reply = api.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8,
                                                 "temperature": 0.7, "seed": 1, "logprobs": 3})
        choice = reply.json()["choices"][0]
        logprobs = choice["logprobs"]
        n = reply.json()["usage"]["completion_tokens"]
        assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == n
        assert all(len(top) <= 3 for top in logprobs["top_logprobs"])
        assert all(value <= 0.0 for value in logprobs["token_logprobs"])
        assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
