"""The HTTP layer on the fake engine: shapes, errors, auth, limits, `/api/` routes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtime.server import ServerLimits
from runtime.server.middleware import host_is_loopback
from tests.server.conftest import API_KEY, ServerThread, fake_gguf
from tests.server.fake_engine import FAIL_MARKER, FakeEngine
from tests.server.sse_parse import chunks, parse_sse

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12,
        "temperature": 0}
UNNAMED = {key: value for key, value in CHAT.items() if key != "model"}  # the default model


@pytest.fixture
def client(fake_engine: FakeEngine, make_app: Callable[..., FastAPI]) -> TestClient:
    return TestClient(make_app(fake_engine), headers=AUTH)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "\n" not in error["message"]
    if code is not None:
        assert error["code"] == code
    return str(error["message"])


# --- auth -------------------------------------------------------------------------------

def test_health_needs_no_key(client: TestClient) -> None:
    assert TestClient(client.app).get("/health").json() == {"status": "ok"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": API_KEY}, {"Authorization": "Basic x"}])
def test_every_other_route_needs_the_key(client: TestClient, headers: dict[str, str]) -> None:
    bare = TestClient(client.app)
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                         ("GET", "/api/status"), ("POST", "/api/load"), ("GET", "/openapi.json")):
        response = bare.request(method, path, headers=headers, json=CHAT)
        assert_error(response, 401, "invalid_api_key")


def test_without_a_configured_key_no_header_is_needed(fake_engine: FakeEngine,
                                                      make_app: Callable[..., FastAPI]) -> None:
    open_client = TestClient(make_app(fake_engine, api_key=None))
    assert open_client.get("/v1/models").status_code == 200


# --- OpenAI routes ----------------------------------------------------------------------

def test_models_lists_the_loaded_model(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fake"]


def test_chat_completion_shape_and_usage(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", json=CHAT).json()
    assert body["object"] == "chat.completion" and body["model"] == "fake"
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"]) == 12
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    (extra,) = body["outrider"]["choices"]
    assert len(extra["token_ids"]) == len(extra["from_draft"]) == 12
    assert set(extra["timings"]) == {"ttft_s", "prefill_tokens_per_s", "decode_tokens_per_s",
                                     "total_s", "restore_s"}


def test_second_request_reports_cached_prompt_tokens(client: TestClient) -> None:
    client.post("/v1/completions", json={"prompt": "a shared prefix, then one", "max_tokens": 2})
    body = client.post("/v1/completions",
                       json={"prompt": "a shared prefix, then two", "max_tokens": 2}).json()
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == len("a shared prefix, then ")


def test_text_completion_accepts_token_ids(client: TestClient) -> None:
    by_text = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5,
                                                   "temperature": 0}).json()
    by_ids = client.post("/v1/completions", json={"prompt": [[72, 105]], "max_tokens": 5,
                                                  "temperature": 0}).json()
    assert by_text["object"] == "text_completion"
    assert by_text["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert len(by_text["choices"][0]["text"]) == 5


def test_stream_matches_the_whole_answer(client: TestClient) -> None:
    whole = client.post("/v1/chat/completions", json=CHAT).json()
    response = client.post("/v1/chat/completions",
                           json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert response.headers["content-type"].startswith("text/event-stream")
    parts = chunks(response.text)
    assert all(p["object"] == "chat.completion.chunk" for p in parts)
    assert parts[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in parts if p["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    final = parts[-2]
    assert final["choices"][0]["finish_reason"] == "length"
    assert set(final["outrider"]) == {"timings", "usage", "speculative"}
    assert parts[-1]["choices"] == [] and parts[-1]["usage"]["completion_tokens"] == 12
    ids = [i for p in parts for i in p.get("outrider", {}).get("token_ids", [])]
    assert len(ids) == 12
    steps = [p["outrider"]["step"] for p in parts if "step" in p.get("outrider", {})]
    assert steps and steps[0]["drafted"] == 4 and steps[0]["accepted"] == 3


def test_n_two_gives_two_choices(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", json={**CHAT, "n": 2, "max_tokens": 6}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["message"]["content"] != body["choices"][1]["message"]["content"]
    assert body["usage"]["completion_tokens"] == 12
    streamed = chunks(client.post("/v1/completions", json={
        "prompt": "x", "n": 2, "max_tokens": 6, "stream": True}).text)
    finishes = sorted(p["choices"][0]["index"] for p in streamed
                      if p["choices"][0]["finish_reason"])
    assert finishes == [0, 1]


def test_stop_string_ends_the_reply_before_it(client: TestClient) -> None:
    full = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 12,
                                                "temperature": 0}).json()["choices"][0]["text"]
    stop = next(ch for ch in full[6:] if ch not in full[:6])  # the fake holds nothing back
    body = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 12,
                                                "temperature": 0, "stop": [stop]}).json()
    assert body["choices"][0]["text"] == full[:full.index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


# --- errors -----------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "param"), [
    ({**CHAT, "max_tokens": "10"}, "max_tokens"),
    ({**CHAT, "temperature": "hot"}, "temperature"),
    ({**CHAT, "stream": 1}, "stream"),
    ({**CHAT, "messages": "hi"}, "messages"),
    ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({**CHAT, "messages": []}, "messages"),
    ({"model": "fake"}, "messages"),
    ({**CHAT, "n": 1.5}, "n"),
    ({**CHAT, "stop": [1]}, "stop.0"),
])
def test_wrong_types_are_400_naming_the_field(client: TestClient, body: dict[str, Any],
                                              param: str) -> None:
    response = client.post("/v1/chat/completions", json=body)
    assert_error(response, 400, "invalid_value")
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(("change", "words"), [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**6}, "limit"),
    ({"n": 99}, "n must be"),
    ({"stop": ""}, "stop"),
    ({"seed": 2**70}, "seed"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tools": [{"type": "function"}]}, "tool"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text"),
])
def test_bad_values_are_400_with_a_message(client: TestClient, change: dict[str, Any],
                                           words: str) -> None:
    message = assert_error(client.post("/v1/chat/completions", json={**CHAT, **change}), 400)
    assert words in message


def test_malformed_json_and_non_objects_are_400(client: TestClient) -> None:
    for content in (b"{not json", b"[1, 2]", b"", b"null", b'"text"'):
        response = client.post("/v1/chat/completions", content=content,
                               headers={"Content-Type": "application/json"})
        assert_error(response, 400)


@pytest.mark.parametrize(("content", "code", "words"), [
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "invalid_encoding", "UTF-8"),
    (b'{"max_tokens": ' + b"9" * 5000 + b"}", "number_too_large", "digits"),
    (b"[" * 10_000 + b"]" * 10_000, "nesting_too_deep", "too deeply"),
    (b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "nesting_too_deep", "deeply"),
    (b"{not json", "invalid_json", "not valid JSON"),
])
def test_an_unreadable_body_says_why_with_a_code(client: TestClient, content: bytes, code: str,
                                                 words: str) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/api/load"):
        response = client.post(path, content=content)
        assert words in assert_error(response, 400, code), path


def test_every_error_has_a_code(client: TestClient) -> None:
    """The error shape's `code` is never null, whoever raised the error."""
    for response in (client.get("/v1/nothing"), client.delete("/v1/models"),
                     client.post("/v1/completions", content=b"[1]"),
                     client.post("/api/load", json={"model_path": "missing.gguf"}),
                     TestClient(client.app).get("/v1/models")):
        assert response.status_code >= 400
        assert isinstance(response.json()["error"]["code"], str), response.text


