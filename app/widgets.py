"""Small widgets the pages share, and the few layout pieces every page builds the same way:
a page's title and intro, a muted note, a read-only table and its cells, and the guard that
keeps the scroll wheel from editing fields the user is scrolling past.

    column = page_column(self, "Engine server", "Models run in a separate process…",
                         margins=(28, 22, 28, 22), spacing=14)
    table = read_only_table(("Model", "Repository", "Size"), stretch=1)
    cell(table, 0, 2).setText(fmt_bytes(model.size))   # runtime.units: "4.36 GiB"
    app.installEventFilter(WheelGuard(window))          # once, by the main window
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


WHEEL_GUARDED = (QtWidgets.QAbstractSpinBox, QtWidgets.QComboBox, QtWidgets.QAbstractSlider)


class WheelGuard(QtCore.QObject):
    """An application-wide event filter: the scroll wheel over a spin box, combo box or slider
    that does not have focus scrolls the page around it instead of changing the value
    (Settings once went from Batch size 512 to 1 as the user scrolled past it). Once the user
    clicks or tabs into the field, the wheel steps it as usual.

    Two parts, both needed: those widgets get `StrongFocus` when polished (their default,
    `WheelFocus`, lets the first wheel event focus them, and the field is then "focused"),
    and an unfocused one's wheel event is handed to the nearest scroll area's viewport.
    Handing it on by hand, not by ignoring it: Qt 6 propagates only spontaneous wheel events
    to the parent, and a scroll bar or a test sends synthetic ones. Scroll bars are sliders
    too, but never guarded: they are the page's own scrolling.
    """

    def eventFilter(self, watched: QtCore.QObject, event: QtCore.QEvent) -> bool:
        kind = event.type()
        if kind == QtCore.QEvent.Type.Polish and _guarded(watched):
            watched.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # type: ignore[attr-defined]
        elif (kind == QtCore.QEvent.Type.Wheel and isinstance(event, QtGui.QWheelEvent)
              and _guarded(watched) and not watched.hasFocus()):  # type: ignore[attr-defined]
            _scroll_page(watched, event)  # type: ignore[arg-type]
            return True
        return False


def _guarded(obj: QtCore.QObject) -> bool:
    return isinstance(obj, WHEEL_GUARDED) and not isinstance(obj, QtWidgets.QScrollBar)


def _scroll_page(widget: QtWidgets.QWidget, event: QtGui.QWheelEvent) -> None:
    """Send `event` to the viewport of the scroll area around `widget`, if there is one."""
    parent = widget.parentWidget()
    while parent is not None and not isinstance(parent, QtWidgets.QAbstractScrollArea):
        parent = parent.parentWidget()
    if parent is None:
        return
    viewport = parent.viewport()
    global_pos = event.globalPosition()
    local = QtCore.QPointF(viewport.mapFromGlobal(global_pos.toPoint()))
    copy = QtGui.QWheelEvent(local, global_pos, event.pixelDelta(), event.angleDelta(),
                             event.buttons(), event.modifiers(), event.phase(), event.inverted())
    QtCore.QCoreApplication.sendEvent(viewport, copy)
