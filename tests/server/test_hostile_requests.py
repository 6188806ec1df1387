"""Requests that used to hang or poison the engine thread (issue 15), on the real engine and
the tiny model: each gets an answer (200 or a one-line 4xx) within seconds, and a small
request sent beside it is answered within 2 s.

    lone surrogate "\\ud800"         → 400 invalid_value, param names the message
    a chat template that loops        → 400 naming the template, the raw neighbour still served
    10,000 messages, truncate_middle  → 200 with truncated_tokens (about 15 renders, off-thread)
    top_k 2**64                       → 400 invalid_value, param "top_k"
    n 8 × max_tokens 8192, small ctx  → 200, every choice "length" (max_tokens fitted to n)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.server import ServerLimits
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import TARGET, TinySpec
from tests.server.conftest import API_KEY, Served, serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HOSTILE_S = 20.0  # "within seconds", with room for a loaded 2-core CI machine
BESIDE_S = 2.0

# No output and no message access inside the loop: only the render's clock can stop it.
LOOPING_TEMPLATE = ("{% for i in range(99999) %}{% for j in range(99999) %}"
                    "{% endfor %}{% endfor %}{{ messages[0]['content'] }}")
LOOPING = TinySpec(name="tiny-looping-template", chat_template=LOOPING_TEMPLATE)


@pytest.fixture(scope="module")
def server(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    limits = ServerLimits(max_tokens=8192, max_n=8)
    with serving(tiny_target, tmp_path_factory.mktemp("models"), limits, n_ctx=1024,
                 n_parallel=12) as served:
        warm_up(served.url)
        yield served


@pytest.fixture(scope="module")
def looping_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    assert TARGET.chat_template != LOOPING_TEMPLATE
    with serving(tiny_model_path(LOOPING), tmp_path_factory.mktemp("models"), n_ctx=512,
                 n_parallel=4) as served:
        warm_up(served.url)
        yield served


def warm_up(url: str) -> None:
    """The 2 s bound is about a request beside a hostile one, not a cold server's first."""
    body = {"prompt": "warm", "max_tokens": 2}
    assert post(url, "/v1/completions", body, HOSTILE_S).status_code == 200


def post(url: str, route: str, body: dict[str, Any], timeout: float) -> httpx.Response:
    return httpx.post(f"{url}{route}", json=body, headers=AUTH, timeout=timeout)


def post_raw(url: str, route: str, raw: bytes, timeout: float) -> httpx.Response:
    headers = {**AUTH, "Content-Type": "application/json"}
    return httpx.post(f"{url}{route}", content=raw, headers=headers, timeout=timeout)


def small_chat(url: str) -> httpx.Response:
    return post(url, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                 "temperature": 0}, BESIDE_S)


def small_completion(url: str) -> httpx.Response:
    return post(url, "/v1/completions", {"prompt": "Once upon", "max_tokens": 4,
                                         "temperature": 0}, BESIDE_S)


def beside(hostile: Callable[[], httpx.Response], small: Callable[[], httpx.Response]
           ) -> tuple[httpx.Response, httpx.Response, bool]:
    """Send `hostile`, then `small` while it is in flight. Returns both responses and whether
    the hostile one was still running when the small one was answered."""
    with ThreadPoolExecutor(2) as pool:
        hostile_future: Future[httpx.Response] = pool.submit(hostile)
        small_response = pool.submit(small).result(timeout=BESIDE_S + 1)
        overlapped = not hostile_future.done()
        return hostile_future.result(timeout=HOSTILE_S), small_response, overlapped


def assert_one_line_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = dict(response.json()["error"])
    assert error["code"] == code
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    return error


def test_a_lone_surrogate_is_400_and_the_neighbour_is_served(server: Served) -> None:
    # json.dumps escapes it as "\ud800": valid JSON, not valid Unicode text.
    raw = json.dumps({"messages": [{"role": "user", "content": "a\ud800b"}], "max_tokens": 4})
    hostile, small, _ = beside(
        lambda: post_raw(server.url, "/v1/chat/completions", raw.encode(), HOSTILE_S),
        lambda: small_chat(server.url))
    error = assert_one_line_error(hostile, 400, "invalid_value")
    assert error["param"] == "messages.0.content" and "surrogate" in error["message"]
    assert small.status_code == 200, small.text


