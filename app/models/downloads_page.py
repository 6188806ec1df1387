"""Downloads: the queue of the DownloadManager, live — progress, rate, time left, and the buttons
that fit each state (pause, resume, cancel, retry, remove). A failure is explained in words
with what to do about it (`app.services.download_advice`, shared with Settings → Model).
What a job left in the downloads folder (a partial file, a copy kept aside after a failed
check: `job.leftover` bytes) gets "Delete files", which frees the space and keeps the job for
a retry. When the queue file cannot be saved (a full disk), a line above the table says so
until a later save catches up.

The queue itself is the manager's (`downloads/queue.json`), so it survives a restart: this
page shows whatever the manager holds when it opens, then follows its events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.qt import Qt, QtWidgets, Signal
from app.services.download_advice import explain
from app.services.models import ModelServices
from app.services.outcome import on_result
from app.token_dialog import TokenPrompt, ask_token
from app.widgets import cell, read_only_table
from runtime.downloads.manager import (
    DownloadJob,
    DownloadNotice,
    DownloadProgress,
    DownloadStateChanged,
    QueueSaveChanged,
)
from runtime.units import fmt_bytes, fmt_duration

COLUMNS = ("File", "Repository", "Progress", "Speed", "Time left", "Status", "Actions")
STATE_TEXT = {"queued": "Queued", "running": "Downloading", "paused": "Paused", "done": "Done",
              "failed": "Failed", "cancelled": "Cancelled"}
ACTIONS = {  # state → the buttons offered
    "queued": ("pause", "cancel"),
    "running": ("pause", "cancel"),
    "paused": ("resume", "cancel"),
    "failed": ("retry", "token", "delete", "remove"),
    "cancelled": ("retry", "delete", "remove"),
    "done": ("delete", "remove"),
}
LABELS = {"pause": "Pause", "resume": "Resume", "cancel": "Cancel", "retry": "Retry",
          "remove": "Remove", "token": "Enter token…", "delete": "Delete files"}

class DownloadsPage(QtWidgets.QWidget):
    """Signals:
        finished(object): a DownloadJob reached "done" (its file is in the library).
        count_changed(int): how many downloads are active (queued, running or paused).
    """

    finished = Signal(object)
    count_changed = Signal(int)

    def __init__(self, services: ModelServices, *, ask_token: TokenPrompt = ask_token,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.ask_token = ask_token
        self.jobs: dict[str, DownloadJob] = {}
        self._rows: dict[str, int] = {}
        self.table = read_only_table(COLUMNS, stretch=0)  # File
        # File and Repository share what the other columns leave, the progress bar is as
        # wide as its longest text and Status capped: sized to their contents, a long status
        # and the bar left the file name "s…" behind a horizontal scroll bar. Long names are
        # cut in the middle ("Qwen2.5-Co…Q4_K_M.gguf" keeps the quant); Status's tooltip
        # says it whole.
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(1, QtWidgets.QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QtWidgets.QHeaderView.ResizeMode.Fixed)
        header.setSectionResizeMode(5, QtWidgets.QHeaderView.ResizeMode.Interactive)
        self.table.setColumnWidth(
            2, self.table.fontMetrics().horizontalAdvance("100% of 999.99 GiB") + 32)
        self.table.setColumnWidth(5, 120)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.details = QtWidgets.QLabel()
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.empty = QtWidgets.QLabel("No downloads. Open a repository in Discover and press "
                                      "Download on a quant.")
        self.empty.setObjectName("muted")
        self.queue_problem = QtWidgets.QLabel()  # the queue file could not be saved
        self.queue_problem.setWordWrap(True)
        self.queue_problem.hide()
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(self.queue_problem)
        layout.addWidget(self.empty)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.details)
        self.table.itemSelectionChanged.connect(self._show_details)
        services.download_event.connect(self.on_event)
        self.reload()

    def reload(self) -> None:
        """Read the manager's queue (off the GUI thread) and show it."""
        job = self.services.on_disk(self.services.downloads.jobs)
        on_result(job, self, self._on_jobs)

    def _on_jobs(self, jobs: list[DownloadJob]) -> None:
        for job in jobs:
            # A job already seen in an event is newer there than in this snapshot.
            if job.id not in self.jobs:
                self._put(job)

    # -- events --------------------------------------------------------------------------

    def on_event(self, event: object) -> None:
        if isinstance(event, DownloadStateChanged):
            old = self.jobs.get(event.job.id)
            self._put(event.job)
            if event.job.state == "done" and (old is None or old.state != "done"):
                self.finished.emit(event.job)
        elif isinstance(event, DownloadProgress):
            self._progress(event)
        elif isinstance(event, DownloadNotice):
            row = self._rows.get(event.job_id)
            if row is not None:
                cell(self.table, row, 5).setToolTip(event.message)
                self.details.setText(event.message)
        elif isinstance(event, QueueSaveChanged):
            self.queue_problem.setText(f"The download queue is not saved: {event.problem}"
                                       if event.problem else "")
            self.queue_problem.setVisible(event.problem is not None)

    def _put(self, job: DownloadJob) -> None:
        row = self._rows.get(job.id)
        if row is None:
            row = self.table.rowCount()
            self.table.insertRow(row)
            self._rows[job.id] = row
            self.table.setItem(row, 0, QtWidgets.QTableWidgetItem(job.filename))
            self.table.setItem(row, 1, QtWidgets.QTableWidgetItem(job.repo_id))
            bar = QtWidgets.QProgressBar()
            bar.setObjectName(f"progress:{job.id}")
            self.table.setCellWidget(row, 2, bar)
            for col in (3, 4, 5):
                self.table.setItem(row, col, QtWidgets.QTableWidgetItem(""))
        self.jobs[job.id] = job
        total = job.size or 0
        done = total if job.state == "done" else job.received
        self._set_bar(row, done, total)
        status = STATE_TEXT.get(job.state, job.state)
        if job.elsewhere:  # another Outrider process (say `outrider pull`) owns this one
            status = "Downloading in another Outrider process"
        elif job.state == "failed":
            status = f"Failed: {job.error or job.error_kind}"
        item = cell(self.table, row, 5)
        item.setText(status)
        item.setToolTip(explain(job) or status)
        if job.state != "running":
            cell(self.table, row, 3).setText("")
            cell(self.table, row, 4).setText("")
        self.table.setCellWidget(row, 6, self._buttons(job))
        self._show_details()
        self.empty.setVisible(not self.jobs)
        self.count_changed.emit(sum(j.state in ("queued", "running", "paused")
                                    for j in self.jobs.values()))

    def _progress(self, event: DownloadProgress) -> None:
        row = self._rows.get(event.job_id)
        if row is None:
            return
        self._set_bar(row, event.received, event.total or 0)
        cell(self.table, row, 3).setText(f"{fmt_bytes(event.rate)}/s" if event.rate else "")
        cell(self.table, row, 4).setText("" if event.eta_s is None else fmt_duration(event.eta_s))

    def _set_bar(self, row: int, received: int, total: int) -> None:
        bar = self.table.cellWidget(row, 2)
        if not isinstance(bar, QtWidgets.QProgressBar):
            return
        # QProgressBar holds ints: show KiB so multi-GB files stay in range.
        bar.setRange(0, max(total // 1024, 1) if total else 0)
        bar.setValue(min(received // 1024, bar.maximum()) if total else 0)
        bar.setFormat(f"%p% of {fmt_bytes(total)}" if total else fmt_bytes(received))

    # -- actions -------------------------------------------------------------------------

    def _buttons(self, job: DownloadJob) -> QtWidgets.QWidget:
        box = QtWidgets.QWidget()
        row = QtWidgets.QHBoxLayout(box)
        row.setContentsMargins(2, 0, 2, 0)
        for action in () if job.elsewhere else ACTIONS.get(job.state, ()):
            if (action == "token" and not job.needs_token) or (action == "delete"
                                                                and not job.leftover):
                continue
            button = QtWidgets.QPushButton(LABELS[action])
            button.setObjectName(f"{action}:{job.id}")
            if action == "delete":
                button.setToolTip(f"Delete the {fmt_bytes(job.leftover)} this download left in "
                                  "the downloads folder (a partial file, a copy that failed its "
                                  "check); Retry fetches the file from the start")
            button.clicked.connect(lambda _=False, a=action, j=job.id: self.act(a, j))
            row.addWidget(button)
        return box

    def button(self, job_id: str, action: str) -> QtWidgets.QPushButton | None:
        return self.findChild(QtWidgets.QPushButton, f"{action}:{job_id}")

    def act(self, action: str, job_id: str) -> None:
        """Do `action` (pause, resume, cancel, retry, remove, token, delete) on a job."""
        manager = self.services.downloads
        if action == "token":
            job = self.jobs[job_id]
            token = self.ask_token(self, job.repo_id)
            if not token:
                return
            self.services.settings.set_token(token)  # the services pass it to the manager
            action = "retry"
        calls: dict[str, Callable[[str], Any]] = {
            "pause": manager.pause, "resume": manager.resume, "cancel": manager.cancel,
            "retry": manager.retry, "remove": manager.remove, "delete": manager.delete_files}
        work = self.services.on_disk(calls[action], job_id)
        done: dict[str, Callable[[Any], None]] = {
            "remove": lambda _r: self._forget(job_id),
            "delete": lambda freed: self.details.setText(f"Deleted {fmt_bytes(freed)}.")}
        on_result(work, self, done.get(action),
                  lambda exc: self.details.setText(f"{LABELS[action]} failed: {exc}"))

    def _forget(self, job_id: str) -> None:
        row = self._rows.pop(job_id, None)
        self.jobs.pop(job_id, None)
        if row is None:
            return
        self.table.removeRow(row)
        self._rows = {j: (r - 1 if r > row else r) for j, r in self._rows.items()}
        self.empty.setVisible(not self.jobs)

    def _show_details(self) -> None:
        rows = {i.row() for i in self.table.selectedItems()}
        failed = [j for j in self.jobs.values() if j.state == "failed"]
        chosen = [j for j, r in self._rows.items() if r in rows]
        job = self.jobs[chosen[0]] if chosen else (failed[-1] if failed else None)
        self.details.setText(explain(job) if job is not None else "")

    def state_of(self, job_id: str) -> str:
        return self.jobs[job_id].state

    def progress_of(self, job_id: str) -> tuple[int, int]:
        """(value, maximum) of the job's progress bar, in KiB."""
        bar = self.findChild(QtWidgets.QProgressBar, f"progress:{job_id}")
        return (bar.value(), bar.maximum()) if bar is not None else (0, 0)
