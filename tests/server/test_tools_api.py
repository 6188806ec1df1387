"""Tools and reasoning over HTTP with the official `openai` client.

On the scripted engine (replies written in the family's own syntax): calls come back as
`tool_calls` whole and streamed, thinking as `reasoning_content`, botched calls as content
with `finish_reason: "malformed_tool_call"`; what the request hands the engine (tools, the
constraint per `tool_choice`, template kwargs, the messages of a round trip); the 400s.
On the tiny model with Qwen2.5's real template (a Hermes-style call format): forced calls
whose arguments validate against the function's schema, streaming equal to the whole reply,
and a full round trip rendered through the template.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtime.chat.families import PLAIN
from runtime.events import ChatMessage, ToolCall
from runtime.server import ServerLimits
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import TARGET
from tests.server.conftest import API_KEY, R1, Served, ServerThread, loaded_fake, serving
from tests.server.scripted_engine import ScriptedEngine


def model_of(api: openai.OpenAI) -> str:
    """The id of the one model the server has loaded."""
    return api.models.list().data[0].id


AUTH = {"Authorization": f"Bearer {API_KEY}"}
WEATHER_PARAMS = {"type": "object",
                  "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]},
                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city", "days"], "additionalProperties": False}
TIME_PARAMS = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
               "required": ["zone"], "additionalProperties": False}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                      "parameters": TIME_PARAMS}},
]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "Weather in Oslo for 2 days?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'


def start(models_dir: Path, **kwargs: Any) -> ScriptedEngine:
    return loaded_fake(ScriptedEngine(**kwargs), models_dir)


@pytest.fixture
def scripted(scripted_engine: ScriptedEngine) -> ScriptedEngine:
    """A Hermes-family model whose replies a test sets in `engine.replies`."""
    return scripted_engine


@pytest.fixture
def client(scripted_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{scripted_url}/v1", api_key=API_KEY, max_retries=0) as api:
        yield api


@pytest.fixture
def http(scripted: ScriptedEngine, make_app: Callable[..., FastAPI]) -> TestClient:
    return TestClient(make_app(scripted), headers=AUTH)


def streamed(client: openai.OpenAI, **fields: Any) -> tuple[dict[str, Any], str | None]:
    """A streamed reply assembled as a client does: content, reasoning, calls by index."""
    message: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": {}}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **fields):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        message["content"] += delta.content or ""
        message["reasoning_content"] += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or ():
            slot = message["tool_calls"].setdefault(call.index, {"id": "", "name": "",
                                                                 "arguments": ""})
            slot["id"] += call.id or ""
            if call.function is not None:
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    return message, finish


def calls_of(message: Any) -> list[dict[str, str]]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.tool_calls or ()]


# --- replies read back ----------------------------------------------------------------------

def test_a_call_comes_back_as_tool_calls(client: openai.OpenAI, scripted: ScriptedEngine) -> None:
    scripted.replies = [CALL]
    reply = client.chat.completions.create(model="fake", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or ()
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 2}


def test_streamed_calls_assemble_to_the_whole_reply(client: openai.OpenAI,
                                                    scripted: ScriptedEngine) -> None:
    scripted.replies = ["Checking both. " + CALL + "\n" + CALL2]
    fields = {"model": "fake", "messages": ASK, "tools": TOOLS}
    whole = client.chat.completions.create(**fields).choices[0]  # type: ignore[call-overload]
    assert whole.finish_reason == "tool_calls"
    assert (whole.message.content or "").strip() == "Checking both."
    message, finish = streamed(client, **fields)
    assert finish == "tool_calls"
    assert message["content"].strip() == "Checking both."
    names = [(c["name"], json.loads(c["arguments"])) for c in message["tool_calls"]]
    assert names == [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {"zone": "UTC"})]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls_of(whole.message)] == names
    assert all(c["id"].startswith("call_") for c in message["tool_calls"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_botched_call_is_content_with_its_own_finish_reason(
        client: openai.OpenAI, scripted: ScriptedEngine, stream: bool) -> None:
    botched = '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'
    scripted.replies = [botched]
    fields = {"model": "fake", "messages": ASK, "tools": TOOLS}
    if stream:
        message, finish = streamed(client, **fields)
        content, calls = message["content"], message["tool_calls"]
    else:
        choice = client.chat.completions.create(**fields).choices[0]  # type: ignore[call-overload]
        content, calls, finish = choice.message.content, choice.message.tool_calls, choice.finish_reason
    assert finish == "malformed_tool_call"
    assert content == botched
    assert not calls


@pytest.mark.parametrize("stream", [False, True])
def test_calls_before_a_botched_one_stay_calls(client: openai.OpenAI, scripted: ScriptedEngine,
                                               stream: bool) -> None:
    botched = '<tool_call>\n{"name": "get_time", "arguments": {"zone": '
    scripted.replies = [CALL + "\n" + botched]
    fields = {"model": "fake", "messages": ASK, "tools": TOOLS}
    if stream:
        message, finish = streamed(client, **fields)
        content, names = message["content"], [c["name"] for c in message["tool_calls"]]
    else:
        choice = client.chat.completions.create(**fields).choices[0]  # type: ignore[call-overload]
        content, finish = choice.message.content, choice.finish_reason
        names = [c["name"] for c in calls_of(choice.message)]
    assert finish == "malformed_tool_call"
    assert names == ["get_weather"]
    assert content == botched


def test_with_tool_choice_none_call_text_stays_content(client: openai.OpenAI,
                                                      scripted: ScriptedEngine) -> None:
    scripted.replies = [CALL]
    reply = client.chat.completions.create(model="fake", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                           tool_choice="none")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == CALL
    request = scripted.requests[-1]
    assert request.constraint is None and len(request.tools) == 2  # rendered, not forced


def test_the_tool_choice_decides_the_constraint(http: TestClient, scripted: ScriptedEngine) -> None:
    body = {"messages": ASK, "tools": TOOLS}
    triggers = {}
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_time"}}):
        assert http.post("/v1/chat/completions",
                         json={**body, "tool_choice": choice}).status_code == 200
        constraint = scripted.requests[-1].constraint
        assert constraint is not None
        triggers[json.dumps(choice)] = constraint.trigger
    assert triggers['"auto"'], "auto is lazy: free text until the call marker"
    assert triggers['"required"'] is None
    assert triggers[json.dumps({"type": "function", "function": {"name": "get_time"}})] is None
    assert scripted.requests[-1].tools == tuple(TOOLS)


def test_thinking_goes_to_reasoning_content(models_dir: Path,
                                            make_app: Callable[..., FastAPI]) -> None:
    engine = start(models_dir, family=R1,
                   replies=["<think>Oslo is cold.</think>Bring a coat."])
    try:
        with ServerThread(make_app(engine)) as server, \
                openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0) as api:
            whole = api.chat.completions.create(model="fake", messages=ASK)  # type: ignore[arg-type]
            message = whole.choices[0].message
            assert message.content == "Bring a coat."
            assert getattr(message, "reasoning_content", None) == "Oslo is cold."
            parts, finish = streamed(api, model="fake", messages=ASK)
            assert (parts["reasoning_content"], parts["content"], finish) == (
                "Oslo is cold.", "Bring a coat.", "stop")

            # A template that opens <think> itself: the reply starts inside it.
            engine.prompt = "<｜Assistant｜><think>\n"
            engine.replies = ["Oslo is cold.</think>Bring a coat."]
            message = api.chat.completions.create(model="fake", messages=ASK).choices[0].message  # type: ignore[arg-type]
            assert (getattr(message, "reasoning_content", None) or "").strip() == "Oslo is cold."
            assert message.content == "Bring a coat."
    finally:
        engine.stop()


def test_a_plain_reply_has_no_reasoning_field(http: TestClient, scripted: ScriptedEngine) -> None:
    scripted.replies = ["Just text."]
    message = http.post("/v1/chat/completions", json={"messages": ASK}).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Just text."}


# --- what the request hands the engine ------------------------------------------------------

def test_a_round_trip_reaches_the_engine_as_typed_messages(http: TestClient,
                                                           scripted: ScriptedEngine) -> None:
    messages = [*ASK,
                {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "get_weather",
                                              "arguments": '{"city": "Oslo", "days": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                 "content": "Rain, 4 °C"}]
    response = http.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS})
    assert response.status_code == 200, response.text
    _, assistant, tool = scripted.requests[-1].messages
    assert assistant == ChatMessage("assistant", "", tool_calls=(
        ToolCall("get_weather", '{"city": "Oslo", "days": 2}', "call_1"),), reasoning="Use the tool.")
    assert tool == ChatMessage("tool", "Rain, 4 °C", tool_call_id="call_1", name="get_weather")


def test_template_kwargs_and_reasoning_effort_reach_the_template(
        http: TestClient, scripted: ScriptedEngine) -> None:
    response = http.post("/v1/chat/completions", json={
        "messages": ASK, "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False}})
    assert response.status_code == 200, response.text
    assert dict(scripted.requests[-1].template_kwargs) == {"reasoning_effort": "low",
                                                            "enable_thinking": False}


def test_models_list_says_family_and_capabilities(client: openai.OpenAI) -> None:
    (model,) = client.models.list().data
    extra = model.model_extra or {}
    assert extra["outrider"]["chat_family"] == "hermes"
    assert extra["outrider"]["capabilities"] == ["chat", "tools", "structured_output"]


# --- refusals ----------------------------------------------------------------------------

def one_line_400(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] and error["message"] and "\n" not in error["message"]
    return str(error["message"])


BAD_PARAMS = {"type": "object", "properties": {"x": {"type": "strnig"}}}


@pytest.mark.parametrize(("fields", "words"), [
    ({"tool_choice": {"type": "function", "function": {"name": "launch"}}}, "launch"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD_PARAMS}}]}, "f"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD_PARAMS}}],
      "tool_choice": "none"}, "f"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "unique"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tools": [], "tool_choice": "required"}, "no tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "one of them"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "only assistant"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
])
def test_bad_tools_are_a_one_line_400_and_the_server_goes_on(
        http: TestClient, scripted: ScriptedEngine, fields: dict[str, Any], words: str) -> None:
    body = {"messages": ASK, "tools": TOOLS, **fields}
    assert words in one_line_400(http.post("/v1/chat/completions", json=body))
    assert scripted.requests == []
    assert http.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS}).status_code == 200


def test_tools_on_a_model_without_a_call_format_are_400(models_dir: Path,
                                                       make_app: Callable[..., FastAPI]) -> None:
    engine = start(models_dir, family=PLAIN)
    try:
        http = TestClient(make_app(engine), headers=AUTH)
        message = one_line_400(http.post("/v1/chat/completions",
                                         json={"messages": ASK, "tools": TOOLS}))
        assert "tool" in message and "plain" in message
        assert http.post("/v1/chat/completions", json={"messages": ASK}).status_code == 200
    finally:
        engine.stop()


# --- the tiny model with a real Hermes-style template ---------------------------------------

@pytest.fixture(scope="module")
def hermes_server(llama_templates: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Served]:
    """The tiny model speaking Qwen2.5's template. Its random weights pad a forced call's JSON
    with whitespace wherever the grammar allows some, so calls take a few hundred tokens."""
    template = (llama_templates / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    model = tiny_model_path(replace(TARGET, name="tiny-qwen25", chat_template=template))
    with serving(model, tmp_path_factory.mktemp("models"),
                 limits=ServerLimits(max_tokens=1024)) as served:
        yield served


@pytest.fixture
def tiny(hermes_server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{hermes_server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as api:
        yield api


def test_the_tiny_qwen_template_is_detected_as_hermes(tiny: openai.OpenAI) -> None:
    (model,) = tiny.models.list().data
    outrider = (model.model_extra or {})["outrider"]
    assert outrider["chat_family"] == "hermes"
    assert "tools" in outrider["capabilities"]


# The one-parameter function: fewest places for the random model's whitespace.
GET_TIME = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize("tool_choice", ["required", GET_TIME])
def test_a_forced_call_always_validates_against_its_schema(tiny: openai.OpenAI,
                                                           tool_choice: Any) -> None:
    for seed in range(3):
        reply = tiny.chat.completions.create(
            model=model_of(tiny), messages=ASK, tools=TOOLS, tool_choice=tool_choice,  # type: ignore[arg-type]
            parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=1000)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls or ()
        if isinstance(tool_choice, dict):
            assert call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_streamed_calls_equal_the_whole_at_t0(tiny: openai.OpenAI) -> None:
    fields = {"model": model_of(tiny), "messages": ASK, "tools": TOOLS, "tool_choice": GET_TIME,
              "parallel_tool_calls": False, "temperature": 0.0, "seed": 7, "max_tokens": 1000}
    whole = tiny.chat.completions.create(**fields).choices[0]  # type: ignore[call-overload]
    message, finish = streamed(tiny, **fields)
    assert finish == whole.finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in message["tool_calls"]] == [
        (c["name"], c["arguments"]) for c in calls_of(whole.message)]


def test_a_round_trip_renders_through_the_real_template(tiny: openai.OpenAI) -> None:
    first = tiny.chat.completions.create(model=model_of(tiny), messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                         tool_choice=GET_TIME, parallel_tool_calls=False,
                                         temperature=0.0, max_tokens=1000).choices[0].message
    (call,) = first.tool_calls or ()
    history = [*ASK,
               {"role": "assistant", "content": first.content,
                "tool_calls": [{"id": call.id, "type": "function",
                                "function": {"name": call.function.name,
                                             "arguments": call.function.arguments}}]},
               {"role": "tool", "tool_call_id": call.id, "content": "Rain, 4 °C"}]
    reply = tiny.chat.completions.create(model=model_of(tiny), messages=history, tools=TOOLS,  # type: ignore[arg-type]
                                         max_tokens=16, temperature=0.0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls",
                                              "malformed_tool_call")


def test_auto_never_fails_the_request(tiny: openai.OpenAI) -> None:
    for seed in range(4):
        choice = tiny.chat.completions.create(
            model=model_of(tiny), messages=ASK, tools=TOOLS, temperature=1.0, seed=seed,  # type: ignore[arg-type]
            max_tokens=48).choices[0]
        assert choice.finish_reason in ("stop", "length", "tool_calls", "malformed_tool_call")
        for call in choice.message.tool_calls or ():
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
