"""OpenAI's Responses API with the official `openai` client against a running server.

On the fake and scripted engines: responses parse in the client, whole and streamed (the
SDK's own `responses.stream` accumulation, and the raw events in OpenAI's order); input
text or items, instructions and sampling reach the engine's request; function tools come
back as `function_call` items (streamed as argument deltas), `function_call_output` items
go back to the template; reasoning comes back as a reasoning item; `text.format` is a
constraint; `include: ["message.output_text.logprobs"]` puts each token's logprobs on the
output text (streamed: on the deltas, adding up to the whole); storing is refused with a 400
that says why (store: false only); bad input is a one-line error in OpenAI's shape and the
server keeps serving. On the tiny model (and the default model, e2e): streamed equals whole
at temperature 0, logprobs included; on the tiny model with Qwen2.5's template, a forced call
validates against its schema and a round trip renders.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from runtime.server import ServerLimits
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import TARGET
from tests.server.conftest import API_KEY, R1, Served, serving
from tests.server.fake_engine import FAIL_MARKER, FakeEngine
from tests.server.scripted_engine import ScriptedEngine
from tests.server.sse_parse import parse_sse

STEM = "fake"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "Weather",
                     "parameters": WEATHER}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
LOGPROBS: list[Any] = ["message.output_text.logprobs"]



@pytest.fixture
def client(fake_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{fake_url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=60) as api:
        yield api


@pytest.fixture
def scripted(scripted_engine: ScriptedEngine,
             scripted_url: str) -> Iterator[tuple[ScriptedEngine, openai.OpenAI]]:
    with openai.OpenAI(base_url=f"{scripted_url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=60) as api:
        yield scripted_engine, api


def one_line_400(error: openai.APIStatusError) -> str:
    assert error.status_code == 400, error
    body = error.body
    assert isinstance(body, dict), body
    message = str(body["message"])
    assert body["code"] and message and "\n" not in message
    return message


# --- responses ------------------------------------------------------------------------------

def test_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"model": STEM, "input": "Hello", "max_output_tokens": 12,
                              "temperature": 0}
    whole = client.responses.create(**fields)
    assert whole.object == "response" and whole.status == "incomplete"
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text and whole.usage is not None and whole.usage.output_tokens == 12
    streamed = "".join(e.delta for e in client.responses.create(**fields, stream=True)
                       if e.type == "response.output_text.delta")
    assert streamed == whole.output_text


def test_the_sdk_stream_assembles_the_whole(
        scripted: tuple[ScriptedEngine, openai.OpenAI]) -> None:
    engine, client = scripted
    engine.replies = ["Hello there, how are you?"]
    whole = client.responses.create(model=STEM, input="Hello")
    assert whole.status == "completed" and whole.output_text == "Hello there, how are you?"
    with client.responses.stream(model=STEM, input="Hello") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.usage is not None and final.usage.output_tokens == whole.usage.output_tokens


def test_stream_events_come_in_openais_order(fake_url: str) -> None:
    raw = httpx.post(f"{fake_url}/v1/responses", headers=AUTH, json={
        "model": STEM, "input": "Hello", "max_output_tokens": 6, "stream": True})
    events = parse_sse(raw.text)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == events[-4][1]["text"]


def test_input_items_instructions_and_sampling_reach_the_engine(client: openai.OpenAI,
                                                                fake_engine: FakeEngine) -> None:
    client.responses.create(model=STEM, instructions="Be brief.", max_output_tokens=5,
                            temperature=0.4, top_p=0.6, store=False, input=[
                                {"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": [
                                    {"type": "output_text", "text": "Hello."}]},
                                {"role": "user", "content": [
                                    {"type": "input_text", "text": "Again"}]}])
    request = fake_engine.submitted[-1].request
    assert [(m.role, m.content) for m in request.messages or ()] == [
        ("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Again")]
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (5, 0.4, 0.6)


def test_text_format_is_a_constraint(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    client.responses.create(model=STEM, input="JSON please", max_output_tokens=4,
                            text={"format": {"type": "json_schema", "name": "w",
                                             "schema": WEATHER}})
    constraint = fake_engine.submitted[-1].request.constraint
    assert constraint is not None and constraint.kind == "json_schema"
    assert json.loads(constraint.source) == WEATHER


@pytest.mark.parametrize("fields", [{"store": True}, {"previous_response_id": "resp_1"},
                                    {"background": True}])
def test_storing_is_refused_saying_why(client: openai.OpenAI, fields: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=STEM, input="Hi", **fields)
    message = one_line_400(caught.value)
    assert "not stored" in message or "storing" in message
    if "previous_response_id" in fields:
        assert "store: false only" in message and "input" in message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_1")
    assert client.responses.create(model=STEM, input="Hi", max_output_tokens=2).output_text


# --- tools and reasoning --------------------------------------------------------------------

def test_a_call_is_a_function_call_item(scripted: tuple[ScriptedEngine, openai.OpenAI]) -> None:
    engine, client = scripted
    engine.replies = ["Let me look." + CALL]
    whole = client.responses.create(model=STEM, input="Weather in Oslo?", tools=TOOLS)
    message, call = whole.output
    assert message.type == "message" and whole.output_text == "Let me look."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Oslo"} and call.call_id
    with client.responses.stream(model=STEM, input="Weather in Oslo?", tools=TOOLS) as stream:
        final = stream.get_final_response()
    assert [(item.type, getattr(item, "arguments", None)) for item in final.output] == [
        ("message", None), ("function_call", call.arguments)]


@pytest.mark.parametrize(("choice", "forced"), [
    ("auto", False), ("required", True), ({"type": "function", "name": "get_weather"}, True),
    ("none", None)])
def test_tool_choice_becomes_the_constraint(scripted: tuple[ScriptedEngine, openai.OpenAI],
                                            choice: Any, forced: bool | None) -> None:
    engine, client = scripted
    client.responses.create(model=STEM, input="Hi", tools=TOOLS, tool_choice=choice)
    request = engine.requests[-1]
    if forced is None:
        assert request.constraint is None
    else:
        assert request.constraint is not None and (request.constraint.trigger is None) == forced


def test_a_round_trip_reaches_the_template(scripted: tuple[ScriptedEngine, openai.OpenAI]) -> None:
    engine, client = scripted
    client.responses.create(model=STEM, tools=TOOLS, input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Rain, 4 °C"}])
    messages = engine.requests[-1].messages or ()
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assistant, tool = messages[1], messages[2]
    assert assistant.reasoning == "Call the tool."
    assert (assistant.tool_calls[0].id, assistant.tool_calls[0].name) == ("call_1", "get_weather")
    assert (tool.tool_call_id, tool.name, tool.content) == ("call_1", "get_weather", "Rain, 4 °C")


def test_reasoning_is_a_reasoning_item(scripted: tuple[ScriptedEngine, openai.OpenAI]) -> None:
    engine, client = scripted
    engine.family = R1
    engine.replies = ["<think>\nThe user greets.\n</think>\n\nHello!"]
    whole = client.responses.create(model=STEM, input="Hi", reasoning={"effort": "low"})
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert [c.text for c in reasoning.content or ()] == ["The user greets."]
    assert whole.output_text == "Hello!"
    assert dict(engine.requests[-1].template_kwargs)["reasoning_effort"] == "low"
    events = list(client.responses.create(model=STEM, input="Hi", stream=True))
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and kinds[-1] == "response.completed"
    with client.responses.stream(model=STEM, input="Hi") as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == "Hello!"


# --- logprobs -------------------------------------------------------------------------------

def test_logprobs_ride_on_the_output_text(scripted: tuple[ScriptedEngine, openai.OpenAI]) -> None:
    engine, client = scripted
    engine.replies = ["Hello there"]  # six tokens of two characters (the scripted engine's)
    pieces = ["He", "ll", "o ", "th", "er", "e"]
    fields: dict[str, Any] = {"model": STEM, "input": "Hi", "include": LOGPROBS,
                              "top_logprobs": 2}
    whole = client.responses.create(**fields)
    (message,) = whole.output
    assert message.type == "message"
    entries = message.content[0].logprobs or []
    assert [e.token for e in entries] == pieces
    assert [e.logprob for e in entries] == [-0.5 * k for k in range(6)]
    assert [e.bytes for e in entries] == [list(p.encode()) for p in pieces]
    assert all(len(e.top_logprobs) == 2 for e in entries)
    assert engine.requests[-1].logprobs == 2
    events = list(client.responses.create(**fields, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [x.token for d in deltas for x in d.logprobs] == pieces
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [x.token for x in done.logprobs] == pieces
    final = events[-1]
    assert final.type == "response.completed"
    assert [x.token for x in final.response.output[0].content[0].logprobs or ()] == pieces
    plain = client.responses.create(model=STEM, input="Hi")
    assert not plain.output[0].content[0].logprobs and engine.requests[-1].logprobs is None


def test_logprobs_of_a_reply_with_a_call(scripted: tuple[ScriptedEngine, openai.OpenAI]) -> None:
    """Every generated token counts, as on the chat route: the call's tokens ride on the
    message's text."""
    engine, client = scripted
    engine.replies = ["Let me look." + CALL]
    whole = client.responses.create(model=STEM, input="Weather?", tools=TOOLS, include=LOGPROBS)
    message, call = whole.output
    assert call.type == "function_call"
    tokens = "".join(e.token for e in message.content[0].logprobs or ())
    assert tokens == "Let me look." + CALL
    events = list(client.responses.create(model=STEM, input="Weather?", tools=TOOLS,
                                          include=LOGPROBS, stream=True))
    streamed = "".join(x.token for e in events if e.type == "response.output_text.delta"
                       for x in e.logprobs)
    assert streamed == tokens


