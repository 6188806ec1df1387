"""Where the user writes: a growing text box with Send / Stop, its attachments, and the Edit &
resend mode.

Enter or Ctrl+Enter sends, Shift+Enter adds a line; Tab moves the focus on, as in every other
field (Ctrl+Tab types a tab; a code fence keeps indentation anyway). While a reply streams the
button reads Stop. In edit mode a banner says that sending makes a new branch (the old version
stays). With no model to answer, Send is disabled and says why (`set_blocked`); the text
typed so far stays.

Images and documents are attached with the paperclip button (a file dialog), by dropping
files (or an image) on the composer or the chat, or by pasting (an image from the clipboard,
or copied files), and kept in `app.chat.pending_attachments.PendingAttachments`: an image is
checked at once; a document's text is extracted on the background runner (a large PDF takes
seconds), its chip saying "reading…" meanwhile. A bad file is a one-line error under the box
and is not added. Images show as thumbnails, documents as their name and token count, with
whether they fit the context left: "≈N tokens" (characters / 4) until the served model's
tokenizer has counted them (`POST /tokenize`, asynchronous), then "N tokens"; with no model
ready, or when the count fails, the estimate stays. What cannot be sent to the loaded model
(images to a model without a projector) is said in that line when Send is pressed, as is a
document still being read; nothing is sent and nothing typed or attached is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.chat.attachment_views import AttachmentStrip, ImageViewer, pixmap_of
from app.chat.attachments import Pending, PendingDocument, PendingImage, ReadingDocument
from app.chat.pending_attachments import Item, PendingAttachments
from app.qt import Qt, QtCore, QtGui, QtWidgets, Signal
from app.services.background import BackgroundRunner
from app.widgets import ElidedLabel

MAX_LINES = 8
PLACEHOLDER = "Message the model…  (Enter sends, Shift+Enter adds a line)"
SEND_TIP = "Send (Enter / Ctrl+Enter)"
ATTACH_TIP = "Attach images or documents (.txt, .md, code, PDF) — or drop or paste them here"
FILE_FILTER = ("Images and documents (*.png *.jpg *.jpeg *.gif *.webp *.bmp *.tif *.tiff *.txt "
               "*.md *.pdf *.py *.js *.ts *.json *.yaml *.yml *.toml *.c *.h *.cpp *.rs *.go "
               "*.java *.html *.css *.sh *.csv);;All files (*)")


def holds_attachment(mime: QtCore.QMimeData) -> bool:
    """Local files, or an image without text (a screenshot, "Copy image" in a browser)."""
    if mime.hasUrls() and any(url.isLocalFile() for url in mime.urls()):
        return True
    return mime.hasImage() and not mime.hasText()


class _Input(QtWidgets.QPlainTextEdit):
    """Signals:
        submit(): Enter was pressed.
        attach(QMimeData): files or an image were pasted or dropped on the text.
    """

    submit = Signal()
    attach = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.setTabChangesFocus(True)

    def canInsertFromMimeData(self, source: QtCore.QMimeData) -> bool:
        return holds_attachment(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QtCore.QMimeData) -> None:
        """Paste and drop land here: attachments go to the composer, text into the box."""
        if holds_attachment(source):
            self.attach.emit(source)
        else:
            super().insertFromMimeData(source)

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
        submitted(str, list[Pending]): send this text and these attachments as a new message.
        edit_submitted(int, str, list[Pending]): send them as a new version of message `int`.
        stop_requested(): the user pressed Stop.
        edit_cancelled(): the user left edit mode.
        send_refused(str): the user tried to send while Send is blocked, for this reason
            (the text stays in the box).

    Attributes:
        editing_id: the user message being edited, or None.
        pending: the attachments (`PendingAttachments`: reads documents on the runner and
            counts their tokens; the page sets its `count_tokens` and `tokenizer`).
        attachments: what will be sent with the next message (checked images, read documents,
            and documents still being read: `ReadingDocument`).
        check: why these attachments cannot be sent now ("" when they can); set by the page.
        context_budget: the tokens left for documents in the next message, or None when not
            known; set by the page (a document chip says whether it goes in whole).
    """

    submitted = Signal(str, object)
    edit_submitted = Signal(int, str, object)
    stop_requested = Signal()
    edit_cancelled = Signal()
    send_refused = Signal(str)

    def __init__(self, runner: BackgroundRunner, parent: QtWidgets.QWidget | None = None) -> None:
        """`runner`: where documents are read (their text extracted), off the GUI thread."""
        super().__init__(parent)
        self.setObjectName("composerBar")
        self.editing_id: int | None = None
        self._busy = False
        self.blocked = ""  # why Send cannot work now ("" when it can)
        self.pending = PendingAttachments(runner, self)
        self.pending.changed.connect(self._attachments_changed)
        self.pending.counted.connect(self.refresh_attachments)
        self.check: Callable[[list[Pending]], str] = lambda _pending: ""
        self.context_budget: Callable[[], int | None] = lambda: None
        self._pasted = 0
        self._problem_is_check = False
        self.setAcceptDrops(True)
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
        column = QtWidgets.QVBoxLayout(frame)
        column.setContentsMargins(6, 4, 6, 4)
        column.setSpacing(4)
        self.strip = AttachmentStrip(removable=True)
        self.strip.removed.connect(self.remove_attachment)
        self.strip.image_clicked.connect(self._view_image)
        column.addWidget(self.strip)
        row = QtWidgets.QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        column.addLayout(row)
        self.attach_button = QtWidgets.QToolButton()
        self.attach_button.setText("+")
        self.attach_button.setToolTip(ATTACH_TIP)
        self.attach_button.setAccessibleName("Attach files")
        self.attach_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.attach_button.clicked.connect(self.choose_files)
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        self.input = _Input()
        self.input.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        self.input.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.input.setStyleSheet("border: none; background: transparent;")
        self.input.setPlaceholderText(PLACEHOLDER)
        self.input.submit.connect(self._on_submit)
        self.input.attach.connect(self.add_mime)
        self.input.document().contentsChanged.connect(self._fit)
        row.addWidget(self.input, 1)
        self.send_button = QtWidgets.QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.send_button.clicked.connect(self._on_button)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        outer.addWidget(frame)
        self.problem_label = QtWidgets.QLabel()
        self.problem_label.setObjectName("errorText")
        self.problem_label.setWordWrap(True)
        self.problem_label.hide()
        outer.addWidget(self.problem_label)
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

    # -- attachments -------------------------------------------------------------------

    def choose_files(self) -> None:
        """The paperclip: pick files in a dialog."""
        names, _ = QtWidgets.QFileDialog.getOpenFileNames(
            self, "Attach images or documents", "", FILE_FILTER)
        if names:
            self.add_files([Path(name) for name in names])

    @property
    def attachments(self) -> list[Item]:
        """What goes with the next message (documents being read included)."""
        return self.pending.items

    def add_files(self, paths: list[Path]) -> None:
        """Check and add each file (a document is read in the background, its chip saying
        "reading…"); the first that cannot be used is said in one line."""
        self.pending.add_files(paths)

    def add_image_data(self, data: bytes, name: str) -> None:
        self.pending.add_image_data(data, name)

    def add_mime(self, mime: QtCore.QMimeData) -> bool:
        """Attach what was dropped or pasted: local files, else an image. False: neither."""
        files = [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()] \
            if mime.hasUrls() else []
        if files:
            self.add_files(files)
            return True
        if mime.hasImage():
            image = mime.imageData()
            if isinstance(image, QtGui.QPixmap):
                image = image.toImage()
            if isinstance(image, QtGui.QImage) and not image.isNull():
                self._pasted += 1
                self.add_image_data(_png_bytes(image), f"pasted image {self._pasted}.png")
                return True
        return False

    def remove_attachment(self, index: int) -> None:
        """Remove item `index` (a document being read is dropped when its text arrives)."""
        self.pending.remove(index)

    def clear_attachments(self) -> None:
        self.pending.clear()

    def show_problem(self, text: str) -> None:
        """One line under the box ("" hides it)."""
        self.problem_label.setText(text)
        self.problem_label.setVisible(bool(text))

    def refresh_attachments(self) -> None:
        """Describe the documents again and say again what cannot be sent (the model, its
        context or the chat changed; a count arrived); a file's own problem stays until the
        next change. Documents the served model has not counted yet are counted."""
        self.pending.count_documents()
        self._show_strip()
        if self._problem_is_check:
            self.show_problem(self._unsendable())

    def _attachments_changed(self, problems: list[str]) -> None:
        self._show_strip()
        self.show_problem(problems[0] if problems else self._unsendable(sending=False))
        self._problem_is_check = not problems

    def _unsendable(self, sending: bool = False) -> str:
        """Why the attachments cannot be sent ("" when they can); a document being read is
        a reason only when Send is pressed (its chip already says "reading…")."""
        if not self.attachments:
            return ""
        reading = self.pending.reading
        if sending and reading:
            return (f"{reading[0].name} is still being read: send once its chip shows its "
                    "tokens")
        return self.check(self.pending.ready)

    def _show_strip(self) -> None:
        documents = [p for p in self.attachments if isinstance(p, PendingDocument)]
        budget = self.context_budget()
        whole = budget is None or sum(d.tokens for d in documents) <= budget
        items: list[tuple[QtGui.QPixmap | None, str]] = []
        for item in self.attachments:
            if isinstance(item, PendingImage):
                items.append((pixmap_of(item.data), item.name))
            elif isinstance(item, ReadingDocument):
                items.append((None, f"{item.name} · reading…"))
            else:
                fit = "goes in whole" if whole else \
                    "too long for the context: the most relevant passages go in"
                known = "" if budget is None else f" · {fit}"
                items.append((None, item.attachment("whole").describe() + known))
        self.strip.set_items(items)
        self._fit()

    def _view_image(self, index: int) -> None:
        item = self.attachments[index] if 0 <= index < len(self.attachments) else None
        if isinstance(item, PendingImage):
            ImageViewer(pixmap_of(item.data), item.name, self).open()

    def dragEnterEvent(self, event: QtGui.QDragEnterEvent) -> None:
        if holds_attachment(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event: QtGui.QDragMoveEvent) -> None:
        if holds_attachment(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dragMoveEvent(event)

    def dropEvent(self, event: QtGui.QDropEvent) -> None:
        if self.add_mime(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dropEvent(event)

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
        editing = self.editing_id
        if (not text and not self.attachments) or self._busy:
            return
        if self.blocked:
            self.send_refused.emit(self.blocked)
            return
        problem = self._unsendable(sending=True)
        if problem:  # said under the box; the text and the attachments stay
            self.show_problem(problem)
            self._problem_is_check = True
            return
        pending = self.pending.take()  # redraws the strip, empty
        self.input.clear()
        self._set_banner(False)
        self.show_problem("")
        self.editing_id = None
        if editing is None:
            self.submitted.emit(text, pending)
        else:
            self.edit_submitted.emit(editing, text, pending)

    def _fit(self) -> None:
        metrics = self.input.fontMetrics()
        wanted = int(self.input.document().size().height())
        lines = max(1, min(MAX_LINES, wanted))
        self.input.setVerticalScrollBarPolicy(  # scroll only past MAX_LINES
            Qt.ScrollBarPolicy.ScrollBarAsNeeded if wanted > MAX_LINES
            else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.input.setFixedHeight(lines * metrics.lineSpacing() + 14)


def _png_bytes(image: QtGui.QImage) -> bytes:
    buffer = QtCore.QBuffer()
    buffer.open(QtCore.QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")  # type: ignore[call-overload]  # the stubs say bytes, Qt takes str
    return bytes(buffer.data().data())
