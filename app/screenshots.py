"""`python -m app.screenshots OUTDIR [--model FILE]`: run the real app, visit each page, save PNGs.

Used by `make screenshots` (under Xvfb) so a person can review how the app looks; the images
are not compared in tests. The app runs over a temporary data folder (chats, settings, logs)
with the real engine and the default model (n-gram drafting on, so the speculative panel and
the draft-token highlight have something to show), linked into the temporary library so the
Models page's Library tab and the Settings page's Model tab have it to show. Every tab of the
Models page (Discover, Downloads, Library) and the Settings page (App, Model) is visited, at
each of `SIZES` (files named `chat-1024x700.png` …); the Hub is not reached, so the Repository
tab is left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from PySide6.QtTest import QTest

from app.chat.store import ChatStore
from app.engine.client import EngineClient, EngineState
from app.gui_gc import collect_on_gui_thread
from app.models.models_page import DISCOVER, DOWNLOADS, LIBRARY
from app.qt import QtCore, QtWidgets
from app.services.settings import SettingsController
from app.settings.settings_page import APP, MODEL
from app.theme import LIGHT, apply_theme
from app.window import CHAT, FIRST_RUN, MODELS, SERVER, SETTINGS, MainWindow
from runtime.events import SamplingParams
from runtime.library.default_model import SMOLLM2
from runtime.paths import UserDirs, user_dirs
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.settings.user import ModelPrefs, SettingsStore

PROMPT = "Write a short Python function that reverses a string, and explain it in one sentence."
SIZE = (1400, 880)  # while the tour loads the model and chats
SIZES = ((1024, 700), (1920, 1080))  # every page is taken at each: the smallest and a desktop


class Tour(QtCore.QObject):
    """Steps through the app; each step runs after the previous one's condition is met."""

    def __init__(self, app: QtWidgets.QApplication, window: object, out: Path, model: Path) -> None:
        super().__init__()
        self._size = SIZE

        if not isinstance(window, MainWindow):
            raise TypeError("the tour needs the main window")
        self.app, self.window, self.out, self.model = app, window, out, model
        self.saved: list[Path] = []
        self.failed: str | None = None
        self._deadline = QtCore.QTimer(self, singleShot=True, interval=240_000)
        self._deadline.timeout.connect(lambda: self._stop("timed out"))

    def start(self) -> None:
        w = self.window
        w.resize(*SIZE)
        w.show()
        self._deadline.start()
        w.models_page.setCurrentIndex(DISCOVER)
        w.show_page(0)
        w.client.state_changed.connect(self._on_state)
        w.client.problem.connect(lambda e: self._stop(e.message))
        settings = LoadSettings(model_path=self.model, n_ctx=2048,
                                draft=DraftSettings(kind="ngram"))
        # Remembered first, as Settings → Model would: that tab then shows what is loaded.
        w.settings.update_model(self.model, ModelPrefs(settings))
        w.load_model_file(self.model)
        if w.client.state == EngineState.READY:
            self._on_state(EngineState.READY)

    def _on_state(self, state: object) -> None:
        if state != EngineState.READY or getattr(self, "_sent", False):
            return
        self._sent = True
        c = self.window.controller
        c.new_conversation()
        c.set_system_prompt("You are a helpful assistant.")
        c.set_sampling(SamplingParams(temperature=0.0, max_tokens=200))
        c.reply_finished.connect(lambda _m: QtCore.QTimer.singleShot(2500, self._pages))
        self.window.chat.settings.show_conversation(c.conversation)
        c.send(PROMPT)

    def _pages(self) -> None:
        w = self.window
        settings = w.settings_page
        for self._size in SIZES:
            w.resize(*self._size)
            self._light_pages()
        w.settings.update(dataclasses.replace(w.settings.settings, theme="dark"))

        def model_tab() -> None:
            w.show_page(SETTINGS)
            settings.setCurrentIndex(MODEL)

        for self._size in SIZES:  # through the setting, as the App tab's Theme combo does it
            w.resize(*self._size)
            self._grab("chat-dark", before=lambda: w.show_page(CHAT))
            self._grab("settings-model-dark", before=model_tab)
        self._stop(None)

    def _light_pages(self) -> None:
        w = self.window
        w.chat.drafts_button.setChecked(True)
        self._grab("chat", before=lambda: w.show_page(CHAT))
        w.chat.drafts_button.setChecked(False)
        self._grab("chat-settings", before=lambda: w.chat.settings_button.setChecked(True))
        w.chat.settings_button.setChecked(False)

        def tab(page: int, widget: QtWidgets.QTabWidget, index: int) -> Callable[[], None]:
            def show() -> None:
                w.show_page(page)
                widget.setCurrentIndex(index)
            return show

        models, settings = w.models_page, w.settings_page

        def model_settings() -> None:
            w.show_page(SETTINGS)
            settings.show_model(self.model)

        self._grab("models-discover", before=tab(MODELS, models, DISCOVER),
                   ready=lambda: models.discover.picks.rowCount() > 0)
        self._grab("models-downloads", before=tab(MODELS, models, DOWNLOADS))
        self._grab("models-library", before=tab(MODELS, models, LIBRARY),
                   ready=lambda: bool(w.model_services.models))
        self._grab("settings-app", before=tab(SETTINGS, settings, APP))
        self._grab("settings-model", before=model_settings,
                   ready=lambda: settings.model.plan_view.plan is not None)
        self._grab("server", before=lambda: w.show_page(SERVER))
        self._grab("first-run", before=lambda: w.show_page(FIRST_RUN))

    def _grab(self, name: str, before: Callable[[], None],
              ready: Callable[[], bool] | None = None) -> None:
        before()
        self.window.chat.transcript.flush()
        # Let layouts and the plots settle; QTest's wait spins the loop without a busy loop.

        QTest.qWait(400)
        for _ in range(50):  # background work (a library scan, a memory plan): up to 10 s
            if ready is None or ready():
                break
            QTest.qWait(200)
        width, height = self._size
        path = self.out / f"{name}-{width}x{height}.png"
        self.window.grab().save(str(path))
        self.saved.append(path)
        print(f"saved {path}", flush=True)

    def _stop(self, failure: str | None) -> None:
        self.failed = failure
        self._deadline.stop()
        self.window.close()
        self.app.quit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", type=Path)
    args = parser.parse_args(argv)
    model = args.model or user_dirs().models / SMOLLM2.library_path
    if not model.is_file():
        print(f"no model at {model}: run `python -m runtime.library.default_model` first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    running = QtWidgets.QApplication.instance()
    app = (running if isinstance(running, QtWidgets.QApplication)
           else QtWidgets.QApplication([sys.argv[0]]))
    collect_on_gui_thread()
    apply_theme(app, LIGHT)
    with tempfile.TemporaryDirectory(prefix="outrider-shots-") as tmp:
        root = Path(tmp)
        dirs = UserDirs(root / "data", root / "config", root / "cache", root / "state")
        linked = dirs.models / SMOLLM2.library_path  # the library lists it; nothing is copied
        linked.parent.mkdir(parents=True, exist_ok=True)
        linked.symlink_to(model.resolve())
        store = ChatStore(dirs.chats_db)
        settings = SettingsController.open(SettingsStore(dirs.settings_file))
        window = MainWindow(EngineClient(log_dir=dirs.logs), store, dirs, LIGHT,
                            default_model=linked, settings=settings)
        tour = Tour(app, window, args.out, linked)
        QtCore.QTimer.singleShot(0, tour.start)
        app.exec()
        store.close()
    if tour.failed:
        print(f"screenshots failed: {tour.failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