def test_unknown_model_is_404(client: TestClient) -> None:
    message = assert_error(client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}),
                           404, "model_not_found")
    assert "gpt-9" in message and "fake" in message


def test_body_is_json_whatever_the_content_type(client: TestClient) -> None:
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = client.post("/v1/chat/completions", content=json.dumps(CHAT), headers=headers)
        assert response.status_code == 200, response.text


def test_unknown_fields_are_ignored(client: TestClient) -> None:
    response = client.post("/v1/chat/completions",
                           json={**CHAT, "user": "u1", "parallel_tool_calls": True, "x": {}})
    assert response.status_code == 200


def test_unknown_route_and_method_in_openai_shape(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/chat/completions"), 405)


def test_body_over_the_limit_is_413(fake_engine: FakeEngine,
                                    make_app: Callable[..., FastAPI]) -> None:
    small = TestClient(make_app(fake_engine, limits=ServerLimits(max_body_bytes=2048)),
                       headers=AUTH)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
    assert_error(small.post("/v1/chat/completions", json=big), 413, "request_too_large")

    def chunked() -> Any:  # no Content-Length: the limit must hold while reading
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 512
        yield b'"}]}'

    assert_error(small.post("/v1/chat/completions", content=chunked()), 413)
    assert small.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_context_overflow_is_400_streaming_or_not(client: TestClient,
                                                  fake_engine: FakeEngine) -> None:
    long_prompt = "x" * (fake_engine.n_ctx + 10)
    for stream in (False, True):
        response = client.post("/v1/completions", json={"prompt": long_prompt, "stream": stream})
        assert_error(response, 400, "context_length_exceeded")


def test_engine_failure_is_reported_and_the_server_keeps_serving(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"prompt": FAIL_MARKER})
    assert "RuntimeError" in assert_error(response, 500, "internal_error")
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_no_model_is_503(client: TestClient) -> None:
    assert client.post("/api/unload", json={}).json() == {"unloaded": True}
    listed = client.get("/v1/models").json()["data"]  # the library, none of it resident
    assert listed and {m["outrider"]["state"] for m in listed} == {"on_disk"}
    message = assert_error(client.post("/v1/chat/completions", json=UNNAMED), 503,
                           "model_not_loaded")
    assert "/api/load" in message
    # Named, it is loaded just in time (the primary engine is free).
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert client.get("/api/status").json()["resident"][0]["name"] == "fake"


