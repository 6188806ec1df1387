"""The official `openai` client against a running server, on the real engine: the tiny
random model (fast, every code path) and the default model (real text, marked e2e)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.server.conftest import API_KEY, Served

TEMP0 = {"temperature": 0.0}


@pytest.fixture(params=["tiny", pytest.param("default", marks=pytest.mark.e2e)])
def served(request: pytest.FixtureRequest) -> Served:
    fixture = "tiny_server" if request.param == "tiny" else "default_server"
    server: Served = request.getfixturevalue(fixture)
    return server


@pytest.fixture
def client(served: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as api:
        yield api


def model_id(client: openai.OpenAI) -> str:
    (model,) = client.models.list().data
    return model.id


def test_models_list_names_the_loaded_file(client: openai.OpenAI, served: Served) -> None:
    status = served.engine.status()
    assert model_id(client) == status.model.name


def test_chat_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    model = model_id(client)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                           max_tokens=16, **TEMP0)
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage is not None
    assert 0 < whole.usage.completion_tokens <= 16
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                            max_tokens=16, stream=True,
                                            stream_options={"include_usage": True}, **TEMP0)
    parts = list(stream)
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == choice.message.content
    finishes = [p.choices[0].finish_reason for p in parts if p.choices]
    assert finishes[-1] == choice.finish_reason and set(finishes[:-1]) == {None}
    assert parts[-1].choices == [] and parts[-1].usage is not None
    assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens
    extra = [p.model_extra.get("outrider") for p in parts if p.model_extra]
    token_ids = [t for e in extra if e for t in e.get("token_ids", [])]
    assert len(token_ids) == whole.usage.completion_tokens


def test_completions_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    model = model_id(client)
    whole = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12,
                                      **TEMP0)
    streamed = "".join(p.choices[0].text for p in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=12, stream=True, **TEMP0))
    assert whole.object == "text_completion"
    assert streamed == whole.choices[0].text
    assert whole.usage is not None and whole.usage.prompt_tokens > 0


def test_stop_string_cuts_the_reply(client: openai.OpenAI) -> None:
    model = model_id(client)
    full = client.completions.create(model=model, prompt="abc", max_tokens=24,
                                     **TEMP0).choices[0].text
    printable = [i for i in range(2, len(full)) if full[i].isalnum() and full[i] not in full[:i]]
    if not printable:
        pytest.skip(f"no usable stop string in {full!r}")
    stop = full[printable[0]]
    cut = client.completions.create(model=model, prompt="abc", max_tokens=24,
                                    stop=[stop], **TEMP0).choices[0]
    assert cut.text == full[:printable[0]]
    assert cut.finish_reason == "stop"


def test_n_two_returns_two_choices_with_summed_usage(client: openai.OpenAI) -> None:
    model = model_id(client)
    result = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say something."}], n=2,
        max_tokens=8, temperature=1.0, seed=7)
    assert sorted(c.index for c in result.choices) == [0, 1]
    assert result.usage is not None and 2 <= result.usage.completion_tokens <= 16
    streamed = client.completions.create(model=model, prompt="Hi", n=2, max_tokens=6,
                                         stream=True, **TEMP0)
    finished = sorted(p.choices[0].index for p in streamed if p.choices[0].finish_reason)
    assert finished == [0, 1]


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    model = model_id(client)
    prompt = "The same long prompt, word for word, sent twice to the server. " * 4
    client.completions.create(model=model, prompt=prompt, max_tokens=2, **TEMP0)
    again = client.completions.create(model=model, prompt=prompt, max_tokens=2, **TEMP0)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and again.usage.prompt_tokens - 1 <= cached < again.usage.prompt_tokens


def test_errors_raise_the_matching_openai_exceptions(client: openai.OpenAI, served: Served) -> None:
    model = model_id(client)
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.NotFoundError, match="'no-such-model' not found; available: "):
        client.chat.completions.create(model="no-such-model", messages=messages)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                       temperature=-1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                       max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=model, prompt="x", extra_body={"max_tokens": "ten"})
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=model, prompt="word " * 5000, max_tokens=4, stream=True)
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="wrong", max_retries=0) as stranger, \
            pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    # Still serving after all that.
    assert client.completions.create(model=model, prompt="ok", max_tokens=2).choices


@pytest.mark.e2e
def test_default_model_answers_sensibly(default_server: Served) -> None:
    with openai.OpenAI(base_url=f"{default_server.url}/v1", api_key=API_KEY,
                       max_retries=0) as api:
        reply = api.chat.completions.create(
            model=model_id(api), messages=[{"role": "user",
                                            "content": "Name the largest ocean on Earth."}],
            max_tokens=24, temperature=0)
        text = api.completions.create(model=model_id(api), prompt="The capital of France is",
                                      max_tokens=4, temperature=0).choices[0].text
    assert "Pacific" in (reply.choices[0].message.content or "")
    assert "Paris" in text
