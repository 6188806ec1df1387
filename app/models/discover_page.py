"""Discover: search the Hugging Face Hub for GGUF repositories as you type.

Before any search it shows the curated catalogue's picks for this machine (the models whose
memory tier fits the memory free now). Typing searches after a pause (a single-shot QTimer
restarted on each key); answers to older searches that arrive late are dropped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.models.hub_notice import HubNotice
from app.qt import Qt, QtCore, QtWidgets, Signal
from app.services.models import ModelServices
from app.services.outcome import on_result
from app.widgets import cell, read_only_table
from runtime.hub.catalog import CatalogModel, load_catalog
from runtime.hub.client import RepoSummary
from runtime.units import fmt_bytes

SORTS = (("Most downloaded", "downloads"), ("Most liked", "likes"), ("Recently updated", "recent"))
RESULT_COLUMNS = ("Repository", "Downloads", "Likes", "Updated", "Access")
PICK_COLUMNS = ("Model", "Parameters", "Needs", "Quant", "Repository", "License", "Role")


def recommendations(free_bytes: int) -> list[CatalogModel]:
    """The catalogue's chat and code models that fit in `free_bytes` (on a worker thread)."""
    catalog = load_catalog()
    return [m for m in catalog.for_memory(free_bytes) if m.role in ("chat", "code")]