@pytest.mark.parametrize(("fields", "words"), [
    ({"top_logprobs": 3}, "include"),
    ({"include": LOGPROBS, "top_logprobs": 21}, "top_logprobs"),
    ({"include": LOGPROBS, "top_logprobs": "3"}, "top_logprobs"),
    ({"include": "message.output_text.logprobs"}, "include"),
    ({"include": [5]}, "include"),
])
def test_bad_logprobs_fields_are_a_one_line_400(client: openai.OpenAI, fields: dict[str, Any],
                                                words: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=STEM, input="Hi", **fields)
    assert words in one_line_400(caught.value)


def test_other_include_values_are_ignored(client: openai.OpenAI) -> None:
    """Codex and other clients send `reasoning.encrypted_content` with store: false."""
    reply = client.responses.create(model=STEM, input="Hi", max_output_tokens=3, store=False,
                                    include=["reasoning.encrypted_content"])
    assert reply.output_text and not reply.output[0].content[0].logprobs


# --- errors ---------------------------------------------------------------------------------

def test_an_unknown_model_is_404_listing_the_names(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="gpt-5", input="Hi")
    body = caught.value.body
    assert isinstance(body, dict) and "gpt-5" in body["message"] and "owner/repo:" in body["message"]
    assert client.responses.create(model=STEM, input="Hi", max_output_tokens=2).output_text


