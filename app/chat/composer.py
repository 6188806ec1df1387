"""Where the user writes: a growing text box with Send / Stop, and the Edit & resend mode.

Enter or Ctrl+Enter sends, Shift+Enter adds a line; Tab moves the focus on, as in every other
field (Ctrl+Tab types a tab; a code fence keeps indentation anyway). While a reply streams the
button reads Stop. In edit mode a banner says that sending makes a new branch (the old version
stays). With no model to answer, Send is disabled and says why (`set_blocked`); the text
typed so far stays.
"""

from __future__ import annotations

from app.qt import Qt, QtGui, QtWidgets, Signal
from app.widgets import ElidedLabel

MAX_LINES = 8
PLACEHOLDER = "Message the model…  (Enter sends, Shift+Enter adds a line)"
SEND_TIP = "Send (Enter / Ctrl+Enter)"


class _Input(QtWidgets.QPlainTextEdit):
    submit = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event: QtGui.QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
            return
        if event.key() == Qt.Key.Key_Tab and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.insertPlainText("\t")
            return
        super().keyPressEvent(event)


class Composer(QtWidgets.QWidget):
    """Signals:
        submitted(str): send this text as a new message.
        edit_submitted(int, str): send this text as a new version of message `int`.
        stop_requested(): the user pressed Stop.
        edit_cancelled(): the user left edit mode.
        send_refused(str): the user tried to send while Send is blocked, for this reason
            (the text stays in the box).

    Attributes:
        editing_id: the user message being edited, or None.
    """

    submitted = Signal(str)
    edit_submitted = Signal(int, str)
    stop_requested = Signal()
    edit_cancelled = Signal()
    send_refused = Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composerBar")
        self.editing_id: int | None = None
        self._busy = False
        self.blocked = ""  # why Send cannot work now ("" when it can)
        outer = QtWidgets.QVBoxLayout(self)
        outer.setContentsMargins(24, 6, 24, 14)
        outer.setSpacing(4)

        banner = QtWidgets.QHBoxLayout()
        # Elided: a plain label as wide as this sentence widened the window by 29 px on Edit.
        self.edit_banner = ElidedLabel("Editing your message — sending makes a new branch; "
                                            "the earlier version stays.")
        self.edit_banner.setObjectName("editBanner")
        self.cancel_edit_button = QtWidgets.QToolButton()
        self.cancel_edit_button.setText("Cancel edit")
        self.cancel_edit_button.clicked.connect(self.cancel_edit)
        banner.addWidget(self.edit_banner, 1)
        banner.addStretch(1)
        banner.addWidget(self.cancel_edit_button)
        outer.addLayout(banner)

        frame = QtWidgets.QFrame()
        frame.setObjectName("composer")
        row = QtWidgets.QHBoxLayout(frame)
        row.setContentsMargins(6, 4, 6, 4)
        self.input = _Input()
        self.input.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        self.input.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.input.setStyleSheet("border: none; background: transparent;")
        self.input.setPlaceholderText(PLACEHOLDER)
        self.input.submit.connect(self._on_submit)
        self.input.document().contentsChanged.connect(self._fit)
        row.addWidget(self.input, 1)
        self.send_button = QtWidgets.QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.send_button.clicked.connect(self._on_button)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        outer.addWidget(frame)
        self._set_banner(False)
        self._fit()

    @property
    def text(self) -> str:
        return self.input.toPlainText()

    def set_text(self, text: str) -> None:
        self.input.setPlainText(text)
        self.input.moveCursor(QtGui.QTextCursor.MoveOperation.End)

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.send_button.setText("Stop" if busy else "Send")
        self._show_send_state()

    def set_blocked(self, reason: str) -> None:
        """Disable Send with `reason` as its tooltip and the placeholder ("" enables it)."""
        self.blocked = reason
        self.input.setPlaceholderText(reason or PLACEHOLDER)
        self._show_send_state()

    def _show_send_state(self) -> None:
        if self._busy:
            self.send_button.setEnabled(True)
            self.send_button.setToolTip("Stop the reply (Esc)")
        else:
            self.send_button.setEnabled(not self.blocked)
            self.send_button.setToolTip(self.blocked or SEND_TIP)

    def start_edit(self, message_id: int, text: str) -> None:
        self.editing_id = message_id
        self.set_text(text)
        self._set_banner(True)
        self.input.setFocus()

    def cancel_edit(self) -> None:
        if self.editing_id is None:
            return
        self.editing_id = None
        self.input.clear()
        self._set_banner(False)
        self.edit_cancelled.emit()

    def submit(self) -> None:
        """Send what is typed (Ctrl+Enter from anywhere in the window lands here)."""
        self._on_submit()

    def _set_banner(self, on: bool) -> None:
        self.edit_banner.setVisible(on)
        self.cancel_edit_button.setVisible(on)

    def _on_button(self) -> None:
        if self._busy:
            self.stop_requested.emit()
        else:
            self._on_submit()

    def _on_submit(self) -> None:
        text = self.text.strip()
        if not text or self._busy:
            return
        if self.blocked:
            self.send_refused.emit(self.blocked)
            return
        self.input.clear()
        self._set_banner(False)
        editing, self.editing_id = self.editing_id, None
        if editing is None:
            self.submitted.emit(text)
        else:
            self.edit_submitted.emit(editing, text)

    def _fit(self) -> None:
        metrics = self.input.fontMetrics()
        wanted = int(self.input.document().size().height())
        lines = max(1, min(MAX_LINES, wanted))
        self.input.setVerticalScrollBarPolicy(  # scroll only past MAX_LINES
            Qt.ScrollBarPolicy.ScrollBarAsNeeded if wanted > MAX_LINES
            else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.input.setFixedHeight(lines * metrics.lineSpacing() + 14)
