"""The body of a chat request, built from a conversation without Qt: what goes in the
messages, which sampling fields go and when, the served model and the structured output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.chat.conversation import DEFAULT_SAMPLING, Conversation, Message, Role
from app.chat.request_body import request_body
from app.chat.store import ChatStore
from runtime.events import SamplingParams


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    store = ChatStore(tmp_path / "chats.db")
    yield store
    store.close()


def chat(system_prompt: str = "", sampling: SamplingParams = DEFAULT_SAMPLING,
         response_schema: str = "") -> Conversation:
    return Conversation(1, "Chat", 0.0, 0.0, system_prompt=system_prompt, sampling=sampling,
                        response_schema=response_schema)


def message(id: int, role: Role, content: str, reasoning: str = "") -> Message:
    return Message(id, 1, id - 1 or None, role, content, 0.0, reasoning=reasoning)


def test_the_system_prompt_leads_and_a_blank_one_stays_out(store: ChatStore) -> None:
    history = [message(1, "user", "Hello")]
    body = request_body(store, chat(system_prompt="Be brief."), history, model=None)
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hello"}]
    blank = request_body(store, chat(system_prompt="  \n "), history, model=None)
    assert blank["messages"] == [{"role": "user", "content": "Hello"}]


def test_earlier_replies_go_back_as_their_answers_only(store: ChatStore) -> None:
    history = [message(1, "user", "2+2?"),
               message(2, "assistant", "4", reasoning="Two and two make four."),
               message(3, "user", "And 3+3?"),
               message(4, "assistant", "", reasoning="Stopped while thinking"),
               message(5, "user", "Well?")]
    body = request_body(store, chat(), history, model=None)
    assert body["messages"] == [{"role": "user", "content": "2+2?"},
                                {"role": "assistant", "content": "4"},
                                {"role": "user", "content": "And 3+3?"},
                                {"role": "user", "content": "Well?"}]
    assert "Two and two" not in json.dumps(body)


def test_the_chats_sampling_goes_with_seed_and_stop_only_when_set(store: ChatStore) -> None:
    plain = request_body(store, chat(), [message(1, "user", "Hi")], model=None)
    assert {k: plain[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p")} == {
        "max_tokens": DEFAULT_SAMPLING.max_tokens, "temperature": DEFAULT_SAMPLING.temperature,
        "top_p": DEFAULT_SAMPLING.top_p, "top_k": DEFAULT_SAMPLING.top_k,
        "min_p": DEFAULT_SAMPLING.min_p}
    assert "seed" not in plain and "stop" not in plain and "model" not in plain
    assert "response_format" not in plain

    sampling = SamplingParams(temperature=0.0, seed=7, stop=("\n\n",), max_tokens=64,
                              repeat_penalty=1.1)
    body = request_body(store, chat(sampling=sampling), [message(1, "user", "Hi")],
                        model="SmolLM2-135M")
    assert (body["temperature"], body["seed"], body["stop"], body["max_tokens"],
            body["repeat_penalty"], body["model"]) == (0.0, 7, ["\n\n"], 64, 1.1, "SmolLM2-135M")


def test_no_conversation_sends_the_apps_defaults(store: ChatStore) -> None:
    body = request_body(store, None, [message(1, "user", "Hi")], model=None)
    assert body["max_tokens"] == DEFAULT_SAMPLING.max_tokens
    assert body["messages"] == [{"role": "user", "content": "Hi"}]


def test_a_valid_schema_goes_as_response_format_an_invalid_one_does_not(
        store: ChatStore) -> None:
    schema = json.dumps({"title": "City", "type": "object",
                         "properties": {"name": {"type": "string"}}, "required": ["name"]})
    body = request_body(store, chat(response_schema=schema), [message(1, "user", "A city")],
                        model=None)
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "City"
    broken = request_body(store, chat(response_schema="{not json"),
                          [message(1, "user", "A city")], model=None)
    assert "response_format" not in broken
