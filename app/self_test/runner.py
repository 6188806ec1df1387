"""The self-test's machinery: the checks run one after the other on the GUI thread, each ends
exactly once (ok, failed, or timed out), and one line is printed for each.

A check is a function `check(test, result)`: it starts what it needs (a load, a chat message,
an HTTP request, a child process) and returns at once; the callbacks it connects end it with
`result.ok(detail)` or `result.fail(reason)`. Every callback goes through `result.guard`, so
an exception in one fails that check (instead of being lost in a Qt slot), and a callback that
comes after its check has ended (a late reply, a timeout already reported) does nothing.
Blocking work (HTTP to the engine, the quantizer, a worker's handshake) runs on a daemon
thread (`in_thread`), and its answer comes back to the GUI thread through a queued signal.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.chat.conversation import Message
from app.engine.client import EngineClient, EngineState
from app.engine.process import EngineExit
from app.engine.wire import ReplyError, ServedModel
from app.qt import QtCore, QtWidgets, Signal
from app.self_test.fixtures import MissingFixture
from app.self_test.home import KEEP_MARK
from app.window import MainWindow
from runtime.events import SamplingParams
from runtime.paths import UserDirs
from runtime.settings.load import LoadSettings

PREFIX = "self-test:"
HTTP_TIMEOUT_S = 120.0


class CheckFailed(Exception):
    """Raised inside a check's callback: the check fails with this message."""


def say(text: str) -> None:
    print(f"{PREFIX} {text}", flush=True)


class Result:
    """How one check ends: `ok(detail)` or `fail(reason)`, the first call wins."""

    def __init__(self, test: SelfTest, name: str) -> None:
        self._test = test
        self.name = name
        self.finished = False
        self.uses_engine = False  # an unexpected engine exit fails it
        self.notes: list[str] = []  # said after an ok: what it took besides the check
        self.started = time.monotonic()

    def ok(self, detail: str) -> None:
        self._test._end(self, True, detail)

    def fail(self, reason: str) -> None:
        self._test._end(self, False, reason)

    def guard(self, callback: Callable[..., Any]) -> Callable[..., None]:
        """`callback`, doing nothing once this check has ended, and failing it on an error."""

        def guarded(*args: Any) -> None:
            if self.finished:
                return
            try:
                callback(*args)
            except (CheckFailed, MissingFixture) as exc:
                self.fail(str(exc))
            except Exception as exc:  # a bug of the check, or of what it checks: said, not lost
                self.fail(f"{type(exc).__name__}: {exc}")

        return guarded

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


Check = Callable[["SelfTest", Result], None]


@dataclass(frozen=True)
class CheckSpec:
    name: str
    run: Check
    timeout_s: float


class _Bridge(QtCore.QObject):
    """Runs callables on the GUI thread: `call.emit(fn)` from any thread queues `fn`."""

    call = Signal(object)

    def __init__(self, parent: QtCore.QObject) -> None:
        super().__init__(parent)
        self.call.connect(self._run)

    @staticmethod
    def _run(fn: Callable[[], None]) -> None:
        fn()


@dataclass
class _Waiter:
    result: Result
    path: Path
    then: Callable[[], None]


