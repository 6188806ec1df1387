"""The main window: left navigation (Chat · Models · Settings · Server), the pages, the dock
of live panels, and a status bar with the model, memory and engine state.

The window is handed its collaborators (engine client, chat store, user folders, the app
settings) and builds its own parts from them; nothing is global. Window geometry, dock
layout, page and splitter sizes are kept in `window.ini` in the config folder (QSettings,
INI format); the app's own settings (theme, server, per-model load settings) in
`settings.toml` through the `SettingsController`.

    settings = SettingsController.open(SettingsStore(dirs.settings_file))
    window = MainWindow(client, store, dirs, settings=settings)
    window.show()
    ...
    window.close()          # stops the engine and the workers, writes unsaved settings
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.chat.controller import ChatController
from app.chat.markdown import warm_up as warm_up_markdown
from app.chat.model_picker import ModelPicker, library_models
from app.chat.page import ChatPage
from app.chat.store import ChatStore
from app.engine.client import EngineClient, EngineState
from app.engine.process import EngineExit, engine_listen
from app.engine.wire import MetricsSnapshot, ServedModel
from app.first_run.page import FirstRunPage
from app.models.models_page import ModelsPage
from app.qt import Qt, QtCore, QtGui, QtWidgets, Signal
from app.server.page import ServerPage
from app.services.background import BackgroundRunner
from app.services.memory_terms import ENGINE_RAM_TIP, PLANNED_TIP, engine_ram_text
from app.services.models import ModelServices
from app.services.projectors import load_settings_for
from app.services.settings import SettingsController
from app.settings.settings_page import APP as APP_SETTINGS
from app.settings.settings_page import SettingsPage
from app.theme import Palette, apply_theme, palette_for, system_palette
from app.widgets import ElidedLabel, WheelGuard, page_column
from runtime.events import SamplingParams
from runtime.library.library import LibraryModel
from runtime.paths import UserDirs
from runtime.settings.load import LoadSettings
from runtime.settings.user import AppSettings, SettingsStore
from runtime.units import fmt_bytes

if TYPE_CHECKING:  # imported when first built: pyqtgraph takes ~0.5 s (see ensure_panels)
    from app.panels.dock import LivePanels

PAGES = ("Chat", "Models", "Settings", "Server")
CHAT, MODELS, SETTINGS, SERVER, FIRST_RUN = range(5)
# Narrower than this, the Live dock folds away to its status-bar toggle (and comes back when
# the window widens again): beside a 1024 px window's pages it would leave the Downloads
# table's file names "s…". The user can still open it there; it then shrinks to 240 px.
PANELS_MIN_WINDOW_WIDTH = 1200
_STATE_COLORS = {EngineState.READY: "ok", EngineState.CRASHED: "error_text",
                 EngineState.LOADING: "warn", EngineState.STARTING: "warn"}


class MainWindow(QtWidgets.QMainWindow):
    """Signals:
        first_painted(): the window drew itself for the first time (startup benchmark).

    Attributes:
        chat: the Chat page; controller: its ChatController; picker: the model picker.
        models_page: the Models page (Discover, Repository, Downloads, Library).
        settings_page: the Settings page (App, Model). settings: the SettingsController.
        model_services: the Hub, downloads and library behind those two pages.
        panels: the live-panels dock (None until built, just after the first paint).
    """

    first_painted = Signal()

    def __init__(self, client: EngineClient, store: ChatStore, dirs: UserDirs,
                 palette: Palette | None = None, default_model: Path | None = None,
                 parent: QtWidgets.QWidget | None = None, *,
                 settings: SettingsController | None = None,
                 model_services: ModelServices | None = None) -> None:
        """`settings`: the app settings (default: read from `dirs`); `model_services`:
        started services for the Models and Settings pages (default: built and started
        here). The window shuts both down when it closes. `palette` overrides the settings'
        theme until it changes."""
        super().__init__(parent)
        self.setWindowTitle("Outrider")
        self.resize(1320, 840)
        self.client = client
        self.dirs = dirs
        self.settings = settings or SettingsController.open(SettingsStore(dirs.settings_file))
        self._theme = self.settings.settings.theme
        self._palette = palette or palette_for(self._theme, _app())
        if palette is None:  # else the caller has applied it (before building anything)
            apply_theme(_app(), self._palette)
        # Before the pages are built and polished: the guard sets their fields' focus policy.
        _app().installEventFilter(WheelGuard(self))
        self._default_model = default_model
        self._painted = False
        self._closed = False
        self._panels_folded = False  # hidden by a narrow window, not by the user
        self._narrow: bool | None = None  # the window's width class when last looked at
        self.panels: LivePanels | None = None
        self._last_metrics: MetricsSnapshot | None = None
        self._window_state = QtCore.QSettings(str(dirs.config / "window.ini"),
                                              QtCore.QSettings.Format.IniFormat)
        if model_services is None:
            model_services = ModelServices(self.settings, dirs, parent=self)
            model_services.start()  # resumes the download queue of the last run
        self.model_services = model_services
        self.runner = BackgroundRunner(self)
        self.controller = ChatController(store, client, self,
                                         sampling_defaults=self._sampling_defaults)
        self.picker = ModelPicker(client, self.runner, self._models_dir(),
                                  settings_for=self._load_settings_for)
        self.chat = ChatPage(self.controller, self.picker, self._palette, runner=self.runner,
                             settings=self.settings)
        self.models_page = ModelsPage(self.model_services)
        self.settings_page = SettingsPage(self.settings, self.model_services,
                                          default_models_dir=dirs.models)
        self.server = ServerPage(client, dirs.logs)
        self.first_run = FirstRunPage(self.runner, default_model or dirs.models / "none.gguf")
        self._apply_server_settings(self.settings.settings)
        self._build_layout()
        self._build_status_bar()
        self._build_actions()
        self._connect()
        self._restore_state()
        if self.settings.startup_problem:
            self.statusBar().showMessage(self.settings.startup_problem)

    # -- construction ------------------------------------------------------------------

    def _build_layout(self) -> None:
        self.nav = QtWidgets.QListWidget()
        self.nav.setObjectName("sidebar")
        self.nav.setFixedWidth(150)
        self.nav.addItems(PAGES)
        self.nav.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        brand = QtWidgets.QLabel("Outrider")
        brand.setObjectName("brand")
        brand.setFixedWidth(150)
        side = QtWidgets.QVBoxLayout()
        side.setContentsMargins(0, 0, 0, 0)
        side.setSpacing(0)
        side.addWidget(brand)
        side.addWidget(self.nav, 1)
        self.pages = QtWidgets.QStackedWidget()
        self.pages.addWidget(self.chat)
        self.pages.addWidget(_titled(
            "Models", "Find GGUF models on the Hugging Face Hub, download them, and keep your "
            "library.", self.models_page))
        self.pages.addWidget(_titled(
            "Settings", "The app's settings, and how each model file loads (remembered per "
            "file).", self.settings_page))
        self.pages.addWidget(self.server)
        self.pages.addWidget(self.first_run)
        central = QtWidgets.QWidget()
        row = QtWidgets.QHBoxLayout(central)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addLayout(side)
        row.addWidget(self.pages, 1)
        self.setCentralWidget(central)

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        bar.setSizeGripEnabled(False)
        # Elided, not plain labels: a status bar is as wide as its labels' whole text, and
        # "SmolLM2-1.7B-Instruct · Q4_K_M" beside the engine's RAM would widen a 1024 px window.
        self.model_label = ElidedLabel("No model")
        self.memory_label = ElidedLabel()
        self.state_button = QtWidgets.QToolButton()
        self.state_button.setToolTip("Engine state — click for the Server page")
        self.state_button.clicked.connect(self._show_server)
        self.panels_button = QtWidgets.QToolButton()
        self.panels_button.setText("Live panels")
        self.panels_button.setCheckable(True)
        self.panels_button.setChecked(True)
        self.panels_button.toggled.connect(self.set_panels_visible)
        bar.addWidget(self.model_label, 1)
        bar.addWidget(self.memory_label, 1)
        bar.addPermanentWidget(self.panels_button)
        bar.addPermanentWidget(self.state_button)
        self._on_state(self.client.state)

    def _build_actions(self) -> None:
        def shortcut(keys: str | QtGui.QKeySequence.StandardKey, slot: object) -> None:
            sc = QtGui.QShortcut(QtGui.QKeySequence(keys), self)
            sc.setContext(Qt.ShortcutContext.WindowShortcut)
            sc.activated.connect(slot)

        shortcut("Ctrl+N", self._new_chat)
        shortcut("Ctrl+Return", self._send_shortcut)
        shortcut("Ctrl+Enter", self._send_shortcut)
        shortcut("Esc", self.chat.stop_or_cancel)
        shortcut("Ctrl+F", self._focus_search)
        shortcut("Ctrl+Q", self.close)

    def _connect(self) -> None:
        # Bound methods, not lambdas: Qt drops a bound method's connection with its receiver,
        # while a lambda's closure can be cleared by the GC while a queued call is on its way.
        self.nav.currentRowChanged.connect(self.pages.setCurrentIndex)
        self.pages.currentChanged.connect(self._on_page_changed)
        self.chat.open_log_requested.connect(self.show_engine_log)
        self.chat.message.connect(self._show_message)
        self.first_run.use_model.connect(self._on_first_run_model)
        self.first_run.browse_models.connect(self._show_models)
        self.first_run.open_repo.connect(self._open_repo)
        self.first_run.skip.connect(self._show_chat)
        self.models_page.load_requested.connect(self._on_library_load)
        self.models_page.settings_requested.connect(self.show_model_settings)
        self.models_page.app_settings_requested.connect(self.show_app_settings)
        self.models_page.message.connect(self._show_message)
        self.settings_page.model.load_requested.connect(self._on_settings_load)
        # A quant switch: the same settings, the other file, no questions.
        self.settings_page.model.reload_requested.connect(self.load_model)
        self.model_services.library_changed.connect(self._on_library)
        self.settings.changed.connect(self._on_settings_changed)
        self.settings.save_failed.connect(self._show_message)
        self.client.state_changed.connect(self._on_state)
        self.client.model_changed.connect(self._on_model)
        self.client.metrics_received.connect(self._on_metrics)
        self.client.engine_exited.connect(self._on_engine_exited)
        _app().styleHints().colorSchemeChanged.connect(self._on_color_scheme)

    # -- pages -------------------------------------------------------------------------

    def show_page(self, index: int) -> None:
        self.pages.setCurrentIndex(index)
        if index < len(PAGES):
            self.nav.blockSignals(True)
            self.nav.setCurrentRow(index)
            self.nav.blockSignals(False)
        else:
            self.nav.clearSelection()

    def show_engine_log(self) -> None:
        self.show_page(SERVER)
        self.server.show_log(self.client.process.log_path)

    def show_model_settings(self, path: Path) -> None:
        """The Settings page's Model tab on `path` (the library's Settings…)."""
        self.settings_page.show_model(Path(path))
        self.show_page(SETTINGS)

    def show_app_settings(self) -> None:
        """Settings → App (the Hub mirror), from a Hub call that found no connection."""
        self.settings_page.setCurrentIndex(APP_SETTINGS)
        self.show_page(SETTINGS)

    def _show_chat(self) -> None:
        self.show_page(CHAT)

    def _show_models(self) -> None:
        self.show_page(MODELS)

    def _open_repo(self, repo_id: str) -> None:
        self.models_page.open_repo(repo_id)
        self.show_page(MODELS)

    def _show_server(self) -> None:
        self.show_page(SERVER)

    def _show_message(self, text: str) -> None:
        self.statusBar().showMessage(text, 5000)

    def _on_page_changed(self, index: int) -> None:
        # Settings → Model opens on the model in use rather than on an empty form.
        wanted = self.client.wanted
        if index == SETTINGS and self.settings_page.model.path is None and wanted is not None:
            self.settings_page.model.show_model(wanted.model_path)

    def offer_first_run(self) -> bool:
        """Show the first-run page when the library is empty; True if shown."""
        if library_models(self._models_dir()) or self.client.wanted is not None:
            return False
        self.show_page(FIRST_RUN)
        return True

    # -- loading -----------------------------------------------------------------------

    def load_model(self, settings: LoadSettings) -> None:
        """Load with exactly these settings: no plan dialog, no questions (start-up, a quant
        switch of the loaded model)."""
        self.picker.add_model(settings.model_path)
        self.picker.load(settings)

    def load_model_file(self, path: Path) -> None:
        """Load `path` with its remembered settings (Settings → Model), no questions."""
        self.load_model(self._load_settings_for(path))

    def _on_library_load(self, settings: LoadSettings) -> None:
        """Library → Load: plan first (asks when it won't fit), then chat with it."""
        self.show_page(CHAT)
        self.picker.plan_and_load(settings)

    def _on_settings_load(self, settings: LoadSettings) -> None:
        """Settings → Model → Load: stay on the page, to watch the plan and the panels."""
        self.statusBar().showMessage(f"Loading {settings.model_path.name} with these "
                                     "settings…", 5000)
        self.picker.plan_and_load(settings)

    def _on_first_run_model(self, path: Path) -> None:
        self.load_model_file(path)
        self.show_page(CHAT)

    def _load_settings_for(self, path: Path) -> LoadSettings:
        """The picker's Load: what the Settings page remembers for this file, with a vision
        model's projector beside it (app.services.projectors)."""
        return load_settings_for(self.settings.settings, path)

    def _sampling_defaults(self, model_path: str) -> SamplingParams | None:
        """A new chat's sampling: the model's remembered defaults, if it has any."""
        prefs = self.settings.settings.models.get(str(Path(model_path)))
        return prefs.sampling if prefs is not None else None

    def _models_dir(self) -> Path:
        return self.settings.settings.models_path(self.dirs.models)

    def _on_library(self, models: list[LibraryModel]) -> None:
        self.picker.set_library([m.path for m in models if m.error is None])

    def _new_chat(self) -> None:
        self.show_page(CHAT)
        self.chat.new_chat()

    def _send_shortcut(self) -> None:
        if self.pages.currentIndex() == CHAT:
            self.chat.composer.submit()

    def _focus_search(self) -> None:
        self.show_page(CHAT)
        self.chat.focus_search()

    # -- live panels -------------------------------------------------------------------

    def ensure_panels(self) -> None:
        """Build the dock (imports pyqtgraph) — after the first paint, or on demand."""
        if self.panels is not None or self._closed:
            return
        # start-up time: pyqtgraph (~0.3 s) loads after the window's first paint
        from app.panels.dock import LivePanels

        panels = LivePanels(self._palette, self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, panels)
        self.resizeDocks([panels], [380], Qt.Orientation.Horizontal)
        self.controller.step_received.connect(panels.on_step)
        self.controller.first_token.connect(panels.speed.update_ttft)
        self.controller.busy_changed.connect(panels.on_busy)
        self.controller.reply_finished.connect(panels.on_reply_finished)
        self.client.metrics_received.connect(panels.on_metrics)
        self.client.model_changed.connect(panels.on_model)
        panels.on_model(self.client.model)
        panels.visibilityChanged.connect(self._on_panels_visibility)
        self.panels = panels
        state = self._window_state.value("state")
        if isinstance(state, QtCore.QByteArray):
            self.restoreState(state)
        panels.setVisible(self.panels_button.isChecked())
        self._fold_panels()
        if self._last_metrics is not None:
            panels.on_metrics(self._last_metrics)

    def set_panels_visible(self, visible: bool) -> None:
        self._panels_folded = False  # the user's choice from now on
        if self.panels is not None:
            self.panels.setVisible(visible)
        elif visible:
            self.ensure_panels()

    def _fold_panels(self) -> None:
        """Fold the dock away when the window becomes narrow, unfold it when it widens again
        (only if it was the narrow window that folded it). On the change only: a user who
        opens the dock in a narrow window keeps it open."""
        panels = self.panels
        if panels is None or panels.isFloating() or self._closed:
            return
        narrow = self.width() < PANELS_MIN_WINDOW_WIDTH
        if narrow == self._narrow:
            return
        self._narrow = narrow
        if narrow and panels.isVisible():
            self._panels_folded = True
            panels.hide()
        elif not narrow and self._panels_folded:
            self._panels_folded = False
            panels.show()
            # Back at its opening width: a narrow window squeezed it to its minimum (200 px,
            # values elided), and Qt keeps a dock's width when the window grows.
            self.resizeDocks([panels], [380], Qt.Orientation.Horizontal)

    def _on_panels_visibility(self, visible: bool) -> None:
        if not self._closed and self.isVisible():
            self.panels_button.blockSignals(True)
            self.panels_button.setChecked(visible)
            self.panels_button.blockSignals(False)

    # -- engine events -----------------------------------------------------------------

    def _on_state(self, state: EngineState) -> None:
        color = getattr(self._palette, _STATE_COLORS.get(state, "muted"))
        self.state_button.setText(f"● Engine: {state.value}")
        self.state_button.setStyleSheet(f"color: {color};")

    def _on_model(self, model: ServedModel | None) -> None:
        loaded = Path(model.path) if model is not None and model.path else None
        self.settings_page.model.set_loaded_model(loaded)
        if model is None:
            self.model_label.setText("No model")
            return
        quant = f" · {model.quant}" if model.quant else ""
        self.model_label.setText(f"{model.name}{quant}")

    def _on_metrics(self, snapshot: MetricsSnapshot) -> None:
        self._last_metrics = snapshot
        planned = sum(d.planned_bytes for d in snapshot.devices)
        text = engine_ram_text(snapshot.engine_rss_bytes)  # the Memory panel's figure
        if planned:
            text += f" · planned {fmt_bytes(planned)}"
        self.memory_label.setText(text)
        self.memory_label.setToolTip(ENGINE_RAM_TIP + ("\n" + PLANNED_TIP if planned else ""))

    def _on_engine_exited(self, info: EngineExit) -> None:
        if not info.expected:
            self.statusBar().showMessage(f"{info.describe()} Send a message to restart it; "
                                         "its log is on the Server page.", 15000)

    # -- settings ----------------------------------------------------------------------

    def _on_settings_changed(self, settings: AppSettings) -> None:
        if settings.theme != self._theme:
            self._theme = settings.theme
            self.set_palette(palette_for(settings.theme, _app()))
        self._apply_server_settings(settings)

    def _apply_server_settings(self, settings: AppSettings) -> None:
        """The engine's next start listens as the settings say (the Server page tells the
        user that a restart applies a change)."""
        self.client.process.listen = engine_listen(settings.server, settings.server_api_key)
        self.client.process.saved_kv_gib = settings.saved_kv_gib
        self.server.show_settings(settings)

    def _on_color_scheme(self, _scheme: Qt.ColorScheme) -> None:
        if self._theme == "system":
            self.set_palette(system_palette(_app()))

    def set_palette(self, palette: Palette) -> None:
        """Switch the whole window to another theme (the setting or the OS scheme changed)."""
        self._palette = palette
        apply_theme(_app(), palette)
        self.chat.set_palette(palette)
        if self.panels is not None:
            self.panels.set_palette(palette)
        self._on_state(self.client.state)

    # -- window state ------------------------------------------------------------------

    def _restore_state(self) -> None:
        geometry = self._window_state.value("geometry")
        if isinstance(geometry, QtCore.QByteArray):
            self.restoreGeometry(geometry)
        sizes = self._window_state.value("splitter")
        if isinstance(sizes, QtCore.QByteArray):
            self.chat.splitter.restoreState(sizes)
        visible = self._window_state.value("panels", "true")
        self.panels_button.blockSignals(True)
        self.panels_button.setChecked(str(visible).lower() == "true")
        self.panels_button.blockSignals(False)
        try:
            page = int(str(self._window_state.value("page", CHAT)))  # INI values are text
        except (TypeError, ValueError):
            page = CHAT
        self.show_page(page if 0 <= page < len(PAGES) else CHAT)

    def _save_state(self) -> None:
        self._window_state.setValue("geometry", self.saveGeometry())
        self._window_state.setValue("state", self.saveState())
        self._window_state.setValue("splitter", self.chat.splitter.saveState())
        shown = self.panels_button.isChecked() or self._panels_folded  # the user's choice
        self._window_state.setValue("panels", "true" if shown else "false")
        page = self.pages.currentIndex()
        self._window_state.setValue("page", page if page < len(PAGES) else CHAT)
        self._window_state.sync()

    # -- Qt events ---------------------------------------------------------------------

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:
        super().paintEvent(event)
        if not self._painted:
            self._painted = True
            self.first_painted.emit()
            QtCore.QTimer.singleShot(0, self, self.ensure_panels)
            self.runner.submit(warm_up_markdown)

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fold_panels()

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:
        if not self._closed:
            self._save_state()
            self._closed = True
            self.settings_page.model.save_now()  # an edit still waiting for its save timer
            self.controller.stop()
            self.client.stop()
            self.server.worker_card.shutdown()  # no worker left lending this machine
            self.runner.shutdown()
            self.model_services.shutdown()  # running downloads resume at the next start
            self.settings.shutdown()  # writes any change not saved yet
        super().closeEvent(event)


def _titled(title: str, intro: str, body: QtWidgets.QWidget) -> QtWidgets.QWidget:
    """`body` under a page title and an intro line, with page margins (as the Server page)."""
    page = QtWidgets.QWidget()
    column = page_column(page, title, intro, margins=(20, 16, 20, 12), spacing=10)
    column.addWidget(body, 1)
    return page


def _app() -> QtWidgets.QApplication:
    app = QtWidgets.QApplication.instance()
    if not isinstance(app, QtWidgets.QApplication):
        raise RuntimeError("the main window needs a QApplication")
    return app


__all__ = ["MainWindow", "apply_theme"]