@pytest.mark.parametrize(("body", "words"), [
    ({"input": 5}, "input"),
    ({"input": None}, "input"),
    ({"max_output_tokens": "8"}, "max_output_tokens"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0: an image URL must be a data: URI"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "file_id is not supported"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "not stored"),
    ({"tools": [{"type": "web_search"}]}, "web_search"),
    ({"tools": TOOLS}, "tool"),  # the fake model's template has no call format
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "strnig"}}}}, "strnig"),
])
def test_bad_input_is_a_one_line_400(fake_url: str, body: dict[str, Any], words: str) -> None:
    fields = {"model": STEM, "input": "Hi", **body}
    response = httpx.post(f"{fake_url}/v1/responses", json=fields, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] and words in error["message"] and "\n" not in error["message"]
    assert httpx.post(f"{fake_url}/v1/responses", headers=AUTH, json={
        "model": STEM, "input": "Hi", "max_output_tokens": 2}).status_code == 200


def test_missing_model_and_an_engine_failure(client: openai.OpenAI, fake_url: str) -> None:
    missing = httpx.post(f"{fake_url}/v1/responses", json={"input": "Hi"}, headers=AUTH)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model=STEM, input=FAIL_MARKER)
    assert client.responses.create(model=STEM, input="Hi", max_output_tokens=2).output_text