# --- /api/ ------------------------------------------------------------------------------

def test_load_streams_plan_progress_and_loaded(client: TestClient, models_dir: Path) -> None:
    fake_gguf(models_dir / "o" / "r" / "other.gguf")
    response = client.post("/api/load", json={"model_path": "o/r/other.gguf", "n_ctx": 512})
    events = parse_sse(response.text)
    names = [name for name, _ in events]
    assert names[0] == "plan" and names[-1] == "loaded"
    assert [d["fraction"] for n, d in events if n == "progress"] == [0.0, 0.5, 1.0]
    loaded = events[-1][1]
    assert loaded["model"]["name"] == "other"
    assert loaded["model"]["settings"]["n_ctx"] == 512
    status = client.get("/api/status").json()
    assert status["state"] == "ready" and status["model"]["name"] == "other"
    assert status["settings"]["model_path"] == str((models_dir / "o/r/other.gguf").resolve())
    assert {"kv_cells_used", "kv_cells_total", "active_sequences"} <= set(status)


def test_a_file_that_is_not_a_model_is_400_before_streaming(client: TestClient,
                                                            models_dir: Path) -> None:
    (models_dir / "broken.gguf").write_bytes(b"not a model")
    response = client.post("/api/load", json={"model_path": "broken.gguf"})
    assert "not a GGUF" in assert_error(response, 400, "invalid_model_file")


def test_a_file_name_with_control_characters_is_escaped_in_the_error(client: TestClient,
                                                                     models_dir: Path) -> None:
    (models_dir / "bad\n\x1b[31m.gguf").write_bytes(b"not a model")
    response = client.post("/api/load", json={"model_path": "bad\n\x1b[31m.gguf"})
    message = assert_error(response, 400, "invalid_model_file")
    assert "bad\\n\\x1b[31m.gguf" in message and message.isprintable()
    missing = assert_error(client.post("/api/load", json={"model_path": "gone\r.gguf"}), 404)
    assert "gone\\r.gguf" in missing


