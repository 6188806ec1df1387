"""`/api/load` answers a file that cannot load with a plain 4xx, before any stream (docs/api.md,
"Errors"): the preflight's refusal, a remembered llama.cpp crash, and an engine refusal that
comes before the first progress report. Only a failure after loading began is an SSE event."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtime.errors import LoadError
from runtime.gguf.verdicts import LoadVerdict, VerdictStore
from tests.server.conftest import fake_gguf
from tests.server.fake_engine import FakeEngine
from tests.server.sse_parse import parse_sse
from tests.server.test_api import AUTH, assert_error


@pytest.fixture
def client(fake_engine: FakeEngine, make_app: Callable[..., FastAPI]) -> TestClient:
    return TestClient(make_app(fake_engine), headers=AUTH)


CRASH = "llama-model.cpp:1362: GGML_ASSERT(n_expert_used_max <= hparams.n_expert) failed"


def test_a_known_crash_is_refused_before_the_engine_sees_it(
        client: TestClient, fake_engine: FakeEngine, models_dir: Path) -> None:
    before = fake_engine.model
    bad = fake_gguf(models_dir / "o" / "r" / "bad.gguf")
    VerdictStore().put(bad, LoadVerdict(ok=False, reason=CRASH))
    message = assert_error(client.post("/api/load", json={"model_path": "o/r/bad.gguf"}), 400,
                           "invalid_model_file")
    assert message == f"llama.cpp crashed while loading bad.gguf: {CRASH}"
    assert fake_engine.model is before  # never asked to load it


@pytest.mark.parametrize(("error", "status", "code"), [
    (LoadError("llama.cpp could not load m.gguf: key not found in model: llama.context_length"),
     400, "load_failed"),
    (RuntimeError("engine bug"), 500, "internal_error"),
])
def test_a_refusal_before_progress_is_a_status_not_a_stream(
        client: TestClient, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch,
        error: Exception, status: int, code: str) -> None:
    def refuse(settings: Any, on_progress: Callable[[float], None] | None = None) -> Any:
        raise error

    monkeypatch.setattr(fake_engine, "load", refuse)
    response = client.post("/api/load", json={"model_path": "owner/repo/fake.gguf"})
    assert str(error) in assert_error(response, status, code)
    assert client.get("/api/status").json()["state"] != "loading"  # the lock was released


def test_a_failure_after_loading_began_is_an_error_event(
        client: TestClient, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_late(settings: Any, on_progress: Callable[[float], None] | None = None) -> Any:
        assert on_progress is not None
        on_progress(0.0)
        raise LoadError("llama.cpp could not create the context: failed to allocate buffer")

    monkeypatch.setattr(fake_engine, "load", fail_late)
    response = client.post("/api/load", json={"model_path": "owner/repo/fake.gguf"})
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert [name for name, _ in events] == ["plan", "progress", "error"]
    assert events[-1][1]["kind"] == "LoadError"
