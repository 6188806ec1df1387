"""An engine in a child process: `IsolatedEngine` is an `EngineAPI` whose real engine runs in
a process of its own, so a crash of one model (kill -9, the OOM killer, a llama.cpp abort)
takes no other model and not the server down. The server's model router keeps one per
resident model.

    engine = IsolatedEngine(functools.partial(build_engine, saved_kv), name="engine")
    engine.start()                              # spawns the child; returns once its engine runs
    info = engine.load(LoadSettings(model_path=path), on_progress=print)
    handle = engine.submit(GenerationRequest(prompt="Once upon a time"))
    for event in handle.events(timeout=60):     # the same events, in the same order, as
        ...                                     # the in-process engine's
    os.kill(engine.pid, signal.SIGKILL)         # say the kernel ran out of memory:
    handle.get(timeout=5)                       # ErrorEvent(id, "EngineCrashed", "the engine
                                                #   process of tiny-target stopped (signal 9,
                                                #   SIGKILL); the next request loads it again")
    engine.status()                             # raises EngineCrashed; engine.alive is False
    engine.stop()                               # orderly, idempotent; kills after a few seconds

Three modules: this one spawns the child and is the engine's face; the parent's end of the
pipe is `runtime.engine.isolated_link` (calls, handles, a reader thread, the crash sweep);
the child's loop and the messages are `runtime.engine.isolated_child`. Any thread may call.
The child sends every event that is ready in one message, so a fast decode costs one pipe
write per batch, not per token. An exception raised in the child comes back as the same
class with the same message (a class this side cannot rebuild becomes `EngineError`).

Nothing waits forever: when the child dies every waiting call raises `EngineCrashed` and
every open handle ends with its `ErrorEvent`; status() and metrics() give up on a wedged
child after `SNAPSHOT_TIMEOUT_S`. The child exits when its pipe ends or its parent changes,
so a killed server leaves no engines behind.

The factory must pickle (a module-level function, or a `functools.partial` of one with
picklable arguments): the "spawn" start method sends it to a fresh interpreter, which
imports llama_cpp anew — a second or so, paid at `start()`. A frozen app needs
`multiprocessing.freeze_support()` at its entry point for that interpreter to start.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from runtime.engine.api import (
    EmbeddingInput,
    Embeddings,
    EngineAPI,
    EngineMetrics,
    EngineStatus,
    LoadedModel,
)
from runtime.engine.build import build_engine
from runtime.engine.isolated_child import child_main
from runtime.engine.isolated_link import REAP_S, ChildLink, IsolatedHandle, how_it_ended
from runtime.errors import (
    EngineCrashed,
    EngineError,
    NoModelLoaded,
    OutriderError,
    SettingsError,
    shown,
)
from runtime.events import GenerationRequest
from runtime.settings.load import LoadSettings

START_TIMEOUT_S = 120.0  # a spawned interpreter importing llama_cpp on a busy machine
STOP_TIMEOUT_S = 5.0  # an orderly stop, then the child is killed
SNAPSHOT_TIMEOUT_S = 30.0  # status() and metrics(): answered in well under 1 ms when healthy

_SPAWN_LOCK = threading.Lock()  # `_main_hidden`: sys.modules is the process's, so is its lock
_EMPTY_STATUS = EngineStatus("empty", None, 0, 0, 0, 0)
_IDLE_METRICS = EngineMetrics(0.0, 0.0, None, None, None, None, 0, 0, 0, 0)


class IsolatedEngine:
    """Implements `runtime.engine.api.EngineAPI` with the engine `factory()` makes, in a
    child process ("spawn"). Thread-safe. Once the child has died every call raises
    `EngineCrashed` until `stop()`; after `stop()`, `start()` or `load()` spawn a new one.

    Attributes:
        name: names the engine in messages when no model is loaded, and its child process.
    """

    def __init__(self, factory: Callable[[], EngineAPI] = build_engine, *, name: str = "engine",
                 start_timeout_s: float = START_TIMEOUT_S,
                 stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.name = name
        self._factory = factory
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._life = threading.Lock()  # start and stop
        self._link: ChildLink | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid; None before start and after stop."""
        link = self._link
        return link.process.pid if link is not None else None

    @property
    def alive(self) -> bool:
        link = self._link
        return link is not None and link.dead is None

    def start(self) -> None:
        with self._life:
            link = self._link
            if link is not None:
                if link.dead is None:
                    return
                raise link.dead_error()
            context = multiprocessing.get_context("spawn")
            conn, child_conn = context.Pipe(duplex=True)
            process = context.Process(target=child_main, name=f"outrider-{self.name}",
                                      args=(child_conn, self._factory, os.getpid()), daemon=True)
            try:
                with _main_hidden():
                    process.start()
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                conn.close()
                raise SettingsError(f"the engine factory cannot be sent to a child process "
                                    f"({exc}); use a function of an importable module, or "
                                    f"a functools.partial of one") from None
            finally:
                child_conn.close()  # the child holds its end: its death ends the pipe here
            link = ChildLink(process, conn, self.name)
            link.reader.start()
            link.watcher.start()
            try:
                link.wait(link.pending[0], timeout=self._start_timeout_s)
            except TimeoutError:
                process.kill()
                link.reader.join()
                raise EngineError(f"the engine process of {shown(self.name)} did not start "
                                  f"within {self._start_timeout_s:.0f} s") from None
            except EngineCrashed:  # it died before its engine ran: its stderr says why
                link.reader.join(REAP_S * 2)
                raise EngineError(f"the engine process of {shown(self.name)} ended while "
                                  f"starting ({how_it_ended(process.exitcode)})") from None
            except BaseException:
                link.reader.join(REAP_S * 2)
                raise
            self._link = link

    def stop(self) -> None:
        """Stop the child's engine (its open requests get their last events), let it exit,
        kill it if it has not within `stop_timeout_s`. Idempotent."""
        with self._life:
            link, self._link = self._link, None
            if link is None:
                return
            with link.lock:
                link.stopping = True
            answered = False
            if link.dead is None:
                with contextlib.suppress(OutriderError, TimeoutError):  # else killed below
                    link.call("stop", timeout=self._stop_timeout_s)
                    answered = True
            link.reader.join(REAP_S if answered else 0.0)  # it exits right after answering
            if link.reader.is_alive():
                link.process.kill()
                link.reader.join()

    def load(self, settings: LoadSettings,
             on_progress: Callable[[float], None] | None = None) -> LoadedModel:
        """Load in the child; `on_progress` is called on this thread as the child loads."""
        self.start()
        link = self._live()
        link.model_name = settings.model_path.stem
        link.workers = settings.workers
        try:
            info: LoadedModel = link.call("load", settings, on_progress is not None,
                                          on_progress=on_progress)
        except EngineCrashed:
            raise
        except BaseException:
            link.model_name = None  # the engine unloads before it loads
            raise
        link.model_name = info.name
        return info

    def unload(self) -> None:
        link = self._link
        if link is None:
            return
        link.call("unload")
        link.model_name = None

    def submit(self, request: GenerationRequest) -> IsolatedHandle:
        return self._live().open_handle(request)

    def status(self) -> EngineStatus:
        link = self._link
        return _EMPTY_STATUS if link is None else self._snapshot(link, "status")

    def metrics(self) -> EngineMetrics:
        link = self._link
        return _IDLE_METRICS if link is None else self._snapshot(link, "metrics")

    def render_chat(self, messages: Any, *, tools: Any = (), extra: Any = None) -> str:
        return self._live().call("render_chat", messages, tools, extra)

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        return self._live().call("tokenize", text, add_special, parse_special)

    def embed(self, inputs: Sequence[EmbeddingInput]) -> Embeddings:
        return self._live().call("embed", list(inputs))

    def _snapshot(self, link: ChildLink, method: str) -> Any:
        """status() or metrics(): the child's loop answers these itself, at once, whatever
        its engine does; a child that does not is wedged, and /api/status must not hang."""
        try:
            return link.call(method, timeout=SNAPSHOT_TIMEOUT_S)
        except TimeoutError as exc:
            raise EngineError(str(exc)) from None

    def _live(self) -> ChildLink:
        link = self._link
        if link is None:
            raise NoModelLoaded("no model is loaded; load one first")
        if link.dead is not None:
            raise link.dead_error()
        return link


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """While a child is spawned, `__main__` is an empty module, so the child does not import
    the parent's main module again (as "spawn" does): under `outrider serve` that is the
    whole CLI, a second and some 20 MiB per engine, and a script without an
    `if __name__ == "__main__"` guard would run itself again in every child. The price: a
    factory defined in a script's `__main__` cannot be sent (it is refused, said so)."""
    with _SPAWN_LOCK:  # two engines starting at once must not restore each other's stand-in
        real = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = real