class SelfTest(QtCore.QObject):
    """Runs `checks` against `window`; `exit_code` is 0 once every check passed.

    Attributes for the checks: window, client, model (the chat model file), fixtures (the
    fixtures folder or None), home (the temporary user folders), library (its models
    folder), scratch (a folder for the files the checks write)."""

    def __init__(self, app: QtWidgets.QApplication, window: MainWindow, model: Path,
                 fixtures: Path | None, home: UserDirs, checks: Sequence[CheckSpec]) -> None:
        super().__init__()
        self.app = app
        self.window = window
        self.client: EngineClient = window.client
        self.model = model.expanduser().resolve()
        self.fixtures = fixtures
        self.home = home
        self.library = home.models
        self.scratch = home.cache / "self-test"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.opened = False
        self.exit_code = 1
        self._checks = list(checks)
        self._index = -1
        self._current: Result | None = None
        self._outcomes: list[tuple[str, bool]] = []
        self._began = time.monotonic()
        self._waiter: _Waiter | None = None
        self._bridge = _Bridge(self)
        self._timer = QtCore.QTimer(self, singleShot=True)
        self._timer.timeout.connect(self._on_timeout)

    # -- running -----------------------------------------------------------------------

    def start(self) -> None:
        client = self.client
        client.state_changed.connect(self._on_state)
        client.problem.connect(self._on_problem)
        client.engine_exited.connect(self._on_engine_exited)
        self.window.show()
        self.app.processEvents()
        self.opened = self.window.isVisible()
        say(f"model {self.model}; fixtures {self.fixtures or 'none (--fixtures not given)'}; "
            f"user folders in {self.home.data.parent}")
        self._next()

    def _next(self) -> None:
        self._index += 1
        if self._index >= len(self._checks):
            self._finish()
            return
        spec = self._checks[self._index]
        result = Result(self, spec.name)
        self._current = result
        self._timer.setInterval(int(spec.timeout_s * 1000))
        self._timer.start()
        result.guard(spec.run)(self, result)

    def _end(self, result: Result, ok: bool, text: str) -> None:
        if result.finished or result is not self._current:
            return
        result.finished = True
        self._timer.stop()
        if self._waiter is not None and self._waiter.result is result:
            self._waiter = None
        self._outcomes.append((result.name, ok))
        if ok and result.notes:
            text = f"{text}; {'; '.join(result.notes)}"
        line = " ".join(text.split())  # one line, whatever the reason held
        if ok:
            say(f"{result.name}: ok ({line}; {result.elapsed:.1f} s)")
        else:
            say(f"{result.name}: FAILED: {line} ({result.elapsed:.1f} s)")
        QtCore.QTimer.singleShot(0, self._next)

    def _on_timeout(self) -> None:
        result = self._current
        if result is not None:
            spec = self._checks[self._index]
            result.fail(f"no answer within {spec.timeout_s:.0f} s")

    def _finish(self) -> None:
        self._current = None
        failed = [name for name, ok in self._outcomes if not ok]
        total = len(self._outcomes)
        took = time.monotonic() - self._began
        if failed:
            root = self.home.data.parent
            (root / KEEP_MARK).touch()  # self_test_home leaves it: the logs named above
            say(f"kept {root} (the engine's logs are in {self.home.logs})")
            say(f"FAILED: {len(failed)} of {total} checks failed ({', '.join(failed)}) "
                f"in {took:.1f} s")
            self.exit_code = 1
        else:
            say(f"ok: all {total} checks passed in {took:.1f} s")
            self.exit_code = 0
        QtCore.QTimer.singleShot(0, self.app.quit)

    # -- the engine ----------------------------------------------------------------------

    def ensure_ready(self, result: Result, path: Path, then: Callable[[], None],
                     load: Callable[[], None] | None = None) -> None:
        """Call `then` once the chat's engine serves `path` (loading it, by `load` or with
        the settings the self-test uses, if it does not already)."""
        result.uses_engine = True
        client = self.client

        def reload(why: str) -> None:
            result.notes.append(f"loaded again: {why}")
            self._waiter = _Waiter(result, path, result.guard(then))
            self._load(path, load)

        def resident(status: dict[str, Any]) -> None:
            model = status.get("model") or {}
            if model.get("path") and _same(model["path"], path):
                then()
            else:  # the engine process that held it died: the server has no model
                reload(f"the server had lost {path.name}")

        if client.state == EngineState.READY and _serves(client.model, path):
            # The app says READY; ask the server, whose engine process may have died since.
            self.http(result, "GET", "/api/status", None, resident,
                      on_error=lambda exc: reload(f"the server answered {exc}"))
            return
        self._waiter = _Waiter(result, path, result.guard(then))
        wanted = client.wanted
        if wanted is not None and _same(wanted.model_path, path) and \
                client.state in (EngineState.STARTING, EngineState.LOADING):
            return  # on its way
        self._load(path, load)

    def _load(self, path: Path, load: Callable[[], None] | None) -> None:
        if load is not None:
            load()
        else:
            self.window.load_model(LoadSettings(model_path=path, n_ctx=2048))

    def _on_state(self, state: EngineState) -> None:
        waiter = self._waiter
        if waiter is None or state != EngineState.READY or not _serves(self.client.model,
                                                                       waiter.path):
            return
        self._waiter = None
        waiter.then()

    def _on_problem(self, error: ReplyError) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.result.fail(f"the engine could not load {waiter.path.name}: {error.message}"
                               f"{self.engine_log()}")

    def _on_engine_exited(self, info: EngineExit) -> None:
        result = self._current
        if info.expected or result is None or not result.uses_engine:
            return
        last = info.tail.strip().splitlines()[-1:] if info.tail.strip() else []
        result.fail(f"{info.describe()} {last[0] if last else ''}{self.engine_log()}")

    def engine_log(self) -> str:
        path = self.client.process.log_path
        return f" (engine log: {path})" if path is not None else ""

    # -- the chat ------------------------------------------------------------------------

    def new_chat(self, max_tokens: int, response_schema: str = "") -> int:
        """A new conversation, greedy and short; its id."""
        controller = self.window.controller
        conv = controller.new_conversation(response_schema=response_schema)
        controller.set_sampling(SamplingParams(temperature=0.0, max_tokens=max_tokens))
        return conv.id

    def expect_reply(self, result: Result, conversation_id: int,
                     then: Callable[[Message], None]) -> None:
        """Call `then(reply)` when the chat's next reply in that conversation ends."""

        def finished(message: Message) -> None:
            if message.conversation_id == conversation_id:
                then(message)

        self.window.controller.reply_finished.connect(result.guard(finished))

    # -- off the GUI thread ----------------------------------------------------------------

    def in_thread(self, result: Result, work: Callable[[], Any], then: Callable[[Any], None],
                  on_error: Callable[[BaseException], None] | None = None) -> None:
        """Run `work()` on a daemon thread; `then(its value)` on the GUI thread, or the check
        fails with what it raised (or `on_error(exception)`)."""
        done, failed = result.guard(then), result.guard(on_error or _reraise)

        def target() -> None:
            try:
                value = work()
            except BaseException as exc:  # reported as the check's failure
                self._bridge.call.emit(lambda error=exc: failed(error))
            else:
                self._bridge.call.emit(lambda: done(value))

        threading.Thread(target=target, name=f"self-test {result.name}", daemon=True).start()

    def http(self, result: Result, method: str, path: str, body: dict[str, Any] | None,
             then: Callable[[dict[str, Any]], None],
             on_error: Callable[[BaseException], None] | None = None) -> None:
        """`method path` on the engine's local server (the address the app talks to), JSON in
        and out, off the GUI thread; an error fails the check with the server's message (or
        goes to `on_error`)."""
        address = self.client.address
        if address is None:
            raise CheckFailed("the engine is not running")
        request = urllib.request.Request(address.url + path, method=method,
                                         data=None if body is None else json.dumps(body).encode())
        request.add_header("Content-Type", "application/json")
        if address.api_key:
            request.add_header("Authorization", f"Bearer {address.api_key}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback

        def work() -> dict[str, Any]:
            try:
                with opener.open(request, timeout=HTTP_TIMEOUT_S) as response:
                    return dict(json.loads(response.read()))
            except urllib.error.HTTPError as exc:
                raise CheckFailed(f"{method} {path}: HTTP {exc.code}: "
                                  f"{_error_message(exc.read())}") from None

        self.in_thread(result, work, then, on_error)


def _reraise(exc: BaseException) -> None:
    raise exc


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")[:300]


def _same(a: Path | str, b: Path | str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _serves(model: ServedModel | None, path: Path) -> bool:
    return model is not None and bool(model.path) and _same(model.path, path)
