"""The Server page's "Resident models" tab: every model the server holds, its state, memory,
idle time and idle unload, with an Unload button each.

It asks `GET /api/status` (its `resident` field, parsed by `app.server.resident`) every
`STATUS_POLL_MS` while the page shows (`start_polling` / `stop_polling`) and whenever the page
says the engine changed (`refresh`); one question at a time. Unload posts `/api/unload
{"model": name}` through the engine client and asks again when the answer comes.

Signals:
    models_changed(tuple[ResidentModel, ...]): the list differs from the last one shown.
"""

from __future__ import annotations

import json

from app.engine.client import EngineClient
from app.engine.wire import parse_error_body
from app.qt import QtCore, QtNetwork, QtWidgets, Signal
from app.server.resident import ResidentModel, parse_resident
from app.widgets import muted_label, read_only_table

STATUS_POLL_MS = 3000  # idle times tick; memory moves while a model loads
COLUMNS = ("Model", "State", "Planned", "In use", "Idle", "Unloads", "")
TIPS = {
    "Planned": "The memory the plan gave this model (weights, KV cache, compute buffers)",
    "In use": "The memory its engine process uses now (resident set)",
    "Idle": "Time since its last request, or the requests it is answering",
    "Unloads": "When the server unloads it for being idle (its TTL)",
}
NAME, STATE, PLANNED, RSS, IDLE, TTL, ACTION = range(len(COLUMNS))
NOT_RUNNING = "The engine is not running."
_HTTP_STATUS = QtNetwork.QNetworkRequest.Attribute.HttpStatusCodeAttribute
_NO_ERROR = QtNetwork.QNetworkReply.NetworkError.NoError