# --- the real engine ------------------------------------------------------------------------

@pytest.fixture(params=["tiny", pytest.param("default", marks=pytest.mark.e2e)])
def real(request: pytest.FixtureRequest) -> Iterator[tuple[openai.OpenAI, str]]:
    served: Served = request.getfixturevalue(f"{request.param}_server")
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as api:
        yield api, served.engine.status().model.name


def test_real_streamed_equals_whole_at_t0(real: tuple[openai.OpenAI, str]) -> None:
    client, name = real
    fields: dict[str, Any] = {"model": name, "instructions": "You are terse.",
                              "input": "Name a colour.", "max_output_tokens": 16,
                              "temperature": 0}
    whole = client.responses.create(**fields)
    streamed = "".join(e.delta for e in client.responses.create(**fields, stream=True)
                       if e.type == "response.output_text.delta")
    assert streamed == whole.output_text
    assert whole.usage is not None and 0 < whole.usage.output_tokens <= 16


def test_real_logprobs_streamed_equal_whole_at_t0(real: tuple[openai.OpenAI, str]) -> None:
    client, name = real
    fields: dict[str, Any] = {"model": name, "input": "Name a colour.", "max_output_tokens": 12,
                              "temperature": 0, "include": LOGPROBS, "top_logprobs": 3}
    whole = client.responses.create(**fields)
    entries = [e for item in whole.output if item.type == "message"
               for e in item.content[0].logprobs or ()]
    assert whole.usage is not None and len(entries) == whole.usage.output_tokens
    for entry in entries:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert math.isclose(entry.logprob, values[0], abs_tol=1e-4)  # greedy takes the top one
    streamed = [x for e in client.responses.create(**fields, stream=True)
                if e.type == "response.output_text.delta" for x in e.logprobs]
    # The second request reuses the first's cached prompt cells: the same tokens, logits
    # equal up to llama.cpp's batch-shape rounding.
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert all(math.isclose(a.logprob, b.logprob, abs_tol=0.01)
               for a, b in zip(streamed, entries, strict=True))


@pytest.fixture(scope="module")
def hermes_server(llama_templates: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Served]:
    """The tiny model speaking Qwen2.5's template (a Hermes-style call format)."""
    template = (llama_templates / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    model = tiny_model_path(replace(TARGET, name="tiny-qwen25", chat_template=template))
    with serving(model, tmp_path_factory.mktemp("models"),
                 limits=ServerLimits(max_tokens=1024)) as served:
        yield served


def test_a_forced_call_and_round_trip_on_a_real_template(hermes_server: Served) -> None:
    name = hermes_server.engine.status().model.name
    with openai.OpenAI(base_url=f"{hermes_server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as client:
        fields: dict[str, Any] = {"model": name, "input": "Weather in Oslo?", "tools": TOOLS,
                                  "tool_choice": "required", "parallel_tool_calls": False,
                                  "temperature": 0, "max_output_tokens": 1000}
        whole = client.responses.create(**fields)
        (call,) = [item for item in whole.output if item.type == "function_call"]
        jsonschema.validate(json.loads(call.arguments), WEATHER)
        with client.responses.stream(**fields) as stream:
            final = stream.get_final_response()
        assert [i.arguments for i in final.output if i.type == "function_call"] == [call.arguments]
        reply = client.responses.create(model=name, tools=TOOLS, max_output_tokens=8, input=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Rain"}])
        assert reply.status in ("completed", "incomplete")