def test_a_lone_surrogate_in_a_raw_prompt_or_stop_is_400(server: Served) -> None:
    for body in ({"prompt": "x\udfff", "max_tokens": 2}, {"prompt": "x", "stop": ["\ud800"]}):
        response = post_raw(server.url, "/v1/completions", json.dumps(body).encode(), HOSTILE_S)
        assert_one_line_error(response, 400, "invalid_value")


def test_a_looping_template_ends_in_a_400_and_others_are_served(looping_server: Served) -> None:
    url = looping_server.url
    hostile, small, overlapped = beside(
        lambda: post(url, "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                     HOSTILE_S),
        lambda: small_completion(url))
    error = assert_one_line_error(hostile, 400, "invalid_request")
    assert "chat template" in error["message"] and "longer than" in error["message"]
    assert small.status_code == 200, small.text
    assert overlapped, "the small request was answered only after the template gave up"
    assert httpx.get(f"{url}/health", timeout=BESIDE_S).status_code == 200


def test_ten_thousand_messages_with_truncate_middle(server: Served) -> None:
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(5_000):
        messages += [{"role": "user", "content": f"question {i}"},
                     {"role": "assistant", "content": f"answer {i}"}]
    messages[-1] = {"role": "user", "content": "and the last question?"}
    assert len(messages) == 10_001
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "truncate_middle": True}
    hostile, small, _ = beside(lambda: post(server.url, "/v1/chat/completions", body, HOSTILE_S),
                               lambda: small_chat(server.url))
    assert hostile.status_code == 200, hostile.text
    usage = hostile.json()["outrider"]["choices"][0]["usage"]
    assert usage["truncated_tokens"] > 0 and usage["prompt_tokens"] <= 1024
    assert small.status_code == 200, small.text


@pytest.mark.parametrize(("change", "param"), [
    ({"top_k": 2**64}, "top_k"),
    ({"top_k": 2**31}, "top_k"),
    ({"max_tokens": 2**40}, "max_tokens"),
    ({"repeat_last_n": 2**33}, "repeat_last_n"),
    ({"n": 0}, "n"),
    ({"n": 9}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"seed": -2}, "seed"),
])
def test_out_of_range_numbers_are_400_naming_the_parameter(server: Served, change: dict[str, Any],
                                                           param: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **change}
    hostile, small, _ = beside(lambda: post(server.url, "/v1/chat/completions", body, HOSTILE_S),
                               lambda: small_chat(server.url))
    assert assert_one_line_error(hostile, 400, "invalid_value")["param"] == param
    assert small.status_code == 200, small.text


def test_top_k_at_the_int32_limit_samples_the_whole_vocabulary(server: Served) -> None:
    body = {"prompt": "Once upon", "max_tokens": 4, "top_k": 2**31 - 1, "seed": 1}
    response = post(server.url, "/v1/completions", body, HOSTILE_S)
    assert response.status_code == 200, response.text


def test_eight_samples_of_8192_tokens_on_a_small_context_finish(server: Served) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8192, "n": 8, "temperature": 1.0,
            "seed": 3}
    hostile, small, _ = beside(lambda: post(server.url, "/v1/completions", body, HOSTILE_S),
                               lambda: small_completion(server.url))
    assert hostile.status_code == 200, hostile.text
    choices = hostile.json()["choices"]
    assert len(choices) == 8
    usage = hostile.json()["usage"]
    # All eight fit in the 1,024 cells at once: (1024 - prompt) // 8 tokens each, at most.
    assert usage["completion_tokens"] <= 1024 - usage["prompt_tokens"]
    assert {c["finish_reason"] for c in choices} <= {"length", "stop"}
    assert any(c["finish_reason"] == "length" for c in choices)
    assert small.status_code == 200, small.text
