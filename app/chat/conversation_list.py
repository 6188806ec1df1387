"""The conversation list: a lazily paged Qt model over `ChatStore` and its pane (search, new,
rename in place, delete, export).

The model reads `PAGE` summaries at a time (`canFetchMore`/`fetchMore`), so hundreds of
chats cost one small query until the user scrolls. A search re-queries the store (titles and
message text) instead of filtering in memory.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from app.chat.store import ChatStore, ConversationSummary
from app.qt import Qt, QtCore, QtGui, QtWidgets, Signal

PAGE = 100
ID_ROLE = Qt.ItemDataRole.UserRole + 1
# What Qt's model API hands an override: a view may pass either kind of index.
Index = QtCore.QModelIndex | QtCore.QPersistentModelIndex


class ConversationListModel(QtCore.QAbstractListModel):
    """Signals:
        renamed(int, str): the user edited a title in place.
    """

    renamed = Signal(int, str)

    def __init__(self, store: ChatStore, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._store = store
        self._rows: list[ConversationSummary] = []
        self._query = ""
        self._exhausted = False

    # -- Qt model API ------------------------------------------------------------------

    def rowCount(self, parent: Index = QtCore.QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self._rows):
            return None
        row = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return row.title
        if role == ID_ROLE:
            return row.id
        if role == Qt.ItemDataRole.ToolTipRole:
            when = _dt.datetime.fromtimestamp(row.updated).strftime("%Y-%m-%d %H:%M")
            return f"{row.title}\nlast message {when}"
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        base = super().flags(index)
        return base | Qt.ItemFlag.ItemIsEditable if index.isValid() else base

    def setData(self, index: Index, value: Any,
                role: int = Qt.ItemDataRole.EditRole) -> bool:
        if role != Qt.ItemDataRole.EditRole or not index.isValid() or not str(value).strip():
            return False
        row = self._rows[index.row()]
        self.renamed.emit(row.id, str(value))
        return True

    def canFetchMore(self, parent: Index = QtCore.QModelIndex()) -> bool:  # noqa: B008
        return not parent.isValid() and not self._exhausted

    def fetchMore(self, parent: Index = QtCore.QModelIndex()) -> None:  # noqa: B008
        if parent.isValid() or self._exhausted:
            return
        page = self._store.list_conversations(len(self._rows), PAGE, self._query)
        if len(page) < PAGE:
            self._exhausted = True
        if page:
            self.beginInsertRows(QtCore.QModelIndex(), len(self._rows), len(self._rows) + len(page) - 1)
            self._rows.extend(page)
            self.endInsertRows()

    # -- ours --------------------------------------------------------------------------

    def set_query(self, query: str) -> None:
        self._query = query.strip()
        self.reload()

    def reload(self) -> None:
        """Re-read from the first page (after a change), keeping as many rows as were loaded."""
        wanted = max(PAGE, len(self._rows))
        self.beginResetModel()
        self._rows = self._store.list_conversations(0, wanted, self._query)
        self._exhausted = len(self._rows) < wanted
        self.endResetModel()

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, r in enumerate(self._rows) if r.id == conversation_id), -1)

    def id_at(self, row: int) -> int:
        return self._rows[row].id


class ConversationPane(QtWidgets.QWidget):
    """Search box, New chat, and the list.

    Signals:
        open_requested(int), delete_requested(int), export_requested(int), new_requested()
    """

    open_requested = Signal(int)
    delete_requested = Signal(int)
    export_requested = Signal(int)
    new_requested = Signal()

    def __init__(self, model: ConversationListModel, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversationPane")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.model = model
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(8, 10, 8, 8)
        layout.setSpacing(8)
        self.new_button = QtWidgets.QPushButton("New chat")
        self.new_button.setObjectName("primary")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)
        self.search = QtWidgets.QLineEdit()
        self.search.setPlaceholderText("Search chats  (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QtCore.QTimer(self, singleShot=True, interval=150)
        self._search_timer.timeout.connect(lambda: model.set_query(self.search.text()))
        self.search.textChanged.connect(lambda _: self._search_timer.start())
        layout.addWidget(self.search)
        self.view = QtWidgets.QListView()
        self.view.setObjectName("conversationList")
        self.view.setModel(model)
        self.view.setUniformItemSizes(True)
        self.view.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.EditKeyPressed
                                  | QtWidgets.QAbstractItemView.EditTrigger.DoubleClicked)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._on_menu)
        self.view.clicked.connect(lambda index: self.open_requested.emit(index.data(ID_ROLE)))
        self.view.activated.connect(lambda index: self.open_requested.emit(index.data(ID_ROLE)))
        delete = QtGui.QShortcut(QtGui.QKeySequence.StandardKey.Delete, self.view)
        delete.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete.activated.connect(self._delete_current)
        layout.addWidget(self.view, 1)

    def select(self, conversation_id: int | None) -> None:
        row = self.model.row_of(conversation_id) if conversation_id is not None else -1
        selection = self.view.selectionModel()
        if row < 0:
            selection.clearSelection()
            return
        index = self.model.index(row)
        selection.setCurrentIndex(index, QtCore.QItemSelectionModel.SelectionFlag.ClearAndSelect)

    def _delete_current(self) -> None:
        index = self.view.currentIndex()
        if index.isValid():
            self.delete_requested.emit(index.data(ID_ROLE))

    def _on_menu(self, pos: QtCore.QPoint) -> None:
        index = self.view.indexAt(pos)
        if not index.isValid():
            return
        conversation_id = index.data(ID_ROLE)
        menu = QtWidgets.QMenu(self)
        menu.addAction("Rename", lambda: self.view.edit(index))
        menu.addAction("Export…", lambda: self.export_requested.emit(conversation_id))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete_requested.emit(conversation_id))
        menu.popup(self.view.viewport().mapToGlobal(pos))
