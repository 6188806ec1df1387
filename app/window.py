"""The main window: left navigation (Chat · Models · Settings · Server), the pages, the dock
of live panels, and a status bar with the model, memory and engine state.

The window is handed its collaborators (engine client, chat store, user folders) and builds
its own parts from them; nothing is global. Window geometry, dock layout, page and splitter
sizes are kept in `window.ini` in the config folder (QSettings, INI format).
"""

from __future__ import annotations

from pathlib import Path

from app.background import BackgroundRunner
from app.chat.controller import ChatController
from app.chat.markdown import warm_up as warm_up_markdown
from app.chat.model_picker import ModelPicker, library_models
from app.chat.page import ChatPage
from app.engine_client import EngineClient, EngineState
from app.engine_process import EngineExit
from app.pages.first_run import FirstRunPage
from app.pages.placeholder import PlaceholderPage
from app.pages.server_page import ServerPage
from app.panels.base import fmt_bytes
from app.qt import Qt, QtCore, QtGui, QtWidgets, Signal
from app.store import ChatStore
from app.theme import Palette, apply_theme, system_palette
from app.wire import MetricsSnapshot, ModelInfo
from runtime.paths import UserDirs
from runtime.settings import LoadSettings

PAGES = ("Chat", "Models", "Settings", "Server")
CHAT, MODELS, SETTINGS, SERVER, FIRST_RUN = range(5)
_STATE_COLORS = {EngineState.READY: "ok", EngineState.CRASHED: "error_text",
                 EngineState.LOADING: "warn", EngineState.STARTING: "warn"}


