"""The Workers field of Settings → Model: other machines that lend their devices over
llama.cpp's RPC (`outrider worker` there, or its Server page's "Lend this machine"), as
host:port entries on one line, checked when asked.

    field = WorkersField()
    field.set_endpoints(("10.0.0.2:50052",))
    field.edited.connect(replan)                    # the user typed (valid or not)
    field.endpoints()                               # ('10.0.0.2:50052',); SettingsError if not
    field.check_requested.connect(start_check)      # Check, with the endpoints to probe
    field.show_checks(check_workers(endpoints))     # probed on the network thread, shown here
    field.checked_devices(endpoints)                # the answering workers' devices, to plan

Entries are validated as typed, by the load settings' own rules (`worker_endpoint`: the port
defaults to 50052; a worker named twice is refused), and the message is one line under the
field. Workers are probed only on Check, never per keystroke: one that does not answer takes
the probe's timeout (3 s), and one already lending itself to an engine answers nobody else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.qt import QtWidgets, Signal
from runtime.errors import SettingsError
from runtime.planner.devices import Device
from runtime.planner.workers import PROBE_TIMEOUT_S, WorkerInfo, probe_worker
from runtime.settings.load import LoadSettings
from runtime.units import fmt_bytes

PLACEHOLDER = "none: this machine alone (e.g. 192.168.1.20:50052, 192.168.1.21)"


@dataclass(frozen=True)
class WorkerCheck:
    """One worker as the last Check found it: what it offers, or why it cannot serve."""

    endpoint: str
    info: WorkerInfo | None = None
    error: str = ""

    @property
    def devices(self) -> tuple[Device, ...]:
        return self.info.devices if self.info is not None else ()


def parse_endpoints(text: str) -> tuple[str, ...]:
    """The workers of a comma-separated line, normalised (SettingsError, one line, if one is
    not host:port or one is named twice). The load settings own the rules, so the field
    refuses exactly what a load would.

        >>> parse_endpoints(" Box.local, 10.0.0.2:7000 ,")
        ('box.local:50052', '10.0.0.2:7000')
    """
    entries = tuple(part.strip() for part in text.split(",") if part.strip())
    return LoadSettings(model_path=Path("workers.gguf"), workers=entries).workers


def check_workers(endpoints: Sequence[str],
                  timeout_s: float = PROBE_TIMEOUT_S) -> list[WorkerCheck]:
    """Probe each worker in turn (network: off the GUI thread). Each on its own, unlike
    `probe_workers`, which stops at the first that cannot serve: the field says something
    for every entry."""
    checks = []
    for endpoint in endpoints:
        try:
            checks.append(WorkerCheck(endpoint, probe_worker(endpoint, timeout_s)))
        except SettingsError as exc:  # WorkerError: its one line names the worker
            checks.append(WorkerCheck(endpoint, error=str(exc)))
    return checks


def check_text(check: WorkerCheck) -> str:
    """One line per worker: its devices' free memory, or its error (which names it).

        >>> check_text(WorkerCheck("10.0.0.2:50052", WorkerInfo("10.0.0.2:50052", (7, 0, 0),
        ...     (Device("rpc:10.0.0.2:50052", "worker 10.0.0.2:50052", "rpc", 8 << 30, 6 << 30),))))
        'worker 10.0.0.2:50052: 6.00 GiB free of 8.00 GiB'
    """
    if check.info is None:
        return check.error
    return " · ".join(f"{d.name}: {fmt_bytes(d.free_bytes)} free of {fmt_bytes(d.total_bytes)}"
                      for d in check.devices)


class WorkersField(QtWidgets.QWidget):
    """Signals:
        edited(): the user changed the entries (not emitted by `set_endpoints`).
        check_requested(tuple[str, ...]): Check, with the (valid) endpoints to probe.

    Attributes:
        line: the entries. check_button: Check. error: the one-line message of an invalid
        entry (hidden while valid). results: the last Check's line per worker listed.
    """

    edited = Signal()
    check_requested = Signal(object)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._checks: dict[str, WorkerCheck] = {}
        self._checking = False
        self.line = QtWidgets.QLineEdit()
        self.line.setObjectName("workers")
        self.line.setPlaceholderText(PLACEHOLDER)
        self.line.setClearButtonEnabled(True)
        self.check_button = QtWidgets.QPushButton("Check")
        self.check_button.setToolTip("Ask each worker what it offers (free memory) and plan "
                                     "with its devices")
        self.error = QtWidgets.QLabel()
        self.error.setObjectName("replyError")
        self.error.hide()
        self.results = QtWidgets.QLabel()
        self.results.setObjectName("muted")
        self.results.setWordWrap(True)
        row = QtWidgets.QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.line, 1)
        row.addWidget(self.check_button)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(row)
        layout.addWidget(self.error)
        layout.addWidget(self.results)
        self.line.textEdited.connect(self._on_text_edited)
        self.check_button.clicked.connect(self._on_check)
        self._update()

    # -- the entries -----------------------------------------------------------------------

    def set_endpoints(self, endpoints: Sequence[str]) -> None:
        self.line.setText(", ".join(endpoints))
        self._update()

    def endpoints(self) -> tuple[str, ...]:
        """The workers listed, normalised; SettingsError while an entry is refused."""
        return parse_endpoints(self.line.text())

    @property
    def problem(self) -> str:
        """Why the entries are refused ("" when they are fine)."""
        try:
            self.endpoints()
        except SettingsError as exc:
            return str(exc)
        return ""

    # -- checking ----------------------------------------------------------------------------

    def set_checking(self, checking: bool) -> None:
        """A Check is under way (its button waits) or done."""
        self._checking = checking
        self._update()

    def show_checks(self, checks: Sequence[WorkerCheck]) -> None:
        """The outcome of a Check: each worker's devices or error, kept until the next one."""
        self._checking = False
        self._checks.update({c.endpoint: c for c in checks})
        self._update()

    def checked_devices(self, endpoints: Sequence[str]) -> list[Device]:
        """The devices of those `endpoints` that answered the last Check, in their order (the
        order llama.cpp puts RPC devices in: first, as given)."""
        return [d for e in endpoints for d in self._checks.get(e, WorkerCheck(e)).devices]

    def check_of(self, endpoint: str) -> WorkerCheck | None:
        return self._checks.get(endpoint)

    # -- reacting ------------------------------------------------------------------------------

    def _on_text_edited(self, _text: str) -> None:
        self._update()
        self.edited.emit()

    def _on_check(self) -> None:
        try:
            endpoints = self.endpoints()
        except SettingsError:
            return
        if endpoints and not self._checking:
            self.set_checking(True)
            self.check_requested.emit(endpoints)

    def _update(self) -> None:
        problem = self.problem
        self.error.setText(problem)
        self.error.setVisible(bool(problem))
        endpoints = () if problem else self.endpoints()
        self.check_button.setEnabled(bool(endpoints) and not self._checking)
        self.check_button.setText("Checking…" if self._checking else "Check")
        lines = []
        for endpoint in endpoints:
            check = self._checks.get(endpoint)
            lines.append(check_text(check) if check is not None
                         else f"worker {endpoint}: not checked yet (Check plans with it)")
        self.results.setText("\n".join(lines))
        self.results.setVisible(bool(lines))
