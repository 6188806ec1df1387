"""Every route that writes text goes one way: `runtime.server.generation.answer`, with the
engine asked nothing but `submit` (the template family, the call tokens and whether the
prompt opens the thinking block come with the load and the admission, not by asking)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtime.chat.families import Family
from runtime.engine.api import EngineAPI
from runtime.events import GenerationRequest
from runtime.server import generation
from tests.server.conftest import API_KEY
from tests.server.scripted_engine import ScriptedEngine

AUTH = {"Authorization": f"Bearer {API_KEY}"}
R1 = Family("deepseek_r1", tools=True, reasoning="think")
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
ASK = [{"role": "user", "content": "Hi"}]
# One request per route that writes text; each asks for tools where its dialect has them,
# so the tool grammar (which needs the family and the call tokens) is built too.
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "tools": TOOLS}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 4,
                       "tools": [{"type": "function", "name": "f",
                                  "parameters": TOOLS[0]["function"]["parameters"]}]}),
    ("/v1/messages", {"messages": ASK, "max_tokens": 4,
                      "tools": [{"name": "f", "input_schema":
                                 TOOLS[0]["function"]["parameters"]}]}),
    ("/api/chat", {"messages": ASK, "stream": False, "tools": TOOLS}),
    ("/api/generate", {"prompt": "Hi", "stream": False}),
]
ENGINE_CALLS = ("status", "metrics", "submit", "render_chat", "tokenize", "embed", "load",
                "unload")


@pytest.fixture
def counted(scripted: ScriptedEngine) -> Iterator[tuple[ScriptedEngine, list[str]]]:
    """The scripted engine (a thinking model whose template opens `<think>`), every call
    the server makes on it recorded by name."""
    scripted.family = R1
    scripted.prompt = "<｜Assistant｜><think>\n"
    scripted.replies = ["Plan.</think>Hello"]
    calls: list[str] = []
    for name in ENGINE_CALLS:
        method = getattr(scripted, name)

        def record(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            calls.append(_name)
            return _method(*args, **kwargs)

        setattr(scripted, name, record)
    yield scripted, calls


@pytest.fixture
def scripted(scripted_engine: ScriptedEngine) -> ScriptedEngine:
    return scripted_engine


def test_every_route_answers_through_one_path_and_asks_the_engine_only_to_submit(
        counted: tuple[ScriptedEngine, list[str]], make_app: Callable[..., FastAPI],
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine, calls = counted
    submitted: list[GenerationRequest] = []
    real_submit = generation._submit

    async def submit(lease: Any, request: GenerationRequest, *args: Any) -> Any:
        submitted.append(request)
        return await real_submit(lease, request, *args)

    monkeypatch.setattr(generation, "_submit", submit)
    http = TestClient(make_app(engine), headers=AUTH)
    http.post(ROUTES[0][0], json={"model": "fake", **ROUTES[0][1]})  # the model resident
    calls.clear()
    submitted.clear()
    for path, body in ROUTES:
        response = http.post(path, json={"model": "fake", **body})
        assert response.status_code == 200, (path, response.text)
        assert calls == ["submit"], (path, calls)
        assert submitted[-1] is engine.requests[-1], path  # through generation's one submit
        calls.clear()
    assert len(submitted) == len(ROUTES)


def test_the_admission_says_the_reply_starts_in_thinking(
        counted: tuple[ScriptedEngine, list[str]], make_app: Callable[..., FastAPI]) -> None:
    engine, _ = counted
    http = TestClient(make_app(engine), headers=AUTH)
    reply = http.post("/v1/chat/completions", json={"model": "fake", "messages": ASK}).json()
    message = reply["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Plan.", "Hello")
    blocks = http.post("/v1/messages", json={"model": "fake", "messages": ASK,
                                             "max_tokens": 8}).json()["content"]
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in blocks] == \
        [("thinking", "Plan."), ("text", "Hello")]


def test_a_forced_call_of_a_thinking_model_carries_the_grammar_for_either_prompt(
        counted: tuple[ScriptedEngine, list[str]], make_app: Callable[..., FastAPI]) -> None:
    """The edge cannot know whether the template opened `<think>` (only the engine renders
    the prompt), so a forced call's grammar comes in both forms and the engine picks."""
    engine, _ = counted
    http = TestClient(make_app(engine), headers=AUTH)
    http.post("/v1/chat/completions", json={"model": "fake", "messages": ASK, "tools": TOOLS,
                                            "tool_choice": "required"})
    spec = engine.requests[-1].constraint
    assert spec is not None and spec.in_reasoning is not None
    assert spec.source != spec.in_reasoning.source


def test_the_engine_api_has_no_per_request_questions() -> None:
    """What the edge used to ask before each request is gone from the engine's face."""
    for name in ("template_family", "special_tokens"):
        assert not hasattr(EngineAPI, name)
