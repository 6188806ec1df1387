"""A page that says what will come there (Models and Settings are built by a later issue)."""

from __future__ import annotations

from app.qt import Qt, QtWidgets


class PlaceholderPage(QtWidgets.QWidget):
    def __init__(self, title: str, text: str, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(28, 22, 28, 22)
        heading = QtWidgets.QLabel(title)
        heading.setObjectName("pageTitle")
        layout.addWidget(heading)
        body = QtWidgets.QLabel(text)
        body.setObjectName("muted")
        body.setWordWrap(True)
        body.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(body)
        layout.addStretch(1)
