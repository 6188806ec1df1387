"""GUI fixtures: main windows over a real engine process (the tiny model) or the fake server,
and a guard that fails a test which leaks windows, threads or engine processes."""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from pytestqt.exceptions import TimeoutError as QtTimeout

from app.chat.store import ChatStore
from app.engine.client import EngineClient, EngineState
from app.engine.process import EngineCommand
from app.gui_gc import collect_on_gui_thread
from app.qt import QtCore, QtWidgets
from app.services.settings import SettingsController
from app.theme import LIGHT, Palette
from app.window import MainWindow
from runtime.paths import user_dirs
from runtime.settings.load import LoadSettings
from runtime.settings.user import SettingsStore

ROOT = Path(__file__).resolve().parents[2]
ENGINE_TIMEOUT_MS = 60_000


def fake_command(token_delay: float = 0.001, metrics_interval: float = 0.1,
                 gate_file: Path | None = None) -> EngineCommand:
    gate = ("--gate-file", str(gate_file)) if gate_file else ()
    return EngineCommand(sys.executable, ("-m", "tests.gui.fake_server",
                                          "--token-delay", str(token_delay),
                                          "--metrics-interval", str(metrics_interval), *gate),
                         {"PYTHONPATH": str(ROOT)})


def _python_threads() -> set[threading.Thread]:
    # Qt threads that ran Python code leave _DummyThread entries behind for good; ignore them.
    return {t for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}


@pytest.fixture(scope="session", autouse=True)
def gc_on_gui_thread(qapp: QtWidgets.QApplication) -> None:
    """As in the app: a worker thread's allocation never frees a Qt object (app/gui_gc.py)."""
    collect_on_gui_thread()


@pytest.fixture(autouse=True)
def no_leaks(qapp: QtWidgets.QApplication) -> Iterator[None]:
    """After each test: no visible top-level windows, no new Python threads, no child
    processes (engine servers) left running."""
    threads = _python_threads()
    yield
    visible = [w for w in QtWidgets.QApplication.topLevelWidgets() if w.isVisible()]
    for widget in visible:
        widget.close()
    assert not visible, f"windows left open: {visible}"
    leaked = _python_threads() - threads
    assert not leaked, f"threads left running: {leaked}"
    children = psutil.Process().children(recursive=True)
    assert not children, f"child processes left running: {children}"


WindowFactory = Callable[..., MainWindow]


@pytest.fixture
def make_window(qtbot: object, isolated_user_dirs: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[WindowFactory]:
    """`make_window(command=None)` opens a main window over the isolated user folders, with
    the settings read from their `settings.toml` (as the app does at start-up). command None
    runs the real engine (`python -m runtime.cli.main serve`). Every window (and its store,
    engine, services and settings) is closed after the test."""
    opened: list[tuple[MainWindow, ChatStore]] = []
    if not os.environ.get("HF_ENDPOINT"):
        # Never the real Hub: the Settings page lists a library model's other quants there,
        # and a refused call ends at once. Nothing listens on port 9.
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")

    def factory(command: EngineCommand | None = None, show: bool = True,
                palette: Palette | None = LIGHT) -> MainWindow:
        """palette None: the theme the settings say (applied to the app, as at start-up)."""
        dirs = user_dirs()
        store = ChatStore(dirs.chats_db, checkpoint_interval=0.2)
        client = EngineClient(command, dirs.logs)
        settings = SettingsController.open(SettingsStore(dirs.settings_file))
        window = MainWindow(client, store, dirs, palette, settings=settings)
        opened.append((window, store))
        if show:
            window.show()
            window.activateWindow()  # window shortcuts (Ctrl+N, Esc …) need the active window
            qtbot.waitUntil(window.isActiveWindow)  # type: ignore[attr-defined]
        return window

    yield factory
    for window, store in opened:
        window.close()
        window.deleteLater()
        store.close()
        assert not window.runner._thread.is_alive()
    # Destroy the closed windows now, inside this test, rather than whenever the next test
    # happens to spin the event loop: a late deferred delete must not land in another test.
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)
    gc.collect()


def load(qtbot: object, window: MainWindow, model: Path, n_ctx: int = 2048) -> None:
    """Load `model` and wait until the engine is ready with it."""
    window.load_model(LoadSettings(model_path=model, n_ctx=n_ctx))
    try:
        qtbot.waitUntil(lambda: window.client.state in (EngineState.READY,  # type: ignore[attr-defined]
                                                        EngineState.CRASHED),
                        timeout=ENGINE_TIMEOUT_MS)
        if window.client.state != EngineState.READY:
            raise QtTimeout("the engine stopped")
    except QtTimeout as exc:  # pytest-qt's: say what the engine did
        log = window.client.process.log_path
        text = log.read_text()[-3000:] if log and log.is_file() else "(no log)"
        raise AssertionError(f"engine not ready: {window.client.state}\n{text}") from exc


@pytest.fixture
def fake_window(make_window: WindowFactory, qtbot: object, tmp_path: Path) -> MainWindow:
    """A window over the fake server with a (fake) model loaded."""
    window = make_window(fake_command())
    model = tmp_path / "fake-model.gguf"
    model.write_bytes(b"GGUF")
    load(qtbot, window, model)
    return window


@pytest.fixture
def real_window(make_window: WindowFactory, qtbot: object, tiny_target: Path) -> MainWindow:
    """A window over the real engine process with the tiny model loaded."""
    window = make_window(None)
    load(qtbot, window, tiny_target)
    return window
