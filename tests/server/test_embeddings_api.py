"""`POST /v1/embeddings` on the real engine: the official `openai` client (base64, its
default, and float), every input shape OpenAI takes, one-line errors after which the server
keeps serving, a reranker refused (OpenAI's and Ollama's routes), and an embedding request
beside a chat stream. An encoder-only model (the tiny BERT) says it can only embed
(`capabilities`), and every dialect's generation route refuses it with a one-line 400 in
that dialect's shape (OpenAI, Anthropic, Ollama) while it goes on embedding."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import gguf
import httpx
import numpy as np
import ollama
import openai
import pytest

from tests.fixtures.tiny_bert_gguf import BERT, CLS, SEP, write_tiny_bert_gguf
from tests.server.conftest import API_KEY, Served, serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEXTS = ["hello world", "the cat sat on the mat", "tax form"]


@pytest.fixture(scope="module")
def bert_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = write_tiny_bert_gguf(tmp_path_factory.mktemp("bert") / "tiny-bert.gguf")
    with serving(path, tmp_path_factory.mktemp("models"), n_ctx=512, n_parallel=1) as served:
        yield served


@pytest.fixture
def client(bert_server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{bert_server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=60) as api:
        yield api


def post(served: Served, body: Any) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/embeddings", json=body, headers=AUTH, timeout=60)


def test_the_openai_client_reads_base64_and_float(client: openai.OpenAI) -> None:
    model = "tiny-bert"
    packed = client.embeddings.create(model=model, input=TEXTS)  # base64 unless told
    plain = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert packed.model == plain.model == model
    assert [d.index for d in packed.data] == [0, 1, 2]
    for a, b in zip(packed.data, plain.data, strict=True):
        assert len(a.embedding) == BERT.n_embd
        np.testing.assert_allclose(a.embedding, b.embedding, rtol=0, atol=1e-7)
        assert abs(np.linalg.norm(b.embedding) - 1.0) < 1e-5
    assert plain.usage.prompt_tokens == plain.usage.total_tokens == packed.usage.total_tokens
    assert plain.usage.prompt_tokens == 4 + 8 + 4  # each with [CLS] and [SEP]


def test_base64_is_little_endian_float32(bert_server: Served) -> None:
    floats = post(bert_server, {"input": "hello world"}).json()["data"][0]["embedding"]
    packed = post(bert_server, {"input": "hello world", "encoding_format": "base64"}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == floats


def test_every_input_shape(bert_server: Served) -> None:
    ids = [CLS, 11, 12, SEP]  # "hello world" in the fixture's vocabulary
    one = post(bert_server, {"input": "hello world"}).json()
    as_ids = post(bert_server, {"input": ids}).json()
    listed = post(bert_server, {"input": [ids, [CLS, 6, SEP]]}).json()
    assert len(one["data"]) == len(as_ids["data"]) == 1 and len(listed["data"]) == 2
    np.testing.assert_allclose(as_ids["data"][0]["embedding"], one["data"][0]["embedding"],
                               atol=1e-6)
    assert listed["usage"]["prompt_tokens"] == 7


TOO_LONG = " ".join(["cat"] * 600)


@pytest.mark.parametrize(("body", "status", "code", "says"), [
    ({"input": []}, 400, "invalid_value", "at least one"),
    ({}, 400, "invalid_value", "input"),
    ({"input": 5}, 400, "invalid_value", "input"),
    ({"input": [1.5]}, 400, "invalid_value", "input"),
    ({"input": ["a", 1]}, 400, "invalid_value", "input"),
    ({"input": {"text": "a"}}, 400, "invalid_value", "input"),
    ({"input": [[]]}, 400, "invalid_value", "empty"),
    ({"input": [[CLS, 99999]]}, 400, "invalid_value", "token id 99999"),
    ({"input": "a", "encoding_format": "hex"}, 400, "invalid_value", "encoding_format"),
    ({"input": "a", "dimensions": 32}, 400, "invalid_value", "dimensions"),
    ({"input": ["a", TOO_LONG]}, 400, "context_length_exceeded", "at most 512 tokens"),
    ({"input": "a", "model": "no-such-model"}, 404, "model_not_found", "tiny-bert"),
])
def test_bad_requests_are_one_line_errors(bert_server: Served, body: dict[str, Any],
                                          status: int, code: str, says: str) -> None:
    reply = post(bert_server, body)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["code"] == code and says in error["message"]
    assert "\n" not in error["message"]
    assert post(bert_server, {"input": "still serving"}).status_code == 200


def test_a_reranker_is_a_400(tmp_path: Path) -> None:
    path = write_tiny_bert_gguf(tmp_path / "rank.gguf", replace(BERT, pooling=gguf.PoolingType.RANK))
    with serving(path, tmp_path / "models", n_ctx=512, n_parallel=1) as served:
        reply = post(served, {"input": "hello"})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and "reranker" in error["message"]
        models = httpx.get(f"{served.url}/v1/models", headers=AUTH)
        assert models.json()["data"][0]["outrider"]["capabilities"] == []  # it only scores
        with ollama.Client(host=served.url, headers=AUTH, timeout=60) as api:
            for call in (lambda: api.embed("rank", input="hello"),
                         lambda: api.embeddings("rank", prompt="hello"),
                         lambda: api.chat("rank", messages=[{"role": "user", "content": "hi"}])):
                with pytest.raises(ollama.ResponseError) as caught:
                    call()
                assert caught.value.status_code == 400
                message = caught.value.error
                assert ("reranker" in message or "cannot write" in message) and "\n" not in message
            assert api.show("rank").capabilities == []
        assert httpx.get(f"{served.url}/api/tags", headers=AUTH).status_code == 200


# --- an encoder-only model: it embeds, it does not write ------------------------------------

def test_capabilities_say_who_writes_and_who_embeds(bert_server: Served,
                                                    tiny_server: Served) -> None:
    def capabilities(served: Served) -> list[str]:
        (card,) = httpx.get(f"{served.url}/v1/models", headers=AUTH).json()["data"]
        listed: list[str] = card["outrider"]["capabilities"]
        return listed

    assert capabilities(bert_server) == ["embeddings"]
    assert capabilities(tiny_server) == ["chat", "structured_output", "embeddings"]
    with ollama.Client(host=bert_server.url, headers=AUTH, timeout=60) as api:
        assert api.show("tiny-bert").capabilities == ["embedding"]
    with ollama.Client(host=tiny_server.url, headers=AUTH, timeout=60) as api:
        shown = api.show(tiny_server.engine.status().model.name)
        assert shown.capabilities == ["completion", "embedding"]


ASK = [{"role": "user", "content": "hello"}]


def _openai_400(call: Any) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error" and body["code"]
    return str(body["message"])


def _anthropic_400(call: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        call()
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def _ollama_400(call: Any) -> str:
    with pytest.raises(ollama.ResponseError) as caught:
        call()
    assert caught.value.status_code == 400
    return str(caught.value.error)


@pytest.mark.parametrize("stream", [False, True])
def test_every_generation_route_refuses_an_embedding_model(bert_server: Served,
                                                           stream: bool) -> None:
    url, model = bert_server.url, "tiny-bert"
    with openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60) as oa, \
            anthropic.Anthropic(base_url=url, api_key=API_KEY, max_retries=0, timeout=60) as an, \
            ollama.Client(host=url, headers=AUTH, timeout=60) as ol:
        messages: list[str] = [
            _openai_400(lambda: oa.chat.completions.create(model=model, messages=ASK,
                                                           max_tokens=4, stream=stream)),
            _openai_400(lambda: oa.completions.create(model=model, prompt="hello", max_tokens=4,
                                                      stream=stream)),
            _openai_400(lambda: oa.responses.create(model=model, input="hello",
                                                    max_output_tokens=4, stream=stream)),
            _anthropic_400(lambda: an.messages.create(model=model, max_tokens=4, messages=ASK,
                                                      stream=stream)),
            # the ollama client reads a stream's status when it is iterated
            _ollama_400(lambda: list(ol.chat(model, messages=ASK, stream=True)) if stream
                        else ol.chat(model, messages=ASK)),
            _ollama_400(lambda: list(ol.generate(model, "hello", stream=True)) if stream
                        else ol.generate(model, "hello")),
            _ollama_400(lambda: ol.generate(model, "hello", raw=True)),
        ]
        for message in messages:
            assert "tiny-bert is an embedding model" in message and "\n" not in message
        assert len(oa.embeddings.create(model=model, input="still embedding").data) == 1
        assert len(ol.embed(model, input="still embedding").embeddings) == 1


def test_embeddings_beside_a_chat_stream(tiny_server: Served) -> None:
    """A chat stream at T=0 says the same whether or not embeddings run meanwhile."""
    model = tiny_server.engine.status().model.name
    with openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as api:
        def stream(on_first: Any = None) -> str:
            parts = []
            for chunk in api.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "Tell a story"}],
                    max_tokens=300, temperature=0.0, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
                    if len(parts) == 1 and on_first is not None:
                        on_first()
            return "".join(parts)

        alone = stream()
        vectors: list[int] = []

        def embed() -> None:
            reply = api.embeddings.create(model=model,
                                          input=[f"text {i} " * 8 for i in range(40)])
            vectors.append(len(reply.data))

        worker = threading.Thread(target=embed)
        beside = stream(on_first=worker.start)
        worker.join(timeout=120)
        assert beside == alone
        assert vectors == [40]


@pytest.mark.e2e
def test_the_default_model_through_the_client(default_server: Served) -> None:
    from llama_cpp import LLAMA_POOLING_TYPE_MEAN

    from tests.fixtures.reference_llama import reference_llama

    model = default_server.engine.status().model
    texts = ["cat", "kitten", "The quick brown fox jumps over the lazy dog."]
    with openai.OpenAI(base_url=f"{default_server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as api:
        reply = api.embeddings.create(model=model.name, input=texts)
    llm = reference_llama(model.path, embedding=True, verbose=False, n_ctx=512, n_threads=1,
                          pooling_type=LLAMA_POOLING_TYPE_MEAN)
    try:
        for item, text in zip(reply.data, texts, strict=True):
            ref = np.asarray(llm.embed(text, normalize=True))
            assert float(np.dot(item.embedding, ref)) >= 0.9999
    finally:
        llm.close()
