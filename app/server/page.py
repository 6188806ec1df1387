"""The Server page: the engine process's state and address, start / restart / stop, code
that connects a client to it (`connect_panel`), the models it holds (`resident_panel`, from
`GET /api/status` every few seconds while the page shows) and its logs (every start keeps
one; a crash's last lines are there to read), and "Lend this machine" (`worker_card`: this
machine's devices served to another machine's Outrider, `outrider worker`).

Where the engine listens follows the server settings (Settings → App → Local server, see
`app.engine.process.engine_listen`): a fixed port, 1234 by default, no key on this computer;
a change takes effect when the engine restarts, and the page says so until then. A port held
by another program is named here.
"""

from __future__ import annotations

from pathlib import Path

from app.engine.client import EngineClient, EngineState
from app.engine.process import EngineCommand, EngineExit, EngineListen, engine_logs
from app.qt import Qt, QtGui, QtWidgets
from app.server.connect_panel import ConnectPanel
from app.server.resident import ResidentModel
from app.server.resident_panel import ResidentPanel
from app.server.snippets import Endpoint
from app.server.worker_card import WorkerCard
from app.widgets import muted_label, page_column
from runtime.settings.user import AppSettings

LOG_TAIL_BYTES = 256 * 1024
CONNECT, RESIDENT, LOGS = range(3)  # the tabs under the engine's card


def read_log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of a log, from a line start."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError as exc:
        return f"Cannot read {path}: {exc.strerror or exc}"
    text = data.decode("utf-8", errors="replace")
    return text if size <= limit else text.split("\n", 1)[-1]


def describe_listen(listen: EngineListen, wants_network: bool = False,
                    port_taken: int | None = None) -> str:
    """One line on what the server settings ask for (and, after a start, what got in the way).

    >>> describe_listen(EngineListen())
    'Port 1234 on this computer only, no API key needed.'
    >>> describe_listen(EngineListen(), port_taken=1234)[:57]
    'Port 1234 is used by another program: this run listens on'
    """
    if port_taken is not None:
        return (f"Port {port_taken} is used by another program: this run listens on the address "
                "above instead. Free it, or choose another port in Settings → App, and Restart.")
    if listen.network:
        return f"Port {listen.port} with your API key, reachable from other computers."
    key = "with your API key" if listen.api_key is not None else "no API key needed"
    if wants_network:
        return (f"Port {listen.port} on this computer only, {key}: network access needs an API "
                "key (Settings → App).")
    return f"Port {listen.port} on this computer only, {key}."


