"""Small widgets the pages share."""

from __future__ import annotations

from app.qt import Qt, QtCore, QtGui, QtWidgets


class ElidedLabel(QtWidgets.QLabel):
    """A one-line label that shortens its text with "…" instead of widening the window
    (a plain QLabel's minimum width is its whole text). The full text is the tooltip."""

    def __init__(self, text: str = "", parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setSizePolicy(QtWidgets.QSizePolicy.Policy.Ignored,
                           QtWidgets.QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:
        self._full = text
        self.setToolTip(text if text else "")
        self._elide()

    def text(self) -> str:
        return self._full

    def minimumSizeHint(self) -> QtCore.QSize:
        return QtCore.QSize(40, super().minimumSizeHint().height())

    def sizeHint(self) -> QtCore.QSize:
        width = self.fontMetrics().horizontalAdvance(self._full) + 8
        return QtCore.QSize(width, super().sizeHint().height())

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight,
                                              max(0, self.width() - 2))
        super().setText(shown)
