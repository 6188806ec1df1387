"""The Server page's "Connect a client" tab: a snippet per client (curl, the openai, ollama and
anthropic Python clients, the environment variables tools read), filled with the running
server's address, model and key (`app.server.snippets`). The view shows the key masked unless
the page reveals it; Copy always copies it in clear.
"""

from __future__ import annotations

from app.qt import Qt, QtGui, QtWidgets
from app.server.snippets import CLIENTS, Endpoint, key_note, snippet
from app.widgets import muted_label


class ConnectPanel(QtWidgets.QWidget):
    """Attributes: tabs (one per `snippets.CLIENTS`, in order), view (the snippet as shown),
    copy_button, note_label."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._endpoint: Endpoint | None = None
        self._reveal = False
        column = QtWidgets.QVBoxLayout(self)
        column.setContentsMargins(12, 10, 12, 10)
        column.setSpacing(8)
        row = QtWidgets.QHBoxLayout()
        self.tabs = QtWidgets.QTabBar()
        self.tabs.setDrawBase(False)
        self.tabs.setExpanding(False)
        for client in CLIENTS:
            self.tabs.addTab(client.title)
        self.tabs.currentChanged.connect(self._show)
        row.addWidget(self.tabs)
        row.addStretch(1)
        self.copy_button = QtWidgets.QPushButton("Copy")
        self.copy_button.setToolTip("Copy the snippet, with the API key in clear")
        self.copy_button.clicked.connect(self.copy)
        row.addWidget(self.copy_button)
        column.addLayout(row)
        self.view = QtWidgets.QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setLineWrapMode(QtWidgets.QPlainTextEdit.LineWrapMode.NoWrap)
        self.view.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont))
        self.view.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                          | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        column.addWidget(self.view, 1)
        self.note_label = muted_label()
        self.note_label.setWordWrap(True)
        column.addWidget(self.note_label)
        self._show()

    @property
    def client_id(self) -> str:
        return CLIENTS[max(0, self.tabs.currentIndex())].id

    def select(self, client_id: str) -> None:
        self.tabs.setCurrentIndex(next(i for i, c in enumerate(CLIENTS) if c.id == client_id))

    def show_endpoint(self, endpoint: Endpoint | None, *, reveal: bool = False,
                      note: str = "") -> None:
        """Fill the snippets for `endpoint`; None (no server to reach) shows `note` alone.
        `note` adds a line before the one on the key (no model loaded yet, say)."""
        self._endpoint = endpoint
        self._reveal = reveal
        lines = [note] if note else []
        if endpoint is not None:
            lines.append(key_note(endpoint))
        self.note_label.setText(" ".join(lines))
        self._show()

    def text(self, *, masked: bool = True) -> str:
        """The current snippet ("" when there is no server to reach)."""
        if self._endpoint is None:
            return ""
        return snippet(self.client_id, self._endpoint, masked=masked)

    def copy(self) -> None:
        text = self.text(masked=False)
        if text:
            QtGui.QGuiApplication.clipboard().setText(text)

    def _show(self, *_: object) -> None:
        self.view.setPlainText(self.text(masked=not self._reveal))
        self.copy_button.setEnabled(self._endpoint is not None)
