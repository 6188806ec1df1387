"""The official `openai` client's structured output against the server on the real default
model (SmolLM2-135M-Instruct): `chat.completions.parse` with a 10-field Pydantic model at
temperature 0.8 returns a valid object every time (20 of 20), json_object replies parse, and
the model's template family (plain ChatML: no call format) is said in /v1/models and makes
`tools` a clear 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from runtime.server import ServerLimits
from tests.server.conftest import API_KEY, Served, serving

pytestmark = pytest.mark.e2e


def model_of(api: openai.OpenAI) -> str:
    """The id of the one model the server has loaded."""
    return api.models.list().data[0].id


Name = Annotated[str, Field(max_length=32)]


class Order(BaseModel):
    """Ten fields of every kind a schema has: strings, bounded numbers, a flag, an enum."""

    order_id: Annotated[int, Field(ge=1, le=999_999)]
    customer: Name
    email: Name
    city: Name
    country: Name
    quantity: Annotated[int, Field(ge=1, le=100)]
    unit_price: Annotated[float, Field(ge=0, le=10_000)]
    express: bool
    status: Literal["new", "paid", "shipped", "cancelled"]
    notes: Annotated[str, Field(max_length=60)]


ASK = [{"role": "system", "content": "You turn order descriptions into JSON."},
       {"role": "user", "content": "Ada Lovelace (ada@example.org) in London, UK ordered 3 "
                                   "notebooks at 12.50 each, express, already paid. Order 4711."}]


@pytest.fixture(scope="module")
def smol(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(default_model, tmp_path_factory.mktemp("models"), n_parallel=4,
                 limits=ServerLimits(max_tokens=512)) as served:
        yield served


@pytest.fixture
def client(smol: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{smol.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=900) as api:
        yield api


# About a minute on an idle desktop CPU (20 documents of ~140 tokens); far more on a busy one.
@pytest.mark.timeout(1200)
@pytest.mark.slow
def test_parse_returns_a_valid_object_20_of_20_at_t08(client: openai.OpenAI) -> None:
    parsed: list[Order] = []
    for seed in range(5):  # 5 requests of 4 samples: the engine batches them
        reply = client.chat.completions.parse(
            model=model_of(client), messages=ASK, response_format=Order,  # type: ignore[arg-type]
            temperature=0.8, seed=seed, n=4, max_tokens=400)
        for choice in reply.choices:
            assert choice.finish_reason == "stop", choice
            assert isinstance(choice.message.parsed, Order), choice.message.content
            parsed.append(choice.message.parsed)
    assert len(parsed) == 20


def test_json_object_replies_parse(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=model_of(client), messages=ASK, response_format={"type": "json_object"},  # type: ignore[arg-type]
        temperature=0.0, max_tokens=200)
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content or ""), dict)


def test_the_plain_template_says_so_and_refuses_tools(client: openai.OpenAI, smol: Served) -> None:
    (model,) = client.models.list().data
    outrider = (model.model_extra or {})["outrider"]
    assert outrider["chat_family"] == "plain"
    assert "tools" not in outrider["capabilities"]
    assert "structured_output" in outrider["capabilities"]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with httpx.Client(base_url=smol.url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=120) as http:
        response = http.post("/v1/chat/completions", json={"messages": ASK, "tools": tools})
        assert response.status_code == 400
        assert "tool" in response.json()["error"]["message"]
        assert http.post("/v1/chat/completions",
                         json={"messages": ASK, "max_tokens": 4}).status_code == 200
