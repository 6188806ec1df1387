"""Images through every dialect: OpenAI `image_url` parts, the Responses API's `input_image`,
Ollama's `images`, Anthropic's image blocks — on the tiny model with its tiny Gemma 3
projector (64 tokens per image). A second question about the same image reuses its cells;
every bad image is a one-line 400 in the dialect's own error shape and the server keeps
serving; a model without a projector refuses images by saying what to load instead."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.media.corpus import BAD_IMAGES, cmyk_jpeg, png
from tests.server.conftest import API_KEY, Served, serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}
IMAGE_TOKENS = 64  # the fixture projector's tokens per image


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def openai_chat(image: bytes, question: str = "What is in the picture?") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": question},
        {"type": "image_url", "image_url": {"url": data_url(image)}}]}],
        "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def vision(tiny_target: Path, tiny_mmproj: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tiny_target, tmp_path_factory.mktemp("models"), n_ctx=2048, n_parallel=2,
                 mmproj_path=tiny_mmproj) as served:
        yield served


@pytest.fixture(scope="module")
def http(vision: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vision.url, headers=AUTH, timeout=120) as client:
        yield client


def test_an_image_in_an_openai_chat_is_answered_and_its_cells_reused(http: httpx.Client) -> None:
    image = png(64, 64, "orange")
    first = http.post("/v1/chat/completions", json=openai_chat(image))
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["prompt_tokens"] > IMAGE_TOKENS
    again = http.post("/v1/chat/completions", json=openai_chat(image, "And its colour?"))
    assert again.status_code == 200, again.text
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= IMAGE_TOKENS


def test_a_cmyk_jpeg_is_normalised_and_answered(http: httpx.Client) -> None:
    body = openai_chat(cmyk_jpeg())
    body["messages"][0]["content"][1]["image_url"]["url"] = (
        "data:image/jpeg;base64," + base64.b64encode(cmyk_jpeg()).decode())
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_every_dialect_takes_an_image(http: httpx.Client, vision: Served) -> None:
    model = vision.engine.status().model.name
    b64 = base64.b64encode(png(40, 30, "navy")).decode()
    ollama = http.post("/api/chat", json={"model": model, "stream": False, "messages": [
        {"role": "user", "content": "What is it?", "images": [b64]}],
        "options": {"num_predict": 2}})
    anthropic = http.post("/v1/messages", json={"model": model, "max_tokens": 2,
                                                "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
        {"type": "text", "text": "What is it?"}]}]})
    responses = http.post("/v1/responses", json={"model": model, "max_output_tokens": 2,
                                                 "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{b64}"}]}]})
    generate = http.post("/api/generate", json={"model": model, "stream": False,
                                                "prompt": "What is it?", "images": [b64],
                                                "options": {"num_predict": 2}})
    for reply in (ollama, anthropic, responses, generate):
        assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("name", sorted(BAD_IMAGES))
def test_a_bad_image_is_a_400_in_each_dialects_shape(http: httpx.Client, vision: Served,
                                                     name: str) -> None:
    model = vision.engine.status().model.name
    bad = BAD_IMAGES[name]()
    b64 = base64.b64encode(bad).decode()
    openai = http.post("/v1/chat/completions", json=openai_chat(bad))
    assert openai.status_code == 400, openai.text
    error = openai.json()["error"]
    assert error["code"] == "invalid_image" and "messages.0.content.1" in error["message"]
    assert "\n" not in error["message"]
    ollama = http.post("/api/chat", json={"model": model, "stream": False, "messages": [
        {"role": "user", "content": "Hi", "images": [b64]}]})
    assert ollama.status_code == 400 and isinstance(ollama.json()["error"], str)
    anthropic = http.post("/v1/messages", json={"model": model, "max_tokens": 2,
                                                "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]})
    assert anthropic.status_code == 400 and anthropic.json()["type"] == "error"
    assert http.post("/v1/chat/completions", json=openai_chat(png())).status_code == 200


def test_remote_and_malformed_image_urls_are_refused(http: httpx.Client) -> None:
    for url, says in (("https://example.com/cat.png", "--allow-remote-images"),
                      ("data:image/png,notbase64", "base64"),
                      ("data:image/png;base64,@@@@", "not valid base64"),
                      ("file:///etc/passwd", "data: URI")):
        body = openai_chat(png())
        body["messages"][0]["content"][1]["image_url"]["url"] = url
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 400 and says in reply.json()["error"]["message"], reply.text


def test_only_user_messages_carry_images(http: httpx.Client) -> None:
    body = openai_chat(png())
    body["messages"] = [{"role": "assistant", "content": body["messages"][0]["content"]},
                        {"role": "user", "content": "Hi"}]
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400 and "only user messages" in reply.json()["error"]["message"]


def test_a_model_without_a_projector_says_which_to_load(tiny_server: Served) -> None:
    with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=60) as client:
        reply = client.post("/v1/chat/completions", json=openai_chat(png()))
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "invalid_image" and "vision model" in error["message"]
        assert client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).status_code == 200


def test_remote_images_are_fetched_only_when_allowed(tiny_target: Path, tiny_mmproj: Path,
                                                     tmp_path: Path) -> None:
    import functools
    import http.server
    import threading

    from runtime.server import ServerLimits

    (tmp_path / "cat.png").write_bytes(png(32, 32, "grey"))
    (tmp_path / "big.png").write_bytes(b"\0" * (21 * 1024 * 1024))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{site.server_address[1]}"
    try:
        with serving(tiny_target, tmp_path / "models", n_ctx=2048, mmproj_path=tiny_mmproj,
                     limits=ServerLimits(allow_remote_images=True)) as served, \
                httpx.Client(base_url=served.url, headers=AUTH, timeout=120) as client:
            for url, status, says in ((f"{base}/cat.png", 200, ""),
                                      (f"{base}/missing.png", 400, "HTTP 404"),
                                      (f"{base}/big.png", 400, "larger than")):
                body = openai_chat(png())
                body["messages"][0]["content"][1]["image_url"]["url"] = url
                reply = client.post("/v1/chat/completions", json=body)
                assert reply.status_code == status, reply.text
                assert says in reply.text
    finally:
        site.shutdown()