class DiscoverPage(QtWidgets.QWidget):
    """Signals:
        repo_activated(str): the user opened a repository (a search hit or a pick).
        settings_requested(): the user wants Settings → App (the Hub mirror), after a search
            could not reach the Hub.
    """

    repo_activated = Signal(str)
    settings_requested = Signal()

    def __init__(self, services: ModelServices, *, debounce_ms: int = 350, limit: int = 50,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.limit = limit
        self._generation = 0
        self._hits: list[RepoSummary] = []
        self._showing_picks = True  # no search asked for: the status line is the picks' note

        self.search = QtWidgets.QLineEdit()
        self.search.setObjectName("search")
        self.search.setPlaceholderText(
            "Search GGUF models on Hugging Face (e.g. qwen2.5 7b instruct)")
        self.search.setClearButtonEnabled(True)
        self.sort = QtWidgets.QComboBox()
        for label, key in SORTS:
            self.sort.addItem(label, key)
        self.author = QtWidgets.QLineEdit()
        self.author.setPlaceholderText("Author (e.g. bartowski)")
        self.author.setMaximumWidth(180)
        self.hide_gated = QtWidgets.QCheckBox("Hide gated")
        bar = QtWidgets.QHBoxLayout()
        bar.addWidget(self.search, 1)
        bar.addWidget(self.author)
        bar.addWidget(self.sort)
        bar.addWidget(self.hide_gated)

        self.status = QtWidgets.QLabel()
        self.status.setObjectName("muted")
        self.status.setWordWrap(True)
        self.notice = HubNotice()
        self.notice.retry_clicked.connect(self.run_search)
        self.notice.settings_requested.connect(self.settings_requested)
        self.results = read_only_table(RESULT_COLUMNS, stretch=0)  # Repository
        self.picks = read_only_table(PICK_COLUMNS, stretch=4)  # Repository
        self.stack = QtWidgets.QStackedWidget()
        self.stack.addWidget(self.picks)
        self.stack.addWidget(self.results)

        layout = QtWidgets.QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(self.status)
        layout.addWidget(self.notice)
        layout.addWidget(self.stack, 1)

        self.timer = QtCore.QTimer(self, singleShot=True, interval=debounce_ms)
        self.timer.timeout.connect(self.run_search)
        self.search.textChanged.connect(self._on_edited)
        self.author.textChanged.connect(self._on_edited)
        self.sort.currentIndexChanged.connect(self._on_edited)
        self.hide_gated.toggled.connect(self._show_hits)
        self.results.cellActivated.connect(self._on_result_activated)
        self.picks.cellActivated.connect(self._on_pick_activated)
        self._load_picks()

    # -- searching -----------------------------------------------------------------------

    def _on_edited(self, *_: Any) -> None:
        self.timer.start()  # restarts: only a pause in typing searches

    def run_search(self) -> None:
        """Search now with the current text, sort and author (the timer calls this)."""
        self.timer.stop()
        self.notice.hide()
        text, author = self.search.text().strip(), self.author.text().strip() or None
        self._generation += 1
        self._showing_picks = not text and author is None
        if self._showing_picks:
            self.stack.setCurrentWidget(self.picks)
            self.status.setText(self._picks_note)
            return
        generation, hub = self._generation, self.services.hub
        sort = self.sort.currentData()
        self.status.setText(f"Searching for “{text or author}”…")
        job = self.services.on_net(lambda: hub.search(text, sort=sort, author=author,
                                                      limit=self.limit))
        on_result(job, self, lambda hits: self._on_hits(generation, hits),
                  lambda exc: self._on_search_failed(generation, exc))

    def _on_hits(self, generation: int, hits: list[RepoSummary]) -> None:
        if generation != self._generation:
            return  # an older search answered late
        self._hits = list(hits)
        self.stack.setCurrentWidget(self.results)
        self._show_hits()

    def _on_search_failed(self, generation: int, exc: object) -> None:
        if generation == self._generation:
            self.status.setText("")
            self.notice.show_error(exc, "Search")

    def _show_hits(self, *_: Any) -> None:
        hits = [h for h in self._hits if not (self.hide_gated.isChecked() and h.gated)]
        self.results.setRowCount(len(hits))
        for row, hit in enumerate(hits):
            _set(self.results, row, 0, hit.repo_id, hit.repo_id)
            _set(self.results, row, 1, f"{hit.downloads:,}", hit.downloads)
            _set(self.results, row, 2, f"{hit.likes:,}", hit.likes)
            _set(self.results, row, 3, _date(hit.last_modified), hit.last_modified)
            _set(self.results, row, 4, "Gated: needs a token" if hit.gated else "Open")
        hidden = len(self._hits) - len(hits)
        note = f" ({hidden} gated hidden)" if hidden else ""
        self.status.setText(f"{len(hits)} repositories{note}. Double-click one to see its quants."
                            if hits else f"No GGUF repositories found{note}.")

    def hit_ids(self) -> list[str]:
        """The repository ids shown, top to bottom."""
        return [cell(self.results, r, 0).text() for r in range(self.results.rowCount())]

    def _on_result_activated(self, row: int, _column: int) -> None:
        self.repo_activated.emit(cell(self.results, row, 0).text())

    # -- the catalogue's picks -----------------------------------------------------------

    _picks_note = "Picks for this machine from Outrider's catalogue:"

    def _load_picks(self) -> None:
        devices = self.services.devices

        def work() -> tuple[int, list[CatalogModel]]:
            free = max((d.free_bytes for d in devices()), default=0)
            return free, recommendations(free)

        job = self.services.on_disk(work)
        on_result(job, self, self._on_picks,
                  lambda exc: self.status.setText(f"The catalogue could not be read: {exc}"))

    def _on_picks(self, result: tuple[int, list[CatalogModel]]) -> None:
        free, picks = result
        self._picks_note = (f"Picks for this machine ({fmt_bytes(free)} free now) from Outrider's "
                            "catalogue — or search above.")
        if self._showing_picks:
            self.status.setText(self._picks_note)
        self.picks.setRowCount(len(picks))
        for row, m in enumerate(picks):
            _set(self.picks, row, 0, m.name, m.repo)
            cell(self.picks, row, 0).setToolTip(m.notes or m.name)
            _set(self.picks, row, 1, f"{m.params_b:g}B", m.params_b)
            _set(self.picks, row, 2, f"{m.tier_gb:g} GB", m.tier_gb)
            _set(self.picks, row, 3, m.default_quant)
            _set(self.picks, row, 4, m.repo)
            _set(self.picks, row, 5, m.license)
            _set(self.picks, row, 6, m.role)

    def pick_repos(self) -> list[str]:
        return [cell(self.picks, r, 4).text() for r in range(self.picks.rowCount())]

    def _on_pick_activated(self, row: int, _column: int) -> None:
        self.repo_activated.emit(cell(self.picks, row, 4).text())


def _set(table: QtWidgets.QTableWidget, row: int, column: int, text: str,
         value: object = None) -> None:
    item = QtWidgets.QTableWidgetItem(text)
    item.setData(Qt.ItemDataRole.UserRole, value if value is not None else text)
    table.setItem(row, column, item)


def _date(when: datetime | None) -> str:
    return when.strftime("%Y-%m-%d") if when else "?"