@pytest.mark.parametrize("path", ["../outside.gguf", "o/../../outside.gguf", "/etc/passwd",
                                  "link/outside.gguf"])
def test_load_refuses_paths_outside_the_library(client: TestClient, models_dir: Path,
                                                path: str) -> None:
    outside = fake_gguf(models_dir.parent / "outside.gguf")
    (models_dir / "link").symlink_to(outside.parent, target_is_directory=True)
    response = client.post("/api/load", json={"model_path": path})
    assert "outside the models library" in assert_error(response, 403, "path_not_allowed")
    response = client.post("/api/load", json={"model_path": "fake.gguf",
                                              "draft": {"kind": "model", "model_path": path}})
    assert_error(response, 403)


def test_start_model_and_allow_any_path_may_be_outside(fake_engine: FakeEngine, tmp_path: Path,
                                                       make_app: Callable[..., FastAPI]) -> None:
    outside = fake_gguf(tmp_path / "elsewhere" / "m.gguf")
    for kwargs in ({"allowed_models": [outside]}, {"allow_any_path": True}):
        app_client = TestClient(make_app(fake_engine, **kwargs), headers=AUTH)
        events = parse_sse(app_client.post("/api/load", json={"model_path": str(outside)}).text)
        assert events[-1][0] == "loaded"


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"model_path": "fake.gguf", "n_ctx": "big"}, 400, "n_ctx"),
    ({"model_path": "fake.gguf", "n_ctx": 4}, 400, "at least 16"),
    ({"model_path": "fake.gguf", "turbo": True}, 400, "turbo"),
    ({"model_path": "fake.gguf", "draft": {"kind": "model", "k": 4, "x": 1}}, 400, "draft.x"),
    ({"n_ctx": 512}, 400, "model_path"),
    ([1, 2], 400, "JSON object"),
    ({"model_path": "missing.gguf"}, 404, "no model file"),
    ({"model_path": 5}, 400, "model_path"),
])
def test_load_rejects_bad_settings_before_streaming(client: TestClient, body: Any, status: int,
                                                    words: str) -> None:
    assert words in assert_error(client.post("/api/load", json=body), status)


def test_a_second_load_while_loading_is_409(client: TestClient, fake_engine: FakeEngine,
                                            models_dir: Path) -> None:
    fake_engine.load_gate = threading.Event()
    with ServerThread(client.app) as server, httpx.Client(base_url=server.url,
                                                          headers=AUTH) as http:  # type: ignore[arg-type]
        with http.stream("POST", "/api/load", json={"model_path": "owner/repo/fake.gguf"}) as first:
            lines = first.iter_lines()
            assert next(lines) == "event: plan"
            deadline = time.monotonic() + 10
            while http.get("/api/status").json()["state"] != "loading":
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert_error(http.post("/api/load", json={"model_path": "owner/repo/fake.gguf"}),
                         409, "engine_busy")
            assert_error(http.post("/api/unload"), 409)
            # A chat for the model being loaded waits for the load instead of a 503.
            waiting: list[httpx.Response] = []
            chat = threading.Thread(target=lambda: waiting.append(
                http.post("/v1/chat/completions", json=CHAT)))
            chat.start()
            fake_engine.load_gate.set()
            assert "event: loaded" in list(lines)
            chat.join(timeout=30)
            assert waiting and waiting[0].status_code == 200, waiting
        assert http.get("/api/status").json()["state"] == "ready"