class ServerPage(QtWidgets.QWidget):
    """Attributes: connect_panel (the snippets), resident (the resident models), sections (the
    tabs holding them and the logs: CONNECT, RESIDENT, LOGS), worker_card (Lend this
    machine; `worker_command` runs it, default `outrider worker`)."""

    def __init__(self, client: EngineClient, log_dir: Path,
                 parent: QtWidgets.QWidget | None = None, *,
                 worker_command: EngineCommand | None = None) -> None:
        super().__init__(parent)
        self._client = client
        self._log_dir = log_dir
        self._reveal = False
        self._wants_network = False
        # The page scrolls when the window is short: the engine card, the buttons and the
        # tabs below need ~470 px, more than a 520 px window leaves.
        body = QtWidgets.QWidget()
        scroll = QtWidgets.QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        scroll.setWidget(body)
        frame = QtWidgets.QVBoxLayout(self)
        frame.setContentsMargins(0, 0, 0, 0)
        frame.addWidget(scroll)
        outer = page_column(
            body, "Engine server",
            "Models run in a separate engine process, so a crash there never takes your chats "
            "with it. The same OpenAI-compatible server can be used by other tools on this "
            "machine while Outrider runs.", margins=(28, 22, 28, 22), spacing=14)

        card = QtWidgets.QFrame()
        card.setObjectName("card")
        form = QtWidgets.QFormLayout(card)
        form.setContentsMargins(16, 12, 16, 12)
        form.setHorizontalSpacing(18)
        self.state_label = QtWidgets.QLabel()
        self.url_label = QtWidgets.QLabel()
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.pid_label = QtWidgets.QLabel()
        self.model_label = QtWidgets.QLabel()
        key_row = QtWidgets.QHBoxLayout()
        self.key_label = QtWidgets.QLabel()
        self.key_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.show_key = QtWidgets.QToolButton()
        self.show_key.setText("Show")
        self.show_key.clicked.connect(self._toggle_key)
        self.copy_key = QtWidgets.QToolButton()
        self.copy_key.setText("Copy")
        self.copy_key.clicked.connect(self._copy_key)
        key_row.addWidget(self.key_label)
        key_row.addWidget(self.show_key)
        key_row.addWidget(self.copy_key)
        key_row.addStretch(1)
        form.addRow("State", self.state_label)
        form.addRow("Address", self.url_label)
        form.addRow("API key", key_row)
        form.addRow("Process", self.pid_label)
        form.addRow("Model", self.model_label)
        self.config_label = muted_label()
        form.addRow("Settings", self.config_label)
        outer.addWidget(card)

        buttons = QtWidgets.QHBoxLayout()
        self.start_button = QtWidgets.QPushButton("Start")
        self.start_button.clicked.connect(client.start)
        self.restart_button = QtWidgets.QPushButton("Restart")
        self.restart_button.clicked.connect(client.restart)
        # Stops the API, not the chat: the engine comes back on a private address with the
        # chat's model (EngineClient.set_api_enabled). Start API undoes it.
        self.stop_button = QtWidgets.QPushButton("Stop API")
        self.stop_button.setToolTip("Other programs can no longer connect; the chat keeps its "
                                    "model (reloaded on a private address)")
        self.stop_button.clicked.connect(self._on_stop_api)
        self.start_api_button = QtWidgets.QPushButton("Start API")
        self.start_api_button.clicked.connect(self._on_start_api)
        for button in (self.start_button, self.restart_button, self.stop_button,
                       self.start_api_button):
            buttons.addWidget(button)
        self.pending_label = QtWidgets.QLabel(
            "The server settings changed: Restart the engine to apply them.")
        self.pending_label.setObjectName("editBanner")
        self.pending_label.hide()
        buttons.addWidget(self.pending_label)
        buttons.addStretch(1)
        outer.addLayout(buttons)

        self.crash_label = QtWidgets.QLabel()
        self.crash_label.setObjectName("replyError")
        self.crash_label.setWordWrap(True)
        self.crash_label.hide()
        outer.addWidget(self.crash_label)

        self.sections = QtWidgets.QTabWidget()
        self.connect_panel = ConnectPanel()
        self.sections.addTab(self.connect_panel, "Connect a client")
        self.resident = ResidentPanel(client)
        self.resident.models_changed.connect(self._on_resident_changed)
        self.sections.addTab(self.resident, "Resident models")
        logs = QtWidgets.QWidget()
        logs_column = QtWidgets.QVBoxLayout(logs)
        logs_column.setContentsMargins(12, 10, 12, 10)
        logs_row = QtWidgets.QHBoxLayout()
        logs_row.addWidget(QtWidgets.QLabel("Run"))
        self.log_combo = QtWidgets.QComboBox()
        self.log_combo.setMinimumWidth(280)
        self.log_combo.currentIndexChanged.connect(self._show_selected_log)
        logs_row.addWidget(self.log_combo)
        refresh = QtWidgets.QToolButton()
        refresh.setText("Refresh")
        refresh.clicked.connect(self.refresh_logs)
        logs_row.addWidget(refresh)
        logs_row.addStretch(1)
        logs_column.addLayout(logs_row)
        self.log_view = QtWidgets.QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setLineWrapMode(QtWidgets.QPlainTextEdit.LineWrapMode.NoWrap)
        self.log_view.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont))
        logs_column.addWidget(self.log_view, 1)
        self.sections.addTab(logs, "Engine logs")
        outer.addWidget(self.sections, 1)
        self.worker_card = WorkerCard(worker_command)
        outer.addWidget(self.worker_card)

        client.state_changed.connect(self._on_engine_changed)
        client.model_changed.connect(self._on_engine_changed)
        client.engine_exited.connect(self._on_exited)
        self._update()

    def _update(self, *_: object) -> None:
        c = self._client
        state = c.state
        self.state_label.setText(state.value.capitalize())
        address = c.address
        listening = c.process.listening
        also = " (and this computer's network addresses)" if listening and listening.network else ""
        self.url_label.setText(address.url + also if address else "–")
        self.pid_label.setText(str(c.process.pid) if c.process.pid else "–")
        self.model_label.setText(c.model.name if c.model else "–")
        self._show_key_text()
        self._show_endpoint()
        self.start_button.setEnabled(state in (EngineState.STOPPED, EngineState.CRASHED))
        self.restart_button.setEnabled(state != EngineState.STARTING)
        api = c.process.api_enabled
        self.stop_button.setVisible(api)
        self.stop_button.setEnabled(c.process.running)
        self.start_api_button.setVisible(not api)
        if state.running:
            self.crash_label.hide()
        taken = c.process.port_taken if c.process.running else None
        self.config_label.setText(
            describe_listen(c.process.listen, self._wants_network, taken) if api else
            "The API is stopped: the chat's engine runs on a private address. Start API to "
            f"serve port {c.process.listen.port} again.")
        self.pending_label.setVisible(listening is not None and listening != c.process.listen)

    def show_settings(self, settings: AppSettings) -> None:
        """The server settings changed (the window has set the engine's next listening)."""
        self._wants_network = settings.server.allow_network
        self._update()

    def _show_key_text(self) -> None:
        address = self._client.address
        if address is None:
            self.key_label.setText("–")
        elif not address.api_key:
            self.key_label.setText("none needed on this computer")
        else:
            self.key_label.setText(address.api_key if self._reveal else "•" * 12)
        has_key = address is not None and bool(address.api_key)
        self.show_key.setEnabled(has_key)
        self.copy_key.setEnabled(has_key)
        self.show_key.setText("Hide" if self._reveal else "Show")

    def _toggle_key(self) -> None:
        self._reveal = not self._reveal
        self._show_key_text()
        self._show_endpoint()

    def _show_endpoint(self) -> None:
        """The snippets: where the API listens, the model to name (the chat's, else a ready
        resident one) and the key."""
        c = self._client
        address = c.address
        if address is None:
            self.connect_panel.show_endpoint(
                None, note="The engine is not running: Start it, and the snippets here connect "
                "to it.")
            return
        if not c.process.api_enabled:
            self.connect_panel.show_endpoint(
                None, note="The API is stopped: Start API to let other programs connect.")
            return
        ready = [m.name for m in self.resident.models if m.state == "ready"]
        model = c.model.name if c.model else (ready[0] if ready else "")
        notes = [] if model else ["No model is loaded: MODEL stands for the id of the one you "
                                  "load."]
        listening = c.process.listening
        if listening is not None and listening.network:
            notes.append("From another computer, put this computer's address in place of "
                         "127.0.0.1.")
        self.connect_panel.show_endpoint(Endpoint(address.url, model, address.api_key),
                                         reveal=self._reveal, note=" ".join(notes))

    # -- resident models ---------------------------------------------------------------

    def _on_engine_changed(self, *_: object) -> None:
        self._update()
        if self.isVisible():
            self.resident.refresh()

    def _on_resident_changed(self, models: tuple[ResidentModel, ...]) -> None:
        count = f" ({len(models)})" if models else ""
        self.sections.setTabText(RESIDENT, f"Resident models{count}")
        if self._client.model is None:
            self._show_endpoint()  # a ready resident model names the snippets' model

    def _on_stop_api(self) -> None:
        self._client.set_api_enabled(False)
        self._update()

    def _on_start_api(self) -> None:
        self._client.set_api_enabled(True)
        self._update()

    def _copy_key(self) -> None:
        if self._client.address is not None:
            QtGui.QGuiApplication.clipboard().setText(self._client.address.api_key)

    def _on_exited(self, info: EngineExit) -> None:
        self._update()
        if not info.expected:
            self.sections.setCurrentIndex(LOGS)
            tail = info.tail.strip().splitlines()[-3:] if info.tail.strip() else []
            detail = ("<br>" + "<br>".join(_escape(line) for line in tail)) if tail else ""
            self.crash_label.setText(f"<b>{info.describe()}</b> Its log is selected below; "
                                     f"Start or send a message to restart it.{detail}")
            self.crash_label.show()
        self.refresh_logs(select=info.log_path)

    def refresh_logs(self, select: Path | None = None) -> None:
        current = select or (Path(self.log_combo.currentData()) if self.log_combo.currentData()
                             else None)
        self.log_combo.blockSignals(True)
        self.log_combo.clear()
        for path in engine_logs(self._log_dir):
            self.log_combo.addItem(path.name, str(path))
        self.log_combo.blockSignals(False)
        index = self.log_combo.findData(str(current)) if current else 0
        self.log_combo.setCurrentIndex(max(0, index))
        self._show_selected_log()

    def show_log(self, path: Path | None) -> None:
        self.sections.setCurrentIndex(LOGS)
        self.refresh_logs(select=path)

    def _show_selected_log(self) -> None:
        data = self.log_combo.currentData()
        self.log_view.setPlainText(read_log_tail(Path(data)) if data else "No engine logs yet.")
        self.log_view.moveCursor(QtGui.QTextCursor.MoveOperation.End)

    def showEvent(self, event: QtGui.QShowEvent) -> None:
        super().showEvent(event)
        self.refresh_logs()
        self.resident.start_polling()

    def hideEvent(self, event: QtGui.QHideEvent) -> None:
        super().hideEvent(event)
        self.resident.stop_polling()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
