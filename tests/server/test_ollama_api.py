"""Ollama's API with the official `ollama` client against a running server.

On the fake and scripted engines: every route parses in the client (version, list, show,
ps, chat, generate, pull), streamed text equals the whole reply, options / format / think /
tools reach the engine's request as they would from any other client, thinking and calls
come back in Ollama's fields, bad input is a one-line `{"error": ...}` with its status and
the server keeps serving, and Outrider's own `/api/*` routes keep working beside Ollama's.
`/api/pull` runs against the local HF-compatible hub. On the tiny model (and the default
model, e2e): streamed equals whole at temperature 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)
from tests.hubserver.repos import TINY_REPO
from tests.hubserver.server import FakeHub
from tests.server.conftest import API_KEY, R1, Served, fake_gguf
from tests.server.fake_engine import FAIL_MARKER, FakeEngine
from tests.server.scripted_engine import ScriptedEngine

AUTH = {"Authorization": f"Bearer {API_KEY}"}
NAME = "owner/repo:Q4_0"  # the fake model's Ollama name (models/owner/repo/fake-Q4_0.gguf)
STEM = "fake-Q4_0"
ASK = [{"role": "user", "content": "Hello"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'



@pytest.fixture
def fake_stem() -> str:
    return STEM  # the fake model's file: models/owner/repo/fake-Q4_0.gguf


@pytest.fixture
def client(fake_url: str) -> Iterator[ollama.Client]:
    with ollama.Client(host=fake_url, headers=AUTH, timeout=60) as api:
        yield api


@pytest.fixture
def scripted(scripted_engine: ScriptedEngine,
             scripted_url: str) -> Iterator[tuple[ScriptedEngine, ollama.Client]]:
    """The scripted Hermes-family model (tests set `engine.replies` and `engine.family`)."""
    with ollama.Client(host=scripted_url, headers=AUTH, timeout=60) as api:
        yield scripted_engine, api


def error_of(call: Callable[[], Any], status: int) -> str:
    """The one-line message of an Ollama error with this status."""
    with pytest.raises(ollama.ResponseError) as caught:
        call()
    assert caught.value.status_code == status, caught.value
    message = str(caught.value.error)
    assert message and "\n" not in message and not message.startswith("{")
    return message


# --- models ---------------------------------------------------------------------------------

def test_version_list_show_and_ps_parse_in_the_client(client: ollama.Client, fake_url: str) -> None:
    version = httpx.get(f"{fake_url}/api/version", headers=AUTH).json()
    assert version["version"].count(".") == 2
    (model,) = client.list().models
    assert model.model == NAME and model.size and model.size > 0
    assert model.details is not None and model.details.format == "gguf"
    assert model.details.family == "llama" and model.modified_at is not None
    for name in (NAME, "owner/repo:q4_0", STEM, f"{STEM}:latest", f"{STEM}.gguf",
                 "owner/repo/fake-Q4_0.gguf"):
        shown = client.show(name)
        assert shown.details is not None and shown.details.quantization_level == "F32"
        assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
        assert shown.capabilities == ["completion"]
        assert "<|im_start|>" in (shown.template or "")
    (resident,) = client.ps().models
    assert resident.model == NAME and resident.context_length == 4096
    assert resident.size and resident.size > 0 and resident.size_vram == 0


def test_library_models_not_loaded_are_listed_and_shown(client: ollama.Client,
                                                        models_dir: Path) -> None:
    fake_gguf(models_dir / "other" / "Other-GGUF" / "other-Q8_0.gguf")
    names = [m.model for m in client.list().models]
    assert names == [NAME, "other/Other-GGUF:Q8_0"]  # the served one first
    assert client.show("other/Other-GGUF:Q8_0").details is not None
    assert [m.model for m in client.ps().models] == [NAME]
    message = error_of(lambda: client.chat("other/Other-GGUF:Q8_0", messages=ASK), 404)
    assert "not loaded" in message and "/api/load" in message


# --- chat and generate ----------------------------------------------------------------------

def test_chat_whole_and_streamed_agree(client: ollama.Client) -> None:
    options = {"num_predict": 12, "temperature": 0}
    whole = client.chat(NAME, messages=ASK, options=options)
    assert whole.done and whole.done_reason == "length"
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.eval_count == 12 and whole.prompt_eval_count
    assert whole.total_duration and whole.eval_duration is not None
    parts = list(client.chat(NAME, messages=ASK, options=options, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 12


def test_generate_whole_streamed_and_raw(client: ollama.Client, fake_engine: FakeEngine) -> None:
    options = {"num_predict": 10, "temperature": 0}
    whole = client.generate(NAME, "Once upon a time", system="Tell tales.", options=options)
    streamed = "".join(p.response for p in client.generate(NAME, "Once upon a time",
                                                           system="Tell tales.",
                                                           options=options, stream=True))
    assert whole.response and streamed == whole.response
    messages = fake_engine.submitted[-1].request.messages or ()
    assert [(m.role, m.content) for m in messages] == [("system", "Tell tales."),
                                                       ("user", "Once upon a time")]
    client.generate(NAME, "Once upon a time", raw=True, options=options)
    assert fake_engine.submitted[-1].request.prompt == "Once upon a time"


def test_options_reach_the_engine(client: ollama.Client, fake_engine: FakeEngine) -> None:
    client.chat(NAME, messages=ASK, options={
        "num_predict": 7, "temperature": 0.3, "top_k": 5, "top_p": 0.5, "min_p": 0.1,
        "seed": 42, "stop": ["\n\n"], "repeat_penalty": 1.2, "repeat_last_n": 16,
        "num_ctx": 2048, "num_gpu": 99, "num_thread": 4}, keep_alive="5m")
    sampling = fake_engine.submitted[-1].request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_k, sampling.top_p,
            sampling.min_p, sampling.seed, sampling.stop, sampling.repeat_penalty,
            sampling.penalty_last_n) == (7, 0.3, 5, 0.5, 0.1, 42, ("\n\n",), 1.2, 16)
    client.chat(NAME, messages=ASK, options={"num_predict": -1})
    assert fake_engine.submitted[-1].request.sampling.max_tokens == 2048  # the server default


def test_format_is_a_constraint(client: ollama.Client, fake_engine: FakeEngine) -> None:
    client.chat(NAME, messages=ASK, format="json", options={"num_predict": 4})
    constraint = fake_engine.submitted[-1].request.constraint
    assert constraint is not None and constraint.kind == "json_object"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    client.generate(NAME, "Count", format=schema, options={"num_predict": 4})
    constraint = fake_engine.submitted[-1].request.constraint
    assert constraint is not None and constraint.kind == "json_schema"
    assert json.loads(constraint.source) == schema


def test_logprobs_ride_on_each_object(scripted: tuple[ScriptedEngine, ollama.Client]) -> None:
    engine, client = scripted
    engine.replies = ["Hello there"]  # six tokens of two characters (the scripted engine's)
    whole = client.chat(NAME, messages=ASK, logprobs=True, top_logprobs=2)
    assert [e.token for e in whole.logprobs or ()] == ["He", "ll", "o ", "th", "er", "e"]
    assert [e.logprob for e in whole.logprobs or ()] == [-0.5 * k for k in range(6)]
    assert all(len(e.top_logprobs or ()) == 2 for e in whole.logprobs or ())
    assert engine.requests[-1].logprobs == 2
    parts = list(client.generate(NAME, "Hi", logprobs=True, stream=True))
    assert [e.token for p in parts for e in p.logprobs or ()] == [
        e.token for e in whole.logprobs or ()]
    assert client.chat(NAME, messages=ASK).logprobs is None


def test_a_model_without_messages_or_prompt_is_loaded(client: ollama.Client) -> None:
    assert client.chat(NAME, messages=[]).done_reason == "load"
    assert client.generate(NAME, "").done_reason == "load"


def test_thinking_is_split_into_its_field(scripted: tuple[ScriptedEngine, ollama.Client]) -> None:
    engine, client = scripted
    engine.family = R1
    engine.replies = ["<think>\nThe user greets.\n</think>\n\nHello!"]
    whole = client.chat(NAME, messages=ASK, think=True)
    assert (whole.message.thinking, whole.message.content) == ("The user greets.", "Hello!")
    assert dict(engine.requests[-1].template_kwargs)["enable_thinking"] is True
    parts = list(client.chat(NAME, messages=ASK, think=False, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "The user greets."
    assert "".join(p.message.content or "" for p in parts) == "Hello!"
    assert dict(engine.requests[-1].template_kwargs)["enable_thinking"] is False
    generated = client.generate(NAME, "Hi", think=True)
    assert (generated.thinking, generated.response) == ("The user greets.", "Hello!")


def test_tool_calls_come_back_with_object_arguments(
        scripted: tuple[ScriptedEngine, ollama.Client]) -> None:
    engine, client = scripted
    engine.replies = ["Let me look." + CALL]
    whole = client.chat(NAME, messages=ASK, tools=TOOLS)
    (call,) = whole.message.tool_calls or ()
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Oslo"}
    assert whole.message.content == "Let me look." and whole.done_reason == "stop"
    assert engine.requests[-1].tools[0]["function"]["name"] == "get_weather"
    parts = list(client.chat(NAME, messages=ASK, tools=TOOLS, stream=True))
    streamed = [c for p in parts for c in p.message.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        ("get_weather", {"city": "Oslo"})]


def test_a_tool_round_trip_reaches_the_template(
        scripted: tuple[ScriptedEngine, ollama.Client]) -> None:
    engine, client = scripted
    history = [*ASK,
               {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
               {"role": "tool", "content": "Rain, 4 °C", "tool_name": "get_weather"}]
    client.chat(NAME, messages=history, tools=TOOLS)
    messages = engine.requests[-1].messages or ()
    assistant, tool = messages[1], messages[2]
    assert assistant.tool_calls[0].name == "get_weather"
    assert json.loads(assistant.tool_calls[0].arguments) == {"city": "Oslo"}
    assert (tool.role, tool.content, tool.name) == ("tool", "Rain, 4 °C", "get_weather")


def test_embed_and_the_older_embeddings(client: ollama.Client, fake_url: str) -> None:
    both = client.embed(NAME, input=["a cat", "a kitten"])
    assert len(both.embeddings) == 2 and both.prompt_eval_count == len("a cat") + len("a kitten")
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-5 for v in both.embeddings)
    one = client.embeddings(NAME, prompt="a cat")
    assert list(one.embedding) == list(both.embeddings[0])
    assert client.embed(NAME, input="a cat").embeddings[0] == both.embeddings[0]
    assert "dimensions" in error_of(lambda: client.embed(NAME, input="x", dimensions=4), 400)
    assert "empty" in error_of(lambda: client.embed(NAME, input=[]), 400)
    assert NAME in error_of(lambda: client.embed("nomic-embed-text", input="x"), 404)


# --- errors ---------------------------------------------------------------------------------

def test_an_unknown_model_is_404_listing_the_names(client: ollama.Client) -> None:
    for call in (lambda: client.chat("llama3", messages=ASK),
                 lambda: client.generate("llama3", "Hi"), lambda: client.show("llama3")):
        message = error_of(call, 404)
        assert "llama3" in message and NAME in message
    assert client.chat(NAME, messages=ASK, options={"num_predict": 2}).done


@pytest.mark.parametrize(("body", "words"), [
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": ASK, "options": {"temperature": "hot"}}, "options.temperature"),
    ({"messages": ASK, "options": {"temperature": -1}}, "options.temperature"),
    ({"messages": ASK, "options": {"num_ctx": 100000}}, "num_ctx"),
    ({"messages": ASK, "options": {"mirostat": 2}}, "mirostat"),
    ({"messages": ASK, "format": "yaml"}, "format"),
    ({"messages": ASK, "format": {"type": "object", "properties": {"x": {"type": "strnig"}}}},
     "strnig"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "messages.0.images.0: not an image"),
    ({"messages": ASK, "tools": TOOLS}, "tool"),  # the fake model's template has no calls
    ({"messages": ASK, "stream": "yes"}, "stream"),
])
def test_bad_input_is_a_one_line_400(fake_url: str, body: dict[str, Any], words: str) -> None:
    response = httpx.post(f"{fake_url}/api/chat", json={"model": NAME, **body}, headers=AUTH)
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    assert isinstance(message, str) and words in message and "\n" not in message
    assert httpx.post(f"{fake_url}/api/chat", headers=AUTH, json={
        "model": NAME, "messages": ASK, "stream": False}).status_code == 200


@pytest.mark.parametrize(("path", "body"), [
    ("/api/chat", {"messages": ASK}), ("/api/generate", {"prompt": "Hi"}),
    ("/api/show", {}), ("/api/embed", {"input": "Hi"}), ("/api/embeddings", {"prompt": "Hi"}),
    ("/api/pull", {})])
def test_every_route_refuses_a_missing_or_mistyped_model(fake_url: str, path: str,
                                                         body: dict[str, Any]) -> None:
    for model in ({}, {"model": 5}, {"model": ["x"]}):
        response = httpx.post(f"{fake_url}{path}", json={**body, **model}, headers=AUTH)
        assert response.status_code == 400, (path, model, response.text)
        message = response.json()["error"]
        assert isinstance(message, str) and "model" in message and "\n" not in message
    assert httpx.get(f"{fake_url}/api/tags", headers=AUTH).status_code == 200


def test_missing_model_wrong_key_and_unknown_route_in_ollama_shape(fake_url: str) -> None:
    missing = httpx.post(f"{fake_url}/api/chat", json={"messages": ASK}, headers=AUTH)
    assert missing.status_code == 400 and "model" in missing.json()["error"]
    unauthorized = httpx.get(f"{fake_url}/api/tags")
    assert unauthorized.status_code == 401 and "API key" in unauthorized.json()["error"]
    unknown = httpx.post(f"{fake_url}/api/create", json={"model": "x"}, headers=AUTH)
    assert unknown.status_code == 404 and isinstance(unknown.json()["error"], str)


def test_an_engine_failure_is_an_error_and_the_server_keeps_serving(client: ollama.Client) -> None:
    failing = [{"role": "user", "content": FAIL_MARKER}]
    assert "internal error" in error_of(lambda: client.chat(NAME, messages=failing), 500)
    with pytest.raises(ollama.ResponseError):
        list(client.chat(NAME, messages=failing, stream=True))
    assert client.chat(NAME, messages=ASK, options={"num_predict": 3}).eval_count == 3


# --- Outrider's own /api/ routes beside Ollama's -------------------------------------------

def test_outriders_own_routes_still_work(fake_url: str, models_dir: Path) -> None:
    status = httpx.get(f"{fake_url}/api/status", headers=AUTH).json()
    assert status["state"] == "ready" and status["model"]["name"] == STEM
    assert "decode_tokens_per_s" in httpx.get(f"{fake_url}/api/metrics", headers=AUTH).json()
    refused = httpx.post(f"{fake_url}/api/load", json={"model_path": "/etc/passwd"}, headers=AUTH)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "path_not_allowed"  # OpenAI's shape, as before
    path = str(models_dir / "owner" / "repo" / f"{STEM}.gguf")
    with httpx.stream("POST", f"{fake_url}/api/load", json={"model_path": path, "n_ctx": 1024},
                      headers=AUTH, timeout=30) as load:
        assert load.status_code == 200 and "loaded" in load.read().decode()
    assert httpx.get(f"{fake_url}/api/ps", headers=AUTH).json()["models"][0]["context_length"] == 1024


# --- pull through the download manager -----------------------------------------------------

def test_pull_streams_ollama_progress_into_the_library(client: ollama.Client, models_dir: Path,
                                                       fake_hub: FakeHub) -> None:  # noqa: F811
    lines = list(client.pull(f"hf.co/{TINY_REPO}:Q4_K_M", stream=True))
    statuses = [line.status for line in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    progress = [line for line in lines if line.digest]
    assert progress and all(line.digest.startswith("sha256:") for line in progress)
    assert progress[-1].completed == progress[-1].total > 0
    assert (models_dir / TINY_REPO / "tiny-Q4_K_M.gguf").stat().st_size == progress[-1].total
    assert f"{TINY_REPO}:Q4_K_M" in [m.model for m in client.list().models]
    sent = fake_hub.stats(TINY_REPO, "tiny-Q4_K_M.gguf").bytes_sent
    assert sent == progress[-1].total
    assert client.pull(f"{TINY_REPO}:Q4_K_M").status == "success"  # already there: no bytes
    assert fake_hub.stats(TINY_REPO, "tiny-Q4_K_M.gguf").bytes_sent == sent


def test_pull_of_what_the_hub_lacks_is_404(client: ollama.Client,
                                           fake_hub: FakeHub) -> None:  # noqa: F811
    assert "nobody/Nothing-GGUF" in error_of(lambda: client.pull("nobody/Nothing-GGUF:Q4_0"), 404)
    assert "Q2_K" in error_of(lambda: client.pull(f"{TINY_REPO}:Q2_K"), 404)
    assert "owner/name" in error_of(lambda: client.pull("llama3"), 400)


# --- the real engine ------------------------------------------------------------------------

@pytest.fixture(params=["tiny", pytest.param("default", marks=pytest.mark.e2e)])
def real(request: pytest.FixtureRequest) -> Iterator[tuple[ollama.Client, str]]:
    served: Served = request.getfixturevalue(f"{request.param}_server")
    with ollama.Client(host=served.url, headers=AUTH, timeout=120) as api:
        yield api, served.engine.status().model.name


def test_real_streamed_equals_whole_at_t0(real: tuple[ollama.Client, str]) -> None:
    client, name = real
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."}]
    options = {"num_predict": 16, "temperature": 0, "seed": 3}
    whole = client.chat(name, messages=messages, options=options)
    parts = list(client.chat(name, messages=messages, options=options, stream=True))
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count and 0 < (whole.eval_count or 0) <= 16
    text = client.generate(name, "Once upon a time", options=options)
    assert "".join(p.response for p in client.generate(
        name, "Once upon a time", options=options, stream=True)) == text.response