def test_a_request_sent_as_loaded_arrives_is_served(client: TestClient,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The app sends its first chat the moment it reads "loaded": the server must be ready
    by then. A slow release of the load lock makes the old order (announce, then release)
    fail every time."""
    state = client.app.state.outrider  # type: ignore[attr-defined]
    release = state.end_exclusive

    def slow_release() -> None:
        time.sleep(0.3)
        release()

    monkeypatch.setattr(state, "end_exclusive", slow_release)
    with ServerThread(client.app) as server, httpx.Client(base_url=server.url,
                                                          headers=AUTH) as http:  # type: ignore[arg-type]
        with http.stream("POST", "/api/load", json={"model_path": "owner/repo/fake.gguf"}) as load:
            for line in load.iter_lines():
                if line == "event: loaded":
                    break
            response = http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200, response.text


def test_a_503_is_not_called_an_internal_error(client: TestClient) -> None:
    client.post("/api/unload", json={})
    message = assert_error(client.post("/v1/chat/completions", json=UNNAMED), 503,
                           "model_not_loaded")
    assert "internal error" not in message


def test_metrics_snapshot_has_the_documented_fields(client: TestClient) -> None:
    snapshot = client.get("/api/metrics").json()
    assert {"time", "devices", "engine_rss_bytes", "decode_tokens_per_s", "prefill_tokens_per_s",
            "acceptance_rate", "mean_accepted_length", "draft_k", "drafting_off_reason",
            "kv_cells_used", "kv_cells_total", "active_sequences",
            "waiting_sequences"} <= set(snapshot)
    assert snapshot["engine_rss_bytes"] > 0
    cpu = snapshot["devices"][0]
    assert {"id", "name", "kind", "total_bytes", "free_bytes", "planned"} <= set(cpu)
    assert cpu["total_bytes"] >= cpu["free_bytes"] > 0


def test_metrics_stream_sends_snapshots(client: TestClient) -> None:
    with ServerThread(client.app) as server, httpx.stream(
            "GET", f"{server.url}/api/metrics/stream", headers=AUTH) as response:
        events = []
        for line in response.iter_lines():
            if line.startswith("event: "):
                events.append(line)
            if len(events) == 2:
                break
    assert events == ["event: metrics", "event: metrics"]


def test_web_pages_are_refused_unless_their_origin_is_allowed(
        fake_engine: FakeEngine, make_app: Callable[..., FastAPI]) -> None:
    origin = {"Origin": "http://localhost:5173"}
    for api_key in (API_KEY, None):  # a key-less local server must not be drivable by pages
        plain = TestClient(make_app(fake_engine, api_key=api_key), headers=AUTH)
        response = plain.post("/v1/chat/completions", json=CHAT,
                              headers={**origin, "Content-Type": "text/plain"})
        assert "--cors-origin" in assert_error(response, 403, "origin_not_allowed")
        assert "access-control-allow-origin" not in response.headers
    cors = TestClient(make_app(fake_engine, cors_origins=["http://localhost:5173"]), headers=AUTH)
    preflight = cors.options("/v1/chat/completions", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
    allowed = cors.post("/v1/chat/completions", json=CHAT, headers=origin)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert_error(cors.get("/v1/models", headers={"Origin": "http://evil.example"}), 403)


def test_a_local_server_refuses_foreign_host_names(fake_engine: FakeEngine,
                                                   make_app: Callable[..., FastAPI]) -> None:
    app = make_app(fake_engine, local_only=True)
    for base in ("http://127.0.0.1:1234", "http://localhost", "http://[::1]:80"):
        assert TestClient(app, base_url=base, headers=AUTH).get("/v1/models").status_code == 200
    rebound = TestClient(app, base_url="http://attacker.example:1234", headers=AUTH)
    assert "loopback" in assert_error(rebound.get("/api/status"), 403)
    lookalike = TestClient(app, headers={**AUTH, "Host": "[::1].evil.example"})
    assert "loopback" in assert_error(lookalike.get("/api/status"), 403, "origin_not_allowed")


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.1:1234", True), ("127.9.8.7:80", True),
    ("localhost", True), ("LocalHost:8080", True), ("[::1]", True), ("[::1]:1234", True),
    (" [::1]:80 ", True),
    ("[::1].evil.example", False), ("[::1]evil", False), ("[::1]:80.evil.example", False),
    ("[::1]:", False), ("[::1]:http", False), ("[::1", False), ("::1", False),
    ("[127.0.0.1]", False), ("127.0.0.1.evil.example", False), ("127.0.0.1:80:80", False),
    ("127.1", False), ("localhost.evil.example", False), ("evil.example:1234", False),
    ("localhost:", False), ("localhost:99999999", False), ("localhost:８０", False),
    ("", False), ("[::2]:80", False), ("10.0.0.1", False),
])
def test_host_header_parse(host: str, loopback: bool) -> None:
    assert host_is_loopback(host) is loopback


def test_client_disconnect_cancels_the_request(fake_engine: FakeEngine,
                                               make_app: Callable[..., FastAPI]) -> None:
    fake_engine.step_s = 0.005
    with ServerThread(make_app(fake_engine)) as server:
        with httpx.stream("POST", f"{server.url}/v1/completions", headers=AUTH,
                          json={"prompt": "go", "max_tokens": 256, "stream": True}) as response:
            received = 0
            for line in response.iter_lines():
                received += line.startswith("data: ")
                if received == 3:
                    break
        handle = fake_engine.submitted[-1]
        assert handle.cancelled.wait(timeout=10)
        deadline = time.monotonic() + 10
        while fake_engine.status().active_sequences:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert fake_engine.status().kv_cells_used == 0


def test_non_streaming_disconnect_cancels_too(fake_engine: FakeEngine,
                                              make_app: Callable[..., FastAPI]) -> None:
    fake_engine.step_s = 0.05
    with ServerThread(make_app(fake_engine)) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=0.5,
                       json={"prompt": "go", "max_tokens": 256})
        assert fake_engine.submitted[-1].cancelled.wait(timeout=10)


def test_the_key_is_never_echoed(client: TestClient) -> None:
    for headers in ({"Authorization": "Bearer nope"}, {}):
        response = TestClient(client.app).get("/v1/models", headers=headers)
        assert API_KEY not in response.text


# --- the real engine --------------------------------------------------------------------

def test_load_status_metrics_unload_on_the_real_engine(tiny_target: Path, models_dir: Path,
                                                       make_app: Callable[..., FastAPI]) -> None:
    engine_module = pytest.importorskip("runtime.engine.engine")
    engine = engine_module.Engine()
    engine.start()
    try:
        library_copy = models_dir / "owner" / "tiny" / "tiny.gguf"
        library_copy.parent.mkdir(parents=True)
        library_copy.write_bytes(tiny_target.read_bytes())
        with ServerThread(make_app(engine)) as server, httpx.Client(
                base_url=server.url, headers=AUTH, timeout=60) as http:
            assert http.get("/api/status").json()["state"] == "empty"
            assert_error(http.post("/v1/completions", json={"prompt": "x"}), 503)
            events = parse_sse(http.post("/api/load", json={
                "model_path": "owner/tiny/tiny.gguf", "n_ctx": 512, "n_parallel": 2}).text)
            assert events[0][0] == "plan" and events[-1][0] == "loaded", events[-1]
            plan = events[0][1]
            assert plan is not None and plan["n_ctx"] == 512
            fractions = [data["fraction"] for name, data in events if name == "progress"]
            assert fractions == sorted(fractions)
            loaded = events[-1][1]
            assert loaded["model"]["name"] == "tiny" and loaded["measured"]
            status = http.get("/api/status").json()
            assert status["state"] == "ready" and status["plan"] == plan
            assert status["kv_cells_total"] >= 512
            reply = http.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 3,
                                                         "temperature": 0})
            assert reply.json()["usage"]["completion_tokens"] == 3
            metrics = http.get("/api/metrics").json()
            assert metrics["devices"][-1]["planned"]["weights"] > 0
            assert metrics["kv_cells_used"] > 0
            assert http.post("/api/unload").json() == {"unloaded": True}
            assert http.get("/api/status").json()["model"] is None
            assert_error(http.post("/api/load", json={"model_path": "owner/tiny/none.gguf"}), 404)
    finally:
        engine.stop()