class MainWindow(QtWidgets.QMainWindow):
    """Signals:
        first_painted(): the window drew itself for the first time (startup benchmark).

    Attributes:
        chat: the Chat page; controller: its ChatController; picker: the model picker.
        panels: the live-panels dock (None until built, just after the first paint).
    """

    first_painted = Signal()

    def __init__(self, client: EngineClient, store: ChatStore, dirs: UserDirs,
                 palette: Palette | None = None, default_model: Path | None = None,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Outrider")
        self.resize(1320, 840)
        self.client = client
        self.dirs = dirs
        self._palette = palette or system_palette(_app())
        self._default_model = default_model
        self._painted = False
        self._closed = False
        self.panels = None
        self._last_metrics: MetricsSnapshot | None = None
        self._settings = QtCore.QSettings(str(dirs.config / "window.ini"),
                                          QtCore.QSettings.Format.IniFormat)
        self.runner = BackgroundRunner(self)
        self.controller = ChatController(store, client, self)
        self.picker = ModelPicker(client, self.runner, dirs.models)
        self.chat = ChatPage(self.controller, self.picker, self._palette)
        self.server = ServerPage(client, dirs.logs)
        self.first_run = FirstRunPage(self.runner, default_model or dirs.models / "none.gguf")
        self._build_layout()
        self._build_status_bar()
        self._build_actions()
        self._connect()
        self._restore_state()

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
        self.pages.addWidget(PlaceholderPage(
            "Models",
            "Coming next: <b>Discover</b> (search the Hugging Face Hub), each repository's "
            "quants with a fit badge for this machine, the <b>Downloads</b> queue (resumable), "
            "and your <b>Library</b>. Until then, models in the library folder appear in the "
            f"chat's model picker:<br><code>{self.dirs.models}</code>"))
        self.pages.addWidget(PlaceholderPage(
            "Settings",
            "Coming next: app settings and per-model load settings — context length, GPU "
            "layers, K/V cache types, flash attention, threads, the draft model and k, "
            "sampling defaults, and the preferred quant for downloads."))
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
        self.model_label = QtWidgets.QLabel("No model")
        self.memory_label = QtWidgets.QLabel()
        self.state_button = QtWidgets.QToolButton()
        self.state_button.setToolTip("Engine state — click for the Server page")
        self.state_button.clicked.connect(lambda: self.show_page(SERVER))
        self.panels_button = QtWidgets.QToolButton()
        self.panels_button.setText("Live panels")
        self.panels_button.setCheckable(True)
        self.panels_button.setChecked(True)
        self.panels_button.toggled.connect(self.set_panels_visible)
        bar.addWidget(self.model_label)
        bar.addWidget(self.memory_label)
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
        self.nav.currentRowChanged.connect(self.pages.setCurrentIndex)
        self.chat.open_log_requested.connect(self.show_engine_log)
        self.chat.message.connect(lambda text: self.statusBar().showMessage(text, 5000))
        self.first_run.use_model.connect(self._on_first_run_model)
        self.first_run.browse_models.connect(lambda: self.show_page(MODELS))
        self.first_run.skip.connect(lambda: self.show_page(CHAT))
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

    def offer_first_run(self) -> bool:
        """Show the first-run page when the library is empty; True if shown."""
        if library_models(self.dirs.models) or self.client.wanted is not None:
            return False
        self.show_page(FIRST_RUN)
        return True

    def load_model(self, settings: LoadSettings) -> None:
        """Load at start-up (--model, the default model): no plan dialog, no questions."""
        self.picker.add_model(settings.model_path)
        self.picker.load(settings)

    def _on_first_run_model(self, path: Path) -> None:
        self.load_model(LoadSettings(model_path=path))
        self.show_page(CHAT)

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
        from app.panels.dock import LivePanels

        panels = LivePanels(self._palette, self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, panels)
        self.resizeDocks([panels], [380], Qt.Orientation.Horizontal)
        self.controller.step_received.connect(panels.on_step)
        self.controller.busy_changed.connect(panels.on_busy)
        self.controller.reply_finished.connect(panels.on_reply_finished)
        self.client.metrics_received.connect(panels.on_metrics)
        self.client.model_changed.connect(panels.on_model)
        panels.on_model(self.client.model)
        panels.visibilityChanged.connect(self._on_panels_visibility)
        self.panels = panels
        state = self._settings.value("state")
        if isinstance(state, QtCore.QByteArray):
            self.restoreState(state)
        panels.setVisible(self.panels_button.isChecked())
        if self._last_metrics is not None:
            panels.on_metrics(self._last_metrics)

    def set_panels_visible(self, visible: bool) -> None:
        if self.panels is not None:
            self.panels.setVisible(visible)
        elif visible:
            self.ensure_panels()

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

    def _on_model(self, model: ModelInfo | None) -> None:
        if model is None:
            self.model_label.setText("No model")
            return
        quant = f" · {model.quant}" if model.quant else ""
        self.model_label.setText(f"{model.name}{quant}")

    def _on_metrics(self, snapshot: MetricsSnapshot) -> None:
        self._last_metrics = snapshot
        planned = sum(d.planned_bytes for d in snapshot.devices)
        text = f"Engine RAM {fmt_bytes(snapshot.engine_rss_bytes)}"
        if planned:
            text += f" · planned {fmt_bytes(planned)}"
        self.memory_label.setText(text)

    def _on_engine_exited(self, info: EngineExit) -> None:
        if not info.expected:
            self.statusBar().showMessage(f"{info.describe()} Send a message to restart it; "
                                         "its log is on the Server page.", 15000)

    def _on_color_scheme(self, _scheme: Qt.ColorScheme) -> None:
        self.set_palette(system_palette(_app()))

    def set_palette(self, palette: Palette) -> None:
        """Switch the whole window to another theme (the OS scheme changed)."""
        self._palette = palette
        apply_theme(_app(), palette)
        self.chat.set_palette(palette)
        if self.panels is not None:
            self.panels.set_palette(palette)
        self._on_state(self.client.state)

    # -- window state ------------------------------------------------------------------

    def _restore_state(self) -> None:
        geometry = self._settings.value("geometry")
        if isinstance(geometry, QtCore.QByteArray):
            self.restoreGeometry(geometry)
        sizes = self._settings.value("splitter")
        if isinstance(sizes, QtCore.QByteArray):
            self.chat.splitter.restoreState(sizes)
        visible = self._settings.value("panels", "true")
        self.panels_button.blockSignals(True)
        self.panels_button.setChecked(str(visible).lower() == "true")
        self.panels_button.blockSignals(False)
        try:
            page = int(self._settings.value("page", CHAT))
        except (TypeError, ValueError):
            page = CHAT
        self.show_page(page if 0 <= page < len(PAGES) else CHAT)

    def _save_state(self) -> None:
        self._settings.setValue("geometry", self.saveGeometry())
        self._settings.setValue("state", self.saveState())
        self._settings.setValue("splitter", self.chat.splitter.saveState())
        self._settings.setValue("panels", "true" if self.panels_button.isChecked() else "false")
        page = self.pages.currentIndex()
        self._settings.setValue("page", page if page < len(PAGES) else CHAT)
        self._settings.sync()

    # -- Qt events ---------------------------------------------------------------------

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:
        super().paintEvent(event)
        if not self._painted:
            self._painted = True
            self.first_painted.emit()
            QtCore.QTimer.singleShot(0, self, self.ensure_panels)
            self.runner.submit(warm_up_markdown)

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:
        if not self._closed:
            self._save_state()
            self._closed = True
            self.controller.stop()
            self.client.stop()
            self.runner.shutdown()
        super().closeEvent(event)


def _app() -> QtWidgets.QApplication:
    app = QtWidgets.QApplication.instance()
    if not isinstance(app, QtWidgets.QApplication):
        raise RuntimeError("the main window needs a QApplication")
    return app


__all__ = ["MainWindow", "apply_theme"]
