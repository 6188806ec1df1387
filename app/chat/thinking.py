"""A reply's thinking, folded above its answer, and the auto-sized text body that message
cards are made of.

`ThinkingBlock` is the reasoning model's thinking (the server's `reasoning_content`): a toggle
titled "Thinking…" while the model thinks and "Thought for 4.2 s" once it answered
(`export.thought_for`), folded at first. Unfolded, the text shows in the muted colour and
grows by appending only what arrived since the last repaint, so a long thought streams at the
same cost per repaint as a short one; folded, nothing is drawn at all.
"""

from __future__ import annotations

from app.qt import Qt, QtCore, QtGui, QtWidgets, Signal


class Body(QtWidgets.QTextBrowser):
    """A borderless rich-text body that is always exactly as tall as its text."""

    link_clicked = Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("bubbleBody")
        self.setOpenLinks(False)
        self.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QtWidgets.QSizePolicy.Policy.Expanding,
                           QtWidgets.QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.anchorClicked.connect(lambda url: self.link_clicked.emit(url.toString()))
        self.setFixedHeight(24)

    def _fit(self, size: QtCore.QSizeF) -> None:
        height = int(size.height() + 0.999) + 2 * self.frameWidth()
        if height != self.height():
            self.setFixedHeight(height)

    def wheelEvent(self, event: QtGui.QWheelEvent) -> None:
        event.ignore()  # let the transcript scroll; this body never scrolls itself


class ThinkingBlock(QtWidgets.QWidget):
    """A reply's thinking: a toggle titled "Thinking…" / "Thought for 4.2 s" and, when
    unfolded, the text in the muted colour. Folded at first; the text is drawn only while
    unfolded, and then only what was added since the last draw.

    Attributes:
        toggle: the title; clicking it folds and unfolds. body: the thinking text.
    """

    THINKING = "Thinking…"

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        layout.setSpacing(2)
        self.toggle = QtWidgets.QToolButton(self)
        self.toggle.setObjectName("thinkingToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.toggle.setToolTip("Show or hide the model's thinking (never sent back to it)")
        self.toggle.toggled.connect(self._on_toggled)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.body = Body(self)
        self.body.hide()
        layout.addWidget(self.body)
        self._text = ""
        self._shown = 0  # characters of `_text` in the body
        self._color = QtGui.QColor()

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def show_thinking(self, text: str, title: str, color: str) -> None:
        self.toggle.setText(title)
        if QtGui.QColor(color) != self._color:
            self._color = QtGui.QColor(color)
            self._shown = 0  # redraw in the new theme's colour
        if not text.startswith(self._text[:self._shown]):
            self._shown = 0
        self._text = text
        if self.expanded:
            self._draw()

    def _on_toggled(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        if on:
            self._draw()
        self.body.setVisible(on)

    def _draw(self) -> None:
        if self._shown == 0:
            self.body.clear()
        if self._shown < len(self._text):
            cursor = QtGui.QTextCursor(self.body.document())
            cursor.movePosition(QtGui.QTextCursor.MoveOperation.End)
            char_format = QtGui.QTextCharFormat()
            char_format.setForeground(self._color)
            cursor.insertText(self._text[self._shown:], char_format)
            self._shown = len(self._text)
