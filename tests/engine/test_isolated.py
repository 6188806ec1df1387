"""`IsolatedEngine`: the real engine in a child process gives the in-process engine's tokens
and events, its typed errors, progress, cancel and embeddings; a child killed mid-stream
ends its requests with EngineCrashed and no call hangs; stop leaves no process behind, and
a child whose parent dies exits. The real-engine child is spawned once for the module (each
spawn imports llama_cpp); the lifecycle tests use the fake in tests/engine/fake_engine.py."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from runtime.engine.api import EngineAPI
from runtime.engine.engine import Engine
from runtime.engine.isolated import IsolatedEngine
from runtime.errors import (
    EngineCrashed,
    EngineError,
    ModelNotFound,
    NoModelLoaded,
    NotAGGUF,
    SettingsError,
)
from runtime.events import (
    ChatMessage,
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from tests.engine.conftest import tiny_settings
from tests.engine.fake_engine import FakeEngine, exit_at_once

BOUND_S = 60.0  # a generous bound on any one wait: the test fails instead of hanging
PROMPTS = ["the cat went to the sea and then", "the owl went to the wood and then"]


@pytest.fixture(scope="module")
def iso() -> Iterator[IsolatedEngine]:
    engine = IsolatedEngine(Engine, name="iso-test")  # a bare engine, as the `engine` fixture's
    engine.start()
    yield engine
    engine.stop()


def shape(events: list[Event]) -> list[tuple[object, ...]]:
    """What must be equal in- and out-of-process: each event's kind, sample, token and text,
    or its finish reason and token counts (timings differ)."""
    out: list[tuple[object, ...]] = []
    for e in events:
        if isinstance(e, TokenEvent):
            out.append(("token", e.index, e.token_id, e.text))
        elif isinstance(e, Finished):
            out.append(("finished", e.index, e.reason, e.usage.prompt_tokens,
                        e.usage.completion_tokens))
        else:
            out.append((type(e).__name__, e))
    return out


def requests() -> list[GenerationRequest]:
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    return [
        GenerationRequest(prompt=PROMPTS[0], sampling=greedy),
        GenerationRequest(messages=(ChatMessage("user", "hello there"),), sampling=greedy),
        GenerationRequest(prompt=PROMPTS[1], n=2,
                          sampling=SamplingParams(temperature=0.9, seed=7, max_tokens=24)),
    ]


def test_tokens_and_events_are_the_in_process_engines(iso: IsolatedEngine, engine: Engine,
                                                      tiny_target: Path) -> None:
    local_info = engine.load(tiny_settings(tiny_target))
    info = iso.load(tiny_settings(tiny_target))
    assert info.name == local_info.name and info.n_vocab == local_info.n_vocab
    for here, there in zip(requests(), requests(), strict=True):
        expected = list(engine.submit(here).events(timeout=BOUND_S))
        got = list(iso.submit(there).events(timeout=BOUND_S))
        assert shape(got) == shape(expected)
        assert all(e.request_id == there.id for e in got)
        kinds = [type(e) for e in got]
        assert TokenEvent in kinds and kinds[-1] is Finished
        assert kinds.count(Finished) == there.n
    assert isinstance(iso.status().model, type(info)) and iso.status().state == "ready"
    assert iso.metrics().kv_cells_total == engine.metrics().kv_cells_total
    chat = [ChatMessage("user", "hi")]
    assert iso.render_chat(chat) == engine.render_chat(chat)
    there, here = iso.status().model, engine.status().model
    assert there is not None and here is not None
    assert (there.family, there.call_tokens) == (here.family, here.call_tokens)


def test_progress_arrives_on_the_loading_thread(iso: IsolatedEngine, tiny_target: Path) -> None:
    seen: list[tuple[float, int]] = []
    iso.load(tiny_settings(tiny_target), on_progress=lambda f: seen.append((f, threading.get_ident())))
    fractions = [f for f, _ in seen]
    assert fractions and fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert {ident for _, ident in seen} == {threading.get_ident()}


def test_errors_come_back_typed(iso: IsolatedEngine, engine: Engine, tiny_target: Path,
                                tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 100)
    for path, cls in ((tmp_path / "missing.gguf", ModelNotFound), (junk, NotAGGUF)):
        with pytest.raises(cls) as local:
            engine.load(tiny_settings(path))
        with pytest.raises(cls) as remote:
            iso.load(tiny_settings(path))
        assert type(remote.value) is type(local.value) and str(remote.value) == str(local.value)
    with pytest.raises(NoModelLoaded):  # the failed load left nothing loaded, as in-process
        iso.submit(GenerationRequest(prompt="x"))
    with pytest.raises(NoModelLoaded):
        iso.render_chat([ChatMessage("user", "hi")])
    iso.load(tiny_settings(tiny_target, n_ctx=256))
    events = list(iso.submit(GenerationRequest(prompt=(5,) * 300)).events(timeout=BOUND_S))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert events[0].kind == "ContextOverflow" and "300 tokens" in events[0].message
    with pytest.raises(SettingsError):
        iso.embed([])


def test_cancel_ends_the_stream(iso: IsolatedEngine, tiny_target: Path) -> None:
    iso.load(tiny_settings(tiny_target))
    handle = iso.submit(GenerationRequest(prompt=PROMPTS[0], sampling=SamplingParams(
        temperature=0.0, max_tokens=400, ignore_eos=True)))
    first = handle.get(timeout=BOUND_S)
    assert isinstance(first, TokenEvent)
    handle.cancel()
    rest = list(handle.events(timeout=BOUND_S))
    assert isinstance(rest[-1], Finished) and rest[-1].reason == "cancelled"
    assert rest[-1].usage.completion_tokens < 400
    assert iso.status().active_sequences == 0


def test_embeddings_are_the_in_process_engines(iso: IsolatedEngine, engine: Engine,
                                               tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    iso.load(tiny_settings(tiny_target))
    texts = ["hello world", "the cat sat on the mat"]
    local, remote = engine.embed(texts), iso.embed(texts)
    assert remote.n_tokens == local.n_tokens and remote.pooling == local.pooling
    for a, b in zip(remote.vectors, local.vectors, strict=True):
        assert a.dtype == np.float32 and np.allclose(a, b, atol=1e-6)


def test_a_killed_child_ends_its_requests_and_later_calls(tiny_target: Path) -> None:
    engine = IsolatedEngine(Engine, name="doomed")
    try:
        info = engine.load(tiny_settings(tiny_target, n_ctx=2048))
        handle = engine.submit(GenerationRequest(prompt=PROMPTS[0], sampling=SamplingParams(
            temperature=0.0, max_tokens=2000, ignore_eos=True)))
        assert isinstance(handle.get(timeout=BOUND_S), TokenEvent)
        pid = engine.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        last = list(handle.events(timeout=BOUND_S))[-1]
        assert isinstance(last, ErrorEvent) and last.kind == "EngineCrashed"
        assert info.name in last.message and "signal 9" in last.message
        assert "loads it again" in last.message
        assert not engine.alive
        for call in (engine.status, engine.metrics,
                     lambda: engine.submit(GenerationRequest(prompt="x")),
                     lambda: engine.load(tiny_settings(tiny_target))):
            with pytest.raises(EngineCrashed):
                call()
        assert not psutil.pid_exists(pid)  # reaped, not a zombie
    finally:
        engine.stop()
    assert engine.pid is None
    again = IsolatedEngine()  # the default factory: drafting, planner, load probe
    try:
        again.load(tiny_settings(tiny_target))
        events = list(again.submit(requests()[0]).events(timeout=BOUND_S))
        assert isinstance(events[-1], Finished)
    finally:
        again.stop()


def test_it_is_an_engine_api() -> None:
    api: EngineAPI = IsolatedEngine()  # checked by mypy: every method of the protocol
    assert api.status().state == "empty" and not IsolatedEngine().alive  # nothing spawned


def test_a_call_waiting_on_a_killed_child_raises() -> None:
    engine = IsolatedEngine(FakeEngine, name="fake")
    engine.start()
    outcome: list[BaseException] = []

    def embed() -> None:
        try:
            engine.embed(["never answered"])
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=embed)
    caller.start()
    link = engine._link
    assert link is not None
    waited = threading.Event()
    while not link.pending and caller.is_alive():  # the call is out, waiting for its answer
        waited.wait(0.01)
    os.kill(engine.pid or 0, signal.SIGKILL)
    caller.join(BOUND_S)
    assert not caller.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], EngineCrashed)
    assert "the engine process of fake stopped" in str(outcome[0])
    engine.stop()


def test_stop_ends_open_requests_and_leaves_no_process() -> None:
    engine = IsolatedEngine(FakeEngine)
    engine.start()
    pid = engine.pid
    assert pid is not None and psutil.pid_exists(pid)
    handle = engine.submit(GenerationRequest(prompt="never answered"))
    engine.stop()
    last = list(handle.events(timeout=BOUND_S))[-1]
    assert isinstance(last, ErrorEvent) and last.kind == "NoModelLoaded"
    assert not psutil.pid_exists(pid)
    assert engine.pid is None and not engine.alive
    engine.stop()  # idempotent
    assert engine.status().state == "empty"
    engine.start()  # and it starts again
    assert engine.alive and engine.pid not in (None, pid)
    engine.stop()


def test_a_child_that_does_not_stop_is_killed() -> None:
    engine = IsolatedEngine(functools.partial(FakeEngine, hang_on_stop=True), stop_timeout_s=1.0)
    engine.start()
    pid = engine.pid
    assert pid is not None
    engine.stop()
    assert not psutil.pid_exists(pid)


def test_start_errors_and_foreign_exceptions() -> None:
    failing = IsolatedEngine(functools.partial(FakeEngine, fail_on_start=True))
    with pytest.raises(SettingsError, match="told not to start"):
        failing.start()
    assert not failing.alive and failing.pid is None
    with pytest.raises(EngineError, match="ended while starting \\(exit code 3\\)"):
        IsolatedEngine(exit_at_once).start()
    with pytest.raises(SettingsError, match="cannot be sent to a child process"):
        IsolatedEngine(lambda: FakeEngine()).start()  # a lambda does not pickle
    engine = IsolatedEngine(FakeEngine)
    engine.start()
    try:
        with pytest.raises(ValueError, match="keeps its class"):
            engine.render_chat("value")
        with pytest.raises(EngineError, match="a class of the fake's own"):
            engine.render_chat("other")
        with pytest.raises(SettingsError, match="cannot be sent to the engine process"):
            engine.render_chat([threading.Lock()])
        assert engine.alive and engine.status().state == "empty"
    finally:
        engine.stop()


def test_the_child_exits_when_its_parent_dies(tmp_path: Path) -> None:
    """The parent is a script without a `__main__` guard, too: the child must not run it."""
    script = tmp_path / "unguarded.py"
    script.write_text("from runtime.engine.isolated import IsolatedEngine\n"
                      "from tests.engine.fake_engine import FakeEngine\n"
                      "import threading\n"
                      "engine = IsolatedEngine(FakeEngine)\n"
                      "engine.start()\n"
                      "print(engine.pid, flush=True)\n"
                      "threading.Event().wait()\n")
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        parent.kill()
        parent.wait(BOUND_S)
        child.wait(BOUND_S)  # psutil.TimeoutExpired fails the test
    finally:
        parent.kill()
        parent.wait(BOUND_S)
