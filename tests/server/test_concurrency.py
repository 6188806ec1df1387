"""Continuous batching seen from the HTTP side, on the real engine and the tiny model:
concurrent clients get what they would get alone, a client that leaves frees its slot and
cells, a cache too small for everyone preempts instead of failing, and a shared prefix is
reused."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from runtime.server import ServerLimits
from tests.server.conftest import API_KEY, Served, serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPTS = [f"Client number {i} asks: {'abcdefgh'[i] * (3 + i)} and then?" for i in range(8)]


def stream_completion(url: str, prompt: str, max_tokens: int, n: int = 1) -> list[tuple[str, str]]:
    """(text, finish_reason) per choice, from a streamed completion at temperature 0."""
    with openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as api:
        texts = [""] * n
        finishes = [""] * n
        for chunk in api.completions.create(model=None, prompt=prompt,  # type: ignore[arg-type]
                                            max_tokens=max_tokens, temperature=0, n=n,
                                            stream=True):
            choice = chunk.choices[0]
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    return list(zip(texts, finishes, strict=True))


def status(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/api/status", headers=AUTH).json())


def wait_for_status(url: str, **expected: int) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        now = status(url)
        if all(now[key] == value for key, value in expected.items()):
            return now
        assert time.monotonic() < deadline, f"status stayed {now}, expected {expected}"
        time.sleep(0.02)


def test_eight_concurrent_streams_match_running_alone(tiny_target: Path, tmp_path: Path) -> None:
    with serving(tiny_target, tmp_path, n_parallel=8) as served, \
            ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: stream_completion(served.url, p, 48), PROMPTS))
    with serving(tiny_target, tmp_path, n_parallel=1) as served:
        alone = [stream_completion(served.url, p, 48) for p in PROMPTS]
    assert all(finish in ("stop", "length") for [(_, finish)] in together)
    assert together == alone


def test_disconnect_frees_the_slot_and_its_cells(tiny_target: Path, tmp_path: Path) -> None:
    # One slot: the next request can only be admitted if the abandoned one let go of it.
    with serving(tiny_target, tmp_path, ServerLimits(max_tokens=4000), n_parallel=1,
                 n_ctx=4096) as served:
        assert status(served.url)["kv_cells_used"] == 0
        with httpx.stream("POST", f"{served.url}/v1/completions", headers=AUTH, timeout=60,
                          json={"prompt": "a long story", "max_tokens": 4000, "stream": True,
                                "temperature": 0}) as response:
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    break
        # A finished reply would keep its cells as prefix cache; a cancelled one frees them.
        wait_for_status(served.url, active_sequences=0, waiting_sequences=0, kv_cells_used=0)
        [(_text, finish)] = stream_completion(served.url, "next, please", 8)
        assert finish in ("stop", "length")


def test_more_context_than_the_cache_holds_completes_for_everyone(tiny_target: Path,
                                                                  tmp_path: Path) -> None:
    # 256 cells; one request wants 2 × 100 of them beside its prompt (it fits alone: a
    # request's max_tokens is cut to what the cache holds for its n samples), two more
    # clients 100 + prompt each. (These prompts run to max_tokens on the tiny model.)
    requests = [("Hello there", 2), ("in the end", 1), ("abc", 1)]
    with serving(tiny_target, tmp_path, n_parallel=6, n_ctx=256) as served, \
            ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda r: stream_completion(served.url, r[0], 100, n=r[1]),
                                 requests))
        scheduler = getattr(getattr(served.engine, "_loaded", None), "scheduler", None)
        preemptions = getattr(scheduler, "n_preemptions", None)
    with serving(tiny_target, tmp_path, n_parallel=1, n_ctx=256) as served:
        alone = [stream_completion(served.url, prompt, 100)[0] for prompt, _ in requests]
    for got, single in zip(together, alone, strict=True):
        assert all(choice == single for choice in got)
        assert single[1] in ("stop", "length")
    if preemptions is not None:  # the engine's own counter, where it has one
        assert preemptions > 0


def test_shared_prefix_is_reused_and_only_the_rest_prefilled(tiny_server: Served) -> None:
    system = "You are a careful assistant. " * 30
    with openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key=API_KEY, max_retries=0) as api:
        def ask(question: str) -> Any:
            reply = api.chat.completions.create(
                model=None,  # type: ignore[arg-type]
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": question}], max_tokens=4, temperature=0)
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            return reply.usage

        ask("What is the first question?")
        second = ask("Why a second one?")
    cached = second.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= len(system) // 4
    # Only the differing question (and the template's tail) is evaluated again.
    assert 0 < second.prompt_tokens - cached <= 30


def test_status_counts_cells_while_streaming(tiny_server: Served) -> None:
    before = status(tiny_server.url)
    assert before["state"] == "ready" and before["kv_cells_total"] > 0
    [(_text, finish)] = stream_completion(tiny_server.url, "count my cells", 16)
    after = status(tiny_server.url)
    assert finish in ("stop", "length")
    assert after["active_sequences"] == 0
    assert 0 < after["kv_cells_used"] <= after["kv_cells_total"]


@pytest.mark.e2e
def test_concurrent_clients_on_the_default_model(default_server: Served) -> None:
    prompts = ["The capital of France is", "Monday, Tuesday,", "One, two, three,",
               "Water boils at"]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: stream_completion(default_server.url, p, 12), prompts))
    alone = [stream_completion(default_server.url, p, 12) for p in prompts]
    assert together == alone
