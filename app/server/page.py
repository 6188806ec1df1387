"""The Server page: the engine process's state and address, start / restart / stop, and its
logs (every start keeps one; a crash's last lines are there to read).

Where the engine listens follows the server settings (Settings → App → Local server, see
`app.engine.process.engine_listen`); a change takes effect when the engine restarts, and the
page says so until then.
"""

from __future__ import annotations

from pathlib import Path

from app.engine.client import EngineClient, EngineState
from app.engine.process import EngineExit, EngineListen, engine_logs
from app.qt import Qt, QtGui, QtWidgets
from app.widgets import muted_label, page_column
from runtime.settings.user import AppSettings

LOG_TAIL_BYTES = 256 * 1024


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


def describe_listen(listen: EngineListen, wants_network: bool = False) -> str:
    """One line on what the server settings ask for."""
    if listen.fixed:
        where = "reachable from other computers" if listen.network else "this computer only"
        return f"Port {listen.port} with your API key, {where}."
    if wants_network:
        return ("Network access needs an API key (Settings → App): until one is set the "
                "engine stays on this computer, on a random port with a random key.")
    return ("This computer only, on a random port with a new random key at each start. Set an "
            "API key in Settings → App for a fixed address other tools can use.")


class ServerPage(QtWidgets.QWidget):
    def __init__(self, client: EngineClient, log_dir: Path,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._client = client
        self._log_dir = log_dir
        self._reveal = False
        self._wants_network = False
        outer = page_column(
            self, "Engine server",
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
        self.example_label = QtWidgets.QLabel()
        self.example_label.setObjectName("muted")
        self.example_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Try it", self.example_label)
        self.config_label = muted_label()
        form.addRow("Settings", self.config_label)
        outer.addWidget(card)

        buttons = QtWidgets.QHBoxLayout()
        self.start_button = QtWidgets.QPushButton("Start")
        self.start_button.clicked.connect(client.start)
        self.restart_button = QtWidgets.QPushButton("Restart")
        self.restart_button.clicked.connect(client.restart)
        self.stop_button = QtWidgets.QPushButton("Stop")
        self.stop_button.clicked.connect(client.stop)
        for button in (self.start_button, self.restart_button, self.stop_button):
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

        logs_row = QtWidgets.QHBoxLayout()
        logs_title = QtWidgets.QLabel("Engine logs")
        logs_title.setObjectName("panelTitle")
        logs_row.addWidget(logs_title)
        self.log_combo = QtWidgets.QComboBox()
        self.log_combo.setMinimumWidth(280)
        self.log_combo.currentIndexChanged.connect(self._show_selected_log)
        logs_row.addWidget(self.log_combo)
        refresh = QtWidgets.QToolButton()
        refresh.setText("Refresh")
        refresh.clicked.connect(self.refresh_logs)
        logs_row.addWidget(refresh)
        logs_row.addStretch(1)
        outer.addLayout(logs_row)
        self.log_view = QtWidgets.QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setLineWrapMode(QtWidgets.QPlainTextEdit.LineWrapMode.NoWrap)
        self.log_view.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont))
        outer.addWidget(self.log_view, 1)

        client.state_changed.connect(self._update)
        client.model_changed.connect(self._update)
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
        self.example_label.setText(
            f'curl -H "Authorization: Bearer $KEY" {address.url}/v1/models' if address else "–")
        self._show_key_text()
        self.start_button.setEnabled(state in (EngineState.STOPPED, EngineState.CRASHED))
        self.restart_button.setEnabled(state != EngineState.STARTING)
        self.stop_button.setEnabled(c.process.running)
        if state.running:
            self.crash_label.hide()
        self.config_label.setText(describe_listen(c.process.listen, self._wants_network))
        self.pending_label.setVisible(listening is not None and listening != c.process.listen)

    def show_settings(self, settings: AppSettings) -> None:
        """The server settings changed (the window has set the engine's next listening)."""
        self._wants_network = settings.server.allow_network
        self._update()

    def _show_key_text(self) -> None:
        address = self._client.address
        if address is None:
            self.key_label.setText("–")
        else:
            self.key_label.setText(address.api_key if self._reveal else "•" * 12)
        self.show_key.setText("Hide" if self._reveal else "Show")

    def _toggle_key(self) -> None:
        self._reveal = not self._reveal
        self._show_key_text()

    def _copy_key(self) -> None:
        if self._client.address is not None:
            QtGui.QGuiApplication.clipboard().setText(self._client.address.api_key)

    def _on_exited(self, info: EngineExit) -> None:
        self._update()
        if not info.expected:
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
        self.refresh_logs(select=path)

    def _show_selected_log(self) -> None:
        data = self.log_combo.currentData()
        self.log_view.setPlainText(read_log_tail(Path(data)) if data else "No engine logs yet.")
        self.log_view.moveCursor(QtGui.QTextCursor.MoveOperation.End)

    def showEvent(self, event: QtGui.QShowEvent) -> None:
        super().showEvent(event)
        self.refresh_logs()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
