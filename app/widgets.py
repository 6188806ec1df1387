"""Small widgets the pages share, and the few layout pieces every page builds the same way:
a page's title and intro, a muted note, a read-only table and its cells.

    column = page_column(self, "Engine server", "Models run in a separate process…",
                         margins=(28, 22, 28, 22), spacing=14)
    table = read_only_table(("Model", "Repository", "Size"), stretch=1)
    cell(table, 0, 2).setText(fmt_bytes(model.size))   # runtime.units: "4.36 GiB"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def muted_label(text: str = "") -> QtWidgets.QLabel:
    """A wrapped label in the theme's muted colour (an intro, a note, a status line)."""
    label = QtWidgets.QLabel(text)
    label.setObjectName("muted")
    label.setWordWrap(True)
    return label


def page_column(page: QtWidgets.QWidget, title: str, intro: str, *,
                margins: tuple[int, int, int, int], spacing: int,
                title_name: str = "pageTitle") -> QtWidgets.QVBoxLayout:
    """Lay `page` out as a column that opens with its title and a muted intro line; the caller
    adds the rest. `title_name` picks the theme's style for the title (the first-run page's
    welcome is larger than a page title)."""
    column = QtWidgets.QVBoxLayout(page)
    column.setContentsMargins(*margins)
    column.setSpacing(spacing)
    heading = QtWidgets.QLabel(title)
    heading.setObjectName(title_name)
    column.addWidget(heading)
    column.addWidget(muted_label(intro))
    return column


def read_only_table(columns: Sequence[str], *, stretch: int,
                    tips: Mapping[str, str] | None = None) -> QtWidgets.QTableWidget:
    """A table the user reads and picks one row of. Every column is as wide as its values (a
    model's name shows whole, "chat" takes little) but the `stretch` one, which takes the rest
    and is cut short if need be: a repository id, long and less telling ("bartowski/…-GGUF").
    `tips` are header tooltips by column title."""
    table = QtWidgets.QTableWidget(0, len(columns))
    for index, title in enumerate(columns):
        item = QtWidgets.QTableWidgetItem(title)
        if tips and title in tips:
            item.setToolTip(tips[title])
        table.setHorizontalHeaderItem(index, item)
    table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QtWidgets.QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.SingleSelection)
    table.verticalHeader().setVisible(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QtWidgets.QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(stretch, QtWidgets.QHeaderView.ResizeMode.Stretch)
    return table


def cell(table: QtWidgets.QTableWidget, row: int, column: int) -> QtWidgets.QTableWidgetItem:
    """The item the page put at (row, column). Qt answers None for an empty cell; a page only
    asks for cells it filled, so an empty one is a bug, said here rather than as an
    AttributeError on None."""
    item = table.item(row, column)
    if item is None:
        raise LookupError(f"table cell ({row}, {column}) is empty")
    return item
