"""Anthropic's Messages API with the official `anthropic` client against a running server.

On the fake and scripted engines: messages parse in the client, whole and streamed
(`messages.stream`, and the raw events in Anthropic's order); system, turns, stop
sequences and sampling reach the engine's request; tools come back as `tool_use` blocks
(streamed as `input_json_delta`), `tool_choice` becomes the same constraints the OpenAI
route makes, a `tool_use` / `tool_result` round trip reaches the template; thinking comes
back as thinking blocks; count_tokens counts the prompt; the key works as `x-api-key` and
Bearer; bad input is a one-line error in Anthropic's shape and the server keeps serving.
On the tiny model (and the default model, e2e): streamed equals whole at temperature 0; on
the tiny model with Qwen2.5's template, a forced call validates against its schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from runtime.server import ServerLimits
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import TARGET
from tests.server.conftest import API_KEY, R1, Served, serving
from tests.server.fake_engine import FAIL_MARKER, FakeEngine
from tests.server.scripted_engine import ScriptedEngine
from tests.server.sse_parse import parse_sse

STEM = "fake"
ASK = [{"role": "user", "content": "Hello"}]
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS: list[Any] = [{"name": "get_weather", "description": "Weather forecast",
                     "input_schema": WEATHER}]
T0 = {"temperature": 0}  # this SDK sends sampling through extra_body
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'



@pytest.fixture
def client(fake_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fake_url, api_key=API_KEY, max_retries=0, timeout=60) as api:
        yield api


@pytest.fixture
def scripted(scripted_engine: ScriptedEngine,
             scripted_url: str) -> Iterator[tuple[ScriptedEngine, anthropic.Anthropic]]:
    with anthropic.Anthropic(base_url=scripted_url, api_key=API_KEY, max_retries=0,
                             timeout=60) as api:
        yield scripted_engine, api


def one_line(error: anthropic.APIStatusError, status: int, kind: str) -> str:
    assert error.status_code == status, error
    body = error.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == kind
    message = str(body["error"]["message"])
    assert message and "\n" not in message
    return message


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


# --- messages -------------------------------------------------------------------------------

def test_whole_and_streamed_agree(client: anthropic.Anthropic) -> None:
    fields: dict[str, Any] = {"model": STEM, "max_tokens": 12, "messages": ASK,
                              "extra_body": T0}
    whole = client.messages.create(**fields)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == STEM
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 12
    assert text_of(whole)
    with client.messages.stream(**fields) as stream:
        final = stream.get_final_message()
    assert text_of(final) == text_of(whole)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == \
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)


def test_stream_events_come_in_anthropics_order(client: anthropic.Anthropic, fake_url: str) -> None:
    events = list(client.messages.create(model=STEM, max_tokens=6, messages=ASK, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]  # the client drops pings
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert all(e.delta.type == "text_delta" for e in events if e.type == "content_block_delta")
    raw = httpx.post(f"{fake_url}/v1/messages", headers={"x-api-key": API_KEY}, json={
        "model": STEM, "max_tokens": 6, "messages": ASK, "stream": True})
    named = [(name, data["type"]) for name, data in parse_sse(raw.text)]
    assert all(name == kind for name, kind in named)
    assert [name for name, _ in named][:2] == ["message_start", "ping"]


def test_system_turns_and_sampling_reach_the_engine(client: anthropic.Anthropic,
                                                    fake_engine: FakeEngine) -> None:
    client.messages.create(
        model=STEM, max_tokens=5, extra_body={"temperature": 0.4, "top_p": 0.6, "top_k": 7},
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        messages=[{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                  {"role": "user", "content": [{"type": "text", "text": "Again"}]}])
    request = fake_engine.submitted[-1].request
    assert [(m.role, m.content) for m in request.messages or ()] == [
        ("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Again")]
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (
        5, 0.4, 0.6, 7)


def test_a_stop_sequence_is_named(client: anthropic.Anthropic) -> None:
    whole = text_of(client.messages.create(model=STEM, max_tokens=12, messages=ASK,
                                           extra_body=T0))
    stop = whole[6]  # one character: the fake engine holds back no partial stop
    cut = client.messages.create(model=STEM, max_tokens=12, messages=ASK, extra_body=T0,
                                 stop_sequences=["@@", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert text_of(cut) == whole[:whole.index(stop)]
    with client.messages.stream(model=STEM, max_tokens=12, messages=ASK, extra_body=T0,
                                stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text_of(final)) == (
        "stop_sequence", stop, text_of(cut))


def test_count_tokens_counts_the_prompt(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=STEM, messages=ASK, system="Be brief.")
    reply = client.messages.create(model=STEM, max_tokens=2, messages=ASK, system="Be brief.")
    assert counted.input_tokens > 0
    assert counted.input_tokens == reply.usage.input_tokens + (
        reply.usage.cache_read_input_tokens or 0)


def test_the_key_as_x_api_key_or_bearer(fake_url: str) -> None:
    with anthropic.Anthropic(base_url=fake_url, auth_token=API_KEY, max_retries=0) as bearer:
        assert bearer.messages.create(model=STEM, max_tokens=2, messages=ASK).content
    with anthropic.Anthropic(base_url=fake_url, api_key="wrong", max_retries=0) as wrong, \
            pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model=STEM, max_tokens=2, messages=ASK)
    one_line(caught.value, 401, "authentication_error")


# --- tools and thinking ---------------------------------------------------------------------

def test_a_call_is_a_tool_use_block(scripted: tuple[ScriptedEngine, anthropic.Anthropic]) -> None:
    engine, client = scripted
    engine.replies = ["Let me look." + CALL]
    whole = client.messages.create(model=STEM, max_tokens=64, messages=ASK, tools=TOOLS)
    assert whole.stop_reason == "tool_use"
    text, use = whole.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Oslo"}
    assert use.id
    with client.messages.stream(model=STEM, max_tokens=64, messages=ASK, tools=TOOLS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("text", None), ("tool_use", {"city": "Oslo"})]


@pytest.mark.parametrize(("choice", "forced"), [
    ({"type": "auto"}, False), ({"type": "any"}, True),
    ({"type": "tool", "name": "get_weather"}, True), ({"type": "none"}, None)])
def test_tool_choice_becomes_the_constraint(scripted: tuple[ScriptedEngine, anthropic.Anthropic],
                                            choice: dict[str, Any], forced: bool | None) -> None:
    engine, client = scripted
    client.messages.create(model=STEM, max_tokens=64, messages=ASK, tools=TOOLS,
                           tool_choice=choice)  # type: ignore[arg-type]
    request = engine.requests[-1]
    assert request.tools[0]["function"]["parameters"] == WEATHER
    if forced is None:
        assert request.constraint is None
    else:
        assert request.constraint is not None and (request.constraint.trigger is None) == forced


def test_a_round_trip_reaches_the_template(
        scripted: tuple[ScriptedEngine, anthropic.Anthropic]) -> None:
    engine, client = scripted
    client.messages.create(model=STEM, max_tokens=16, tools=TOOLS, messages=[
        *ASK,
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Rain, 4 °C"},
            {"type": "text", "text": "And tomorrow?"}]}])
    messages = engine.requests[-1].messages or ()
    assert [m.role for m in messages] == ["user", "assistant", "tool", "user"]
    call = messages[1].tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments)) == ("toolu_1", "get_weather",
                                                               {"city": "Oslo"})
    tool = messages[2]
    assert (tool.tool_call_id, tool.name, tool.content) == ("toolu_1", "get_weather", "Rain, 4 °C")


def test_thinking_comes_back_as_thinking_blocks(
        scripted: tuple[ScriptedEngine, anthropic.Anthropic]) -> None:
    engine, client = scripted
    engine.family = R1
    engine.replies = ["<think>\nThe user greets.\n</think>\n\nHello!"]
    whole = client.messages.create(model=STEM, max_tokens=64, messages=ASK,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    thinking, text = whole.content
    assert thinking.type == "thinking" and thinking.thinking == "The user greets."
    assert text.type == "text" and text.text == "Hello!"
    assert dict(engine.requests[-1].template_kwargs)["enable_thinking"] is True
    events = list(client.messages.create(model=STEM, max_tokens=64, messages=ASK, stream=True))
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and deltas[-1] == "text_delta"
    with client.messages.stream(model=STEM, max_tokens=64, messages=ASK) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in final.content] == [("thinking", "The user greets."), ("text", "Hello!")]


# --- errors ---------------------------------------------------------------------------------

def test_max_tokens_is_required(client: anthropic.Anthropic, fake_url: str) -> None:
    raw = httpx.post(f"{fake_url}/v1/messages", headers={"x-api-key": API_KEY},
                     json={"model": STEM, "messages": ASK})
    assert raw.status_code == 400
    assert raw.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                     "message": "max_tokens: Field required"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=STEM, max_tokens=-1, messages=ASK)
    assert "max_tokens" in one_line(caught.value, 400, "invalid_request_error")


def test_max_tokens_zero_only_prefills(client: anthropic.Anthropic, fake_engine: FakeEngine) -> None:
    warmed = client.messages.create(model=STEM, max_tokens=0, messages=ASK)
    assert warmed.content == [] and warmed.stop_reason == "max_tokens"
    assert warmed.usage.output_tokens == 0 and warmed.usage.input_tokens > 0
    assert fake_engine.submitted[-1].request.sampling.max_tokens == 1
    later = client.messages.create(model=STEM, max_tokens=2, messages=ASK)
    assert later.usage.cache_read_input_tokens


def test_an_unknown_model_is_404_listing_the_names(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ASK)
    message = one_line(caught.value, 404, "not_found_error")
    assert "claude-sonnet-4-5" in message and "owner/repo:" in message
    assert client.messages.create(model=STEM, max_tokens=2, messages=ASK).content


@pytest.mark.parametrize(("body", "words"), [
    ({"max_tokens": "8"}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "content.0.source.type"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "aGk="}}]}]},
     "messages.0.content.0: not an image"),
    ({"messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "document blocks are not supported"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ({"messages": [*ASK, {"role": "assistant", "content": "Sure,"}]}, "prefill"),
    ({"stop_sequences": "###"}, "stop_sequences"),
    ({"temperature": -1}, "temperature"),
    ({"tools": TOOLS}, "tool"),  # the fake model's template has no call format
])
def test_bad_input_is_a_one_line_400(fake_url: str, body: dict[str, Any], words: str) -> None:
    fields = {"model": STEM, "max_tokens": 8, "messages": ASK, **body}
    response = httpx.post(f"{fake_url}/v1/messages", json=fields, headers={"x-api-key": API_KEY})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"] and "\n" not in error["error"]["message"]
    assert httpx.post(f"{fake_url}/v1/messages", headers={"x-api-key": API_KEY}, json={
        "model": STEM, "max_tokens": 2, "messages": ASK}).status_code == 200


def test_count_tokens_refuses_bad_input_in_anthropics_shape(client: anthropic.Anthropic,
                                                            fake_url: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.count_tokens(model="claude-x", messages=ASK)
    assert "claude-x" in one_line(caught.value, 404, "not_found_error")
    for body in ({"model": STEM}, {"model": STEM, "messages": "Hi"}, {"messages": ASK}):
        raw = httpx.post(f"{fake_url}/v1/messages/count_tokens", json=body,
                         headers={"x-api-key": API_KEY})
        assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    assert client.messages.count_tokens(model=STEM, messages=ASK).input_tokens > 0


def test_an_engine_failure_and_the_server_keeps_serving(client: anthropic.Anthropic) -> None:
    failing = [{"role": "user", "content": FAIL_MARKER}]
    with pytest.raises(anthropic.InternalServerError) as caught:
        client.messages.create(model=STEM, max_tokens=8, messages=failing)
    assert "internal error" in one_line(caught.value, 500, "api_error")
    assert client.messages.count_tokens(model=STEM, messages=ASK).input_tokens > 0


# --- the real engine ------------------------------------------------------------------------

@pytest.fixture(params=["tiny", pytest.param("default", marks=pytest.mark.e2e)])
def real(request: pytest.FixtureRequest) -> Iterator[tuple[anthropic.Anthropic, str]]:
    served: Served = request.getfixturevalue(f"{request.param}_server")
    with anthropic.Anthropic(base_url=served.url, api_key=API_KEY, max_retries=0,
                             timeout=120) as api:
        yield api, served.engine.status().model.name


def test_real_streamed_equals_whole_at_t0(real: tuple[anthropic.Anthropic, str]) -> None:
    client, name = real
    fields: dict[str, Any] = {"model": name, "max_tokens": 16, "extra_body": T0,
                              "system": "You are terse.",
                              "messages": [{"role": "user", "content": "Name a colour."}]}
    whole = client.messages.create(**fields)
    with client.messages.stream(**fields) as stream:
        final = stream.get_final_message()
    assert text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens == whole.usage.output_tokens
    text = text_of(whole)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if len(stop) == 2:  # the engine says which stop string ended the reply
        cut = client.messages.create(**fields, stop_sequences=["\x00never", stop])
        assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
        assert text_of(cut) == text[:text.index(stop)]


@pytest.fixture(scope="module")
def hermes_server(llama_templates: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Served]:
    """The tiny model speaking Qwen2.5's template (a Hermes-style call format)."""
    template = (llama_templates / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    model = tiny_model_path(replace(TARGET, name="tiny-qwen25", chat_template=template))
    with serving(model, tmp_path_factory.mktemp("models"),
                 limits=ServerLimits(max_tokens=1024)) as served:
        yield served


def test_a_forced_call_on_a_real_template(hermes_server: Served) -> None:
    name = hermes_server.engine.status().model.name
    with anthropic.Anthropic(base_url=hermes_server.url, api_key=API_KEY, max_retries=0,
                             timeout=120) as client:
        fields: dict[str, Any] = {
            "model": name, "max_tokens": 1000, "extra_body": T0, "messages": ASK,
            "tools": TOOLS, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
        whole = client.messages.create(**fields)
        assert whole.stop_reason == "tool_use"
        (use,) = [b for b in whole.content if b.type == "tool_use"]
        jsonschema.validate(use.input, WEATHER)
        with client.messages.stream(**fields) as stream:
            final = stream.get_final_message()
        assert [b.input for b in final.content if b.type == "tool_use"] == [use.input]
        reply = client.messages.create(model=name, max_tokens=8, tools=TOOLS, messages=[
            *ASK, {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "Rain, 4 °C"}]}])
        assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
