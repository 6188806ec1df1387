"""Fixtures for the server tests: the fake engine, the real engine on the tiny model, and a
real uvicorn server in a thread on a free port (what the `openai` client talks to).

The client-API modules (OpenAI, Anthropic, Ollama, Responses) share the fake servers here:
`fake_engine` / `fake_url` (a `FakeEngine` whose model file is
`models_dir/owner/repo/<fake_stem>.gguf`; a module overrides the `fake_stem` fixture to name
it otherwise) and `scripted_engine` / `scripted_url` (a `ScriptedEngine` of the Hermes
family: a test sets its `replies` and `family`). Each module wraps the URL in its own client.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvicorn
from fastapi import FastAPI

from runtime.chat.families import Family
from runtime.engine.api import EngineAPI
from runtime.server import ServerLimits, create_app
from runtime.server.serve import bind_socket, server_url
from runtime.settings.load import LoadSettings
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import TARGET
from tests.server.fake_engine import FakeEngine
from tests.server.scripted_engine import ScriptedEngine

API_KEY = "test-key-0123456789"
# Template families a scripted engine plays: Hermes-style calls, DeepSeek-R1-style thinking.
HERMES = Family("hermes", tools=True, reasoning="none", arguments_as_object=True)
R1 = Family("deepseek_r1", tools=True, reasoning="think")
E = TypeVar("E", bound=FakeEngine)


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


def loaded_fake(engine: E, models_dir: Path, stem: str = "fake") -> E:
    """`engine` started, with the fake model `models_dir/owner/repo/<stem>.gguf` loaded."""
    engine.start()
    engine.load(LoadSettings(model_path=fake_gguf(models_dir / "owner" / "repo" / f"{stem}.gguf")))
    return engine


@pytest.fixture
def fake_stem() -> str:
    """The fake model's file stem: a module overrides this fixture to name it otherwise."""
    return "fake"


@pytest.fixture
def fake_engine(models_dir: Path, fake_stem: str) -> Iterator[FakeEngine]:
    engine = loaded_fake(FakeEngine(), models_dir, fake_stem)
    yield engine
    engine.stop()


@pytest.fixture
def scripted_engine(models_dir: Path, fake_stem: str) -> Iterator[ScriptedEngine]:
    """A scripted Hermes-family model (tests set `replies` and `family`)."""
    engine = loaded_fake(ScriptedEngine(family=HERMES), models_dir, fake_stem)
    yield engine
    engine.stop()


def fake_app(engine: EngineAPI, models_dir: Path, **kwargs: Any) -> FastAPI:
    """The app the fake-engine tests serve: the test key, small limits, `models_dir`."""
    kwargs.setdefault("api_key", API_KEY)
    kwargs.setdefault("limits", ServerLimits(max_tokens=256, metrics_interval_s=0.05))
    return create_app(engine, models_dir=models_dir, **kwargs)


@pytest.fixture
def make_app(models_dir: Path) -> Callable[..., FastAPI]:
    def make(engine: EngineAPI, **kwargs: Any) -> FastAPI:
        return fake_app(engine, models_dir, **kwargs)

    return make


@pytest.fixture
def fake_url(fake_engine: FakeEngine, make_app: Callable[..., FastAPI]) -> Iterator[str]:
    """`fake_engine` behind a real server: its URL."""
    with ServerThread(make_app(fake_engine)) as server:
        yield server.url


@pytest.fixture
def scripted_url(scripted_engine: ScriptedEngine,
                 make_app: Callable[..., FastAPI]) -> Iterator[str]:
    """`scripted_engine` behind a real server: its URL."""
    with ServerThread(make_app(scripted_engine)) as server:
        yield server.url


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
