"""The model router on fake engines: models loaded by name just in time, alternating, LRU
eviction by memory budget and by count, idle TTLs (a request's `ttl` and Ollama's
`keep_alive`), unloading by name, and the errors (unknown model, too large alone)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtime.server.models.router import ModelRouter, RouterOptions, plan_for
from runtime.server.serve import remembered_settings
from runtime.settings.load import LoadSettings
from runtime.settings.user import AppSettings, ModelPrefs, SettingsStore
from tests.fixtures.fake_rpc_worker import FakeRpcWorker
from tests.server.conftest import API_KEY, fake_gguf
from tests.server.fake_engine import FakeEngine

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "temperature": 0, **extra}


@pytest.fixture
def library(models_dir: Path) -> dict[str, Path]:
    return {name: fake_gguf(models_dir / "owner" / name / f"{name}.gguf")
            for name in ("alpha", "beta")}


@pytest.fixture
def made() -> list[FakeEngine]:
    return []


@pytest.fixture
def routed(make_app: Callable[..., FastAPI], library: dict[str, Path],
           made: list[FakeEngine]) -> Iterator[Callable[..., TestClient]]:
    """A server whose primary engine is empty and which makes a fake engine per model."""
    clients: list[TestClient] = []

    def make_engine() -> FakeEngine:
        engine = FakeEngine()
        made.append(engine)
        return engine

    def build(**options: Any) -> TestClient:
        primary = make_engine()
        primary.start()
        app = make_app(primary, make_engine=make_engine,
                       settings_for=lambda path: LoadSettings(model_path=path, n_ctx=512),
                       router_options=RouterOptions(**options))
        client = TestClient(app, headers=AUTH)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.app.state.outrider.router.close()  # type: ignore[attr-defined]
    for engine in made:
        engine.stop()


def router_of(client: TestClient) -> ModelRouter:
    router: ModelRouter = client.app.state.outrider.router  # type: ignore[attr-defined]
    return router


def resident(client: TestClient) -> list[str]:
    return sorted(r["name"] for r in client.get("/api/status").json()["resident"])


def answer(client: TestClient, model: str, **extra: Any) -> httpx.Response:
    response = client.post("/v1/chat/completions", json=chat(model, **extra))
    assert response.status_code == 200, response.text
    return response


def test_two_models_answer_alternately_by_name(routed: Callable[..., TestClient],
                                               made: list[FakeEngine]) -> None:
    client = routed()
    for model in ("alpha", "beta", "alpha", "beta"):
        assert answer(client, model).json()["model"] == model
    assert resident(client) == ["alpha", "beta"]
    assert len(made) == 2  # the primary took alpha, one more engine beta: no reload
    listed = {m["id"]: m["outrider"]["state"] for m in client.get("/v1/models").json()["data"]}
    assert listed == {"alpha": "ready", "beta": "ready"}


def test_names_of_every_dialect_reach_the_same_model(routed: Callable[..., TestClient]) -> None:
    client = routed()
    assert answer(client, "owner/alpha:F32").json()["model"] == "alpha"  # Ollama-style name
    response = client.post("/api/chat", json={"model": "alpha", "messages": [
        {"role": "user", "content": "Hi"}], "stream": False, "options": {"num_predict": 2}})
    assert response.status_code == 200, response.text
    assert resident(client) == ["alpha"]


def test_a_budget_for_one_model_unloads_the_first_for_the_second(
        routed: Callable[..., TestClient], library: dict[str, Path]) -> None:
    plan = plan_for(LoadSettings(model_path=library["alpha"], n_ctx=512))
    client = routed(memory_budget_bytes=int(plan["total"] * 1.5))
    answer(client, "alpha")
    assert resident(client) == ["alpha"]
    answer(client, "beta")
    assert resident(client) == ["beta"]
    answer(client, "alpha")
    assert resident(client) == ["alpha"]


def test_the_cap_on_resident_models_evicts_the_least_recently_used(
        routed: Callable[..., TestClient]) -> None:
    client = routed(max_resident=1)
    answer(client, "alpha")
    answer(client, "beta")
    assert resident(client) == ["beta"]


def test_a_model_that_fits_no_budget_is_a_400_with_the_plan(
        routed: Callable[..., TestClient]) -> None:
    client = routed(memory_budget_bytes=1000)
    response = client.post("/v1/chat/completions", json=chat("alpha"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "model_too_large"
    assert "needs" in error["message"] and "free with no other model loaded" in error["message"]
    assert resident(client) == []
    assert client.get("/health").status_code == 200


def test_ttl_zero_unloads_after_the_reply(routed: Callable[..., TestClient]) -> None:
    client = routed()
    answer(client, "alpha")
    answer(client, "beta", ttl=0)
    assert router_of(client).wait_unloaded("beta", timeout=10)
    assert resident(client) == ["alpha"]


def test_a_streamed_reply_holds_its_model_until_the_stream_ends(
        routed: Callable[..., TestClient]) -> None:
    client = routed()
    with client.stream("POST", "/v1/chat/completions",
                       json=chat("alpha", ttl=0, stream=True, max_tokens=8)) as response:
        assert response.status_code == 200
        assert resident(client) == ["alpha"]  # the lease holds it while the reply streams
        body = "".join(response.iter_text())
    assert body.rstrip().endswith("data: [DONE]")
    assert router_of(client).wait_unloaded("alpha", timeout=10)


def test_the_idle_ttl_unloads_a_model(routed: Callable[..., TestClient]) -> None:
    client = routed(default_ttl_s=0.2)
    answer(client, "alpha")
    assert router_of(client).wait_unloaded("alpha", timeout=10)  # the TTL thread did it
    answer(client, "alpha")  # and the next request loads it again


def test_ollama_keep_alive_zero_unloads_after_the_reply(
        routed: Callable[..., TestClient]) -> None:
    client = routed()
    response = client.post("/api/generate", json={"model": "alpha", "prompt": "Hi",
                                                   "stream": False, "keep_alive": 0,
                                                   "options": {"num_predict": 2}})
    assert response.status_code == 200, response.text
    assert router_of(client).wait_unloaded("alpha", timeout=10)


def test_ollama_ps_shows_when_a_model_expires(routed: Callable[..., TestClient]) -> None:
    client = routed()
    client.post("/api/generate", json={"model": "alpha", "prompt": "", "keep_alive": "5m"})
    models = client.get("/api/ps").json()["models"]
    assert [m["name"] for m in models] == ["owner/alpha:F32"]
    assert models[0]["expires_at"] is not None


def test_a_bad_keep_alive_is_a_400_in_ollamas_shape(routed: Callable[..., TestClient]) -> None:
    client = routed()
    response = client.post("/api/generate", json={"model": "alpha", "prompt": "Hi",
                                                   "keep_alive": "soon"})
    assert response.status_code == 400
    assert "keep_alive" in response.json()["error"]


def test_unload_by_name(routed: Callable[..., TestClient]) -> None:
    client = routed()
    answer(client, "alpha")
    answer(client, "beta")
    assert client.post("/api/unload", json={"model": "beta"}).json() == {"unloaded": True}
    assert resident(client) == ["alpha"]
    response = client.post("/api/unload", json={"model": "beta"})
    assert response.status_code == 404 and "resident: alpha" in response.json()["error"]["message"]
    assert client.post("/api/unload", json={"model": 3}).status_code == 400


def test_an_unknown_model_is_a_404_listing_the_library(
        routed: Callable[..., TestClient]) -> None:
    client = routed()
    response = client.post("/v1/chat/completions", json=chat("gpt-9"))
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert "gpt-9" in message and "owner/alpha:F32 (alpha)" in message
    assert resident(client) == []


def test_a_load_that_fails_is_reported_and_nothing_stays_resident(
        routed: Callable[..., TestClient], library: dict[str, Path]) -> None:
    client = routed()
    library["beta"].write_bytes(b"GGUF" + b"\0" * 64)  # the preflight passed, llama.cpp won't
    response = client.post("/v1/chat/completions", json=chat("beta"))
    assert 400 <= response.status_code < 500, response.text
    assert resident(client) == []
    answer(client, "alpha")


def test_a_model_loaded_on_demand_gets_the_settings_the_app_remembers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SettingsStore(tmp_path / "settings.toml")
    model = tmp_path / "m.gguf"
    remembered = AppSettings().with_model(model, ModelPrefs(LoadSettings(model_path=model,
                                                                          n_ctx=1536)))
    store.save(remembered)
    monkeypatch.setattr("runtime.server.serve.SettingsStore", lambda: store)
    assert remembered_settings(model).n_ctx == 1536
    assert remembered_settings(tmp_path / "other.gguf").n_ctx == 4096  # the fit defaults


def test_models_sharing_a_worker_take_turns(make_app: Callable[..., FastAPI],
                                            library: dict[str, Path],
                                            made: list[FakeEngine]) -> None:
    """A worker serves one client at a time: loading a model that names a worker an idle
    resident model holds unloads that model first (else the worker could not even be asked
    what it has free); a model on other workers stays."""
    worker = FakeRpcWorker().__enter__()
    shared = worker.endpoint
    library["gamma"] = fake_gguf(library["alpha"].parents[1] / "gamma" / "gamma.gguf")

    def make_engine() -> FakeEngine:
        made.append(FakeEngine())
        return made[-1]

    def settings_for(path: Path) -> LoadSettings:
        workers = (shared,) if path.stem in ("alpha", "beta") else ()
        return LoadSettings(model_path=path, n_ctx=512, workers=workers)

    primary = make_engine()
    primary.start()
    app = make_app(primary, make_engine=make_engine, settings_for=settings_for)
    try:
        with TestClient(app, headers=AUTH) as client:
            for model in ("alpha", "gamma", "beta"):
                assert answer(client, model).status_code == 200
            assert resident(client) == ["beta", "gamma"]  # alpha gave beta its worker
            assert answer(client, "alpha").status_code == 200
            assert resident(client) == ["alpha", "gamma"]
    finally:
        router_of(client).close()
        worker.__exit__(None, None, None)
        for engine in made:
            engine.stop()