class ResidentPanel(QtWidgets.QWidget):
    """Attributes: table (a row per model, in the server's order), note_label (an empty
    list, the engine stopped, what the last Unload came to), models (what the table shows)."""

    models_changed = Signal(object)

    def __init__(self, client: EngineClient, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._client = client
        self.models: tuple[ResidentModel, ...] = ()
        self._note = ""  # what the last Unload came to, until the next one
        self._status_reply: QtNetwork.QNetworkReply | None = None
        self._ask_again = False  # something changed while an answer was on its way
        self._unloads: list[tuple[QtNetwork.QNetworkReply, str]] = []
        self._timer = QtCore.QTimer(self, interval=STATUS_POLL_MS)
        self._timer.timeout.connect(self.refresh)
        column = QtWidgets.QVBoxLayout(self)
        column.setContentsMargins(12, 10, 12, 10)
        column.setSpacing(8)
        column.addWidget(muted_label(
            "Each model runs in its own engine process. A request that names another model "
            "loads it beside these if it fits; idle ones are unloaded after their time."))
        self.table = read_only_table(COLUMNS, stretch=NAME, tips=TIPS)
        self.table.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.NoSelection)
        column.addWidget(self.table, 1)
        self.note_label = muted_label()
        column.addWidget(self.note_label)
        self.show_models((), NOT_RUNNING)

    # -- asking the engine -------------------------------------------------------------

    def start_polling(self) -> None:
        self.refresh()
        self._timer.start()

    def stop_polling(self) -> None:
        self._timer.stop()

    def refresh(self) -> None:
        """Ask the engine for its resident models; the answer fills the table."""
        if self._status_reply is not None:
            self._ask_again = True
            return
        reply = self._client.fetch_status() if self._client.state.running else None
        if reply is None:
            self.show_models((), NOT_RUNNING)
            return
        self._status_reply = reply
        reply.finished.connect(self._on_status_finished)

    def _on_status_finished(self) -> None:
        reply, self._status_reply = self._status_reply, None
        if reply is None:
            return
        body, status = bytes(reply.readAll().data()), _status_of(reply)
        if reply.error() != _NO_ERROR or status >= 400:
            message = parse_error_body(body, status).message if status else reply.errorString()
            self.show_models(self.models, f"Could not ask the engine: {message}")
        else:
            try:
                answer = json.loads(body or b"{}")
            except ValueError:
                answer = {}
            self.show_models(parse_resident(answer), self._note)
        reply.deleteLater()
        if self._ask_again:
            self._ask_again = False
            self.refresh()

    def _on_unload(self, row: int) -> None:
        if row >= len(self.models):
            return
        model = self.models[row]
        reply = self._client.unload_model(model.name, default=model.default)
        if reply is None:
            self.show_models((), NOT_RUNNING)
            return
        self._note = f"Unloading {model.name}…"
        self._show_note(self._note)
        self._unloads.append((reply, model.name))
        reply.finished.connect(self._on_unload_finished)

    def _on_unload_finished(self) -> None:
        done = [(reply, name) for reply, name in self._unloads if reply.isFinished()]
        self._unloads = [pair for pair in self._unloads if not pair[0].isFinished()]
        for reply, name in done:
            status = _status_of(reply)
            if reply.error() != _NO_ERROR or status >= 400:
                body = bytes(reply.readAll().data())
                message = parse_error_body(body, status).message if status else reply.errorString()
                self._note = f"Could not unload {name}: {message}"
            else:
                self._note = f"Unloaded {name}."
            reply.deleteLater()
        self.refresh()

    # -- the table ---------------------------------------------------------------------

    def show_models(self, models: tuple[ResidentModel, ...], note: str = "") -> None:
        """List `models`, with `note` under the table (an empty list says so itself)."""
        same_rows = [m.name for m in models] == [m.name for m in self.models]
        changed = models != self.models
        self.models = models
        self.table.setRowCount(len(models))
        for row, model in enumerate(models):
            name = model.name + ("  (default)" if model.default else "")
            self._set(row, NAME, name, f"{model.path}\nprocess {model.pid or '–'}"
                      + ("\nThe chat's model: requests that name no model go to it"
                         if model.default else ""))
            self._set(row, STATE, model.state)
            self._set(row, PLANNED, model.planned_text)
            self._set(row, RSS, model.rss_text)
            self._set(row, IDLE, model.idle_text)
            self._set(row, TTL, model.ttl_text)
            if not same_rows or self.table.cellWidget(row, ACTION) is None:
                # Kept across refreshes (every few seconds): a press is never lost to one.
                button = QtWidgets.QPushButton("Unload")
                button.setToolTip(f"Unload {model.name} and free its memory")
                button.clicked.connect(lambda _=False, r=row: self._on_unload(r))
                holder = QtWidgets.QWidget()  # a margin, so the row's grid never cuts the button
                layout = QtWidgets.QHBoxLayout(holder)
                layout.setContentsMargins(3, 2, 3, 2)
                layout.addWidget(button)
                self.table.setCellWidget(row, ACTION, holder)
        self.table.resizeRowsToContents()
        if not models and not note:
            note = ("No model is resident: load one on the Chat or Models page, or send a "
                    "request that names one.")
        self._show_note(note)
        if changed:
            self.models_changed.emit(models)

    def unload_button(self, row: int) -> QtWidgets.QPushButton:
        holder = self.table.cellWidget(row, ACTION)
        button = holder.findChild(QtWidgets.QPushButton) if holder is not None else None
        if not isinstance(button, QtWidgets.QPushButton):
            raise LookupError(f"no Unload button in row {row}")
        return button

    def _show_note(self, note: str) -> None:
        self.note_label.setText(note)
        self.note_label.setVisible(bool(note))

    def _set(self, row: int, column: int, text: str, tip: str = "") -> None:
        item = QtWidgets.QTableWidgetItem(text)
        if tip:
            item.setToolTip(tip)
        self.table.setItem(row, column, item)


def _status_of(reply: QtNetwork.QNetworkReply) -> int:
    value = reply.attribute(_HTTP_STATUS)
    return int(value) if value is not None else 0
