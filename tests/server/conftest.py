"""Fixtures for the server tests: the fake engine, the real engine on the tiny model, and a
real uvicorn server in a thread on a free port (what the `openai` client talks to)."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from runtime.engine.api import EngineAPI
from runtime.server import ServerLimits, create_app
from runtime.server.serve import bind_socket, server_url
from runtime.settings.load import LoadSettings
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import TARGET
from tests.server.fake_engine import FakeEngine

API_KEY = "test-key-0123456789"


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = bind_socket("127.0.0.1", 0)
        self.url = server_url(self.sock)
        config = uvicorn.Config(app, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@dataclass
class Served:
    url: str
    engine: Any
    app: FastAPI
    models_dir: Path


def fake_gguf(path: Path) -> Path:
    """A model file for the fake engine: a copy of the tiny target, so the checks the server
    makes before a load (the preflight) pass it as they pass a real model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_model_path(TARGET), path)
    return path


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def fake_engine(models_dir: Path) -> Iterator[FakeEngine]:
    engine = FakeEngine()
    engine.start()
    engine.load(LoadSettings(model_path=fake_gguf(models_dir / "owner" / "repo" / "fake.gguf")))
    yield engine
    engine.stop()


@pytest.fixture
def make_app(models_dir: Path) -> Callable[..., FastAPI]:
    def make(engine: EngineAPI, **kwargs: Any) -> FastAPI:
        kwargs.setdefault("api_key", API_KEY)
        kwargs.setdefault("limits", ServerLimits(max_tokens=256, metrics_interval_s=0.05))
        return create_app(engine, models_dir=models_dir, **kwargs)

    return make


def real_engine(model: Path, **settings: Any) -> EngineAPI:
    """`runtime.engine.engine.Engine`, started, with `model` loaded."""
    engine_module = pytest.importorskip("runtime.engine.engine", reason="runtime.engine.engine not written yet")
    engine: EngineAPI = engine_module.Engine()
    engine.start()
    settings.setdefault("n_ctx", 2048)
    settings.setdefault("n_parallel", 8)
    try:
        engine.load(LoadSettings(model_path=model, **settings))
    except BaseException:
        engine.stop()
        raise
    return engine


@contextlib.contextmanager
def serving(model: Path, models_dir: Path, limits: ServerLimits | None = None,
            **settings: Any) -> Iterator[Served]:
    """A real engine with `model` loaded (with `settings`) behind a real server."""
    engine = real_engine(model, **settings)
    app = create_app(engine, api_key=API_KEY, models_dir=models_dir,
                     limits=limits or ServerLimits(max_tokens=512), allowed_models=[model])
    try:
        with ServerThread(app) as server:
            yield Served(server.url, engine, app, models_dir)
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def tiny_server(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The real engine on the tiny model behind a real server (module-wide: loading and
    starting cost more than the tests)."""
    with serving(tiny_target, tmp_path_factory.mktemp("models")) as served:
        yield served


@pytest.fixture(scope="module")
def default_server(default_model: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The real engine on SmolLM2-135M behind a real server."""
    with serving(default_model, tmp_path_factory.mktemp("models"), n_parallel=4) as served:
        yield served
