"""The Server page's "Lend this machine" card: run `outrider worker`, which serves this
machine's CPU or GPUs to another machine's Outrider over llama.cpp's RPC, as a child process
(QProcess: the GUI thread never waits on it).

    card = WorkerCard()                        # or WorkerCard(EngineCommand(...)): tests
    card.host.setText("192.168.1.20")          # not loopback: the warning shows under it
    card.start()                               # Starting → Serving once it prints "listening on"
    card.stop()                                # SIGTERM: Stopped
    card.shutdown()                            # the app quits: stopped, waited for

The command is the app's own way of running `outrider` (`EngineCommand.outrider`: this
Python with `-m runtime.cli.main`, or the frozen app with `--engine`), plus `--host` and
`--port`. The worker prints one line per device it lends, then, once it really serves,
"listening on HOST:PORT (…)"; the card shows those lines. A worker that cannot start (the
port in use: exit code 2) ends Failed with its one-line error from stderr.

Why the warning: llama.cpp's RPC has no authentication or encryption, so a worker reachable
from the network lends its memory, and the running of code on its devices, to anyone who
can reach the port (`runtime.planner.workers.exposure_warning` says it, and how to do better).
"""

from __future__ import annotations

import collections
import enum
import os

from app.engine.process import EngineCommand, LineBuffer
from app.qt import QtCore, QtGui, QtWidgets, Signal
from app.widgets import muted_label
from runtime.errors import SettingsError
from runtime.planner.workers import exposure_warning
from runtime.settings.load import DEFAULT_WORKER_PORT, worker_endpoint

# The start of the line `outrider worker` prints once it serves (runtime.cli.worker.READY:
# not imported, since that module imports llama.cpp's binding, which the app never does).
READY_PREFIX = "listening on "
STOP_KILL_MS = 3000  # after SIGTERM, how long Stop waits before it kills
KEEP_LINES = 200


class WorkerState(enum.Enum):
    STOPPED = "Stopped"
    STARTING = "Starting"
    SERVING = "Serving"
    FAILED = "Failed"


def failure_line(stderr: list[str], exit_code: int) -> str:
    """The one line that says why the worker ended: its last "error: …" line (the CLI's
    one-line errors), else its last line, else the exit code.

        >>> failure_line(["warning: x", "error: port 50052 on 127.0.0.1 is already in use"], 2)
        'port 50052 on 127.0.0.1 is already in use'
    """
    errors = [line for line in stderr if line.startswith("error:")]
    if errors:
        return errors[-1].removeprefix("error:").strip()
    return stderr[-1] if stderr else f"the worker exited with code {exit_code}"


class WorkerCard(QtWidgets.QFrame):
    """Signals:
        state_changed(WorkerState)
        line_received(str): a line the worker printed on stdout.

    Attributes:
        command: how `outrider` is run (replace it before `start` to run another program).
        host, port: where it listens. warning: the exposure warning (hidden on loopback).
        output: its stdout lines. error: why it failed. state: the WorkerState now.
    """

    state_changed = Signal(object)
    line_received = Signal(str)

    def __init__(self, command: EngineCommand | None = None,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        self.command = command or EngineCommand.outrider("worker")
        self.state = WorkerState.STOPPED
        self._process: QtCore.QProcess | None = None
        self._stopping = False
        self._stdout = LineBuffer()
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._kill_timer = QtCore.QTimer(self, singleShot=True, interval=STOP_KILL_MS)
        self._kill_timer.timeout.connect(self._kill)

        title = QtWidgets.QLabel("Lend this machine")
        title.setObjectName("panelTitle")
        intro = muted_label(
            "Let another computer's Outrider use this machine's memory and processors for part "
            "of a model (llama.cpp RPC): start here, then name this address in its Settings → "
            "Model → Workers.")
        self.host = QtWidgets.QLineEdit("127.0.0.1")
        self.host.setObjectName("workerHost")
        self.port = QtWidgets.QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(DEFAULT_WORKER_PORT)
        self.port.setGroupSeparatorShown(False)
        self.warning = QtWidgets.QLabel()
        self.warning.setObjectName("editBanner")
        self.warning.setWordWrap(True)
        self.warning.hide()
        self.start_button = QtWidgets.QPushButton("Start")
        self.stop_button = QtWidgets.QPushButton("Stop")
        self.state_label = QtWidgets.QLabel()
        self.error = QtWidgets.QLabel()
        self.error.setObjectName("replyError")
        self.error.setWordWrap(True)
        self.error.hide()
        self.output = QtWidgets.QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setMaximumBlockCount(KEEP_LINES)
        self.output.setFixedHeight(72)
        self.output.setFont(QtGui.QFontDatabase.systemFont(
            QtGui.QFontDatabase.SystemFont.FixedFont))
        self.output.setPlaceholderText("What the worker says (its devices, where it listens).")

        form = QtWidgets.QFormLayout()
        form.addRow("Host", self.host)
        form.addRow("", self.warning)
        form.addRow("Port", self.port)
        buttons = QtWidgets.QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.state_label)
        buttons.addStretch(1)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(16, 12, 16, 12)
        layout.addWidget(title)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.error)
        layout.addWidget(self.output)

        self.host.textChanged.connect(self._update)
        self.port.valueChanged.connect(self._update)
        self.start_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        self._update()

    # -- actions ---------------------------------------------------------------------------

    def endpoint(self) -> str:
        """Where the worker would listen, "host:port" (SettingsError if the host is no host)."""
        return worker_endpoint(f"{self.host.text().strip()}:{self.port.value()}")

    def start(self) -> None:
        if self._process is not None:
            return
        try:
            host, _, port = self.endpoint().rpartition(":")
        except SettingsError as exc:
            self._fail(str(exc))
            return
        self._stopping = False
        self._stdout = LineBuffer()
        self._stderr.clear()
        self.output.clear()
        self.error.hide()
        process = self.command.process(self, self)
        self._process = process
        self._set_state(WorkerState.STARTING)
        process.start(self.command.program, [*self.command.args, "--host", host, "--port", port,
                                             "--parent-pid", str(os.getpid())])

    def stop(self) -> None:
        """Ask the worker to stop (SIGTERM); killed if it has not within a few seconds."""
        if self._process is None:
            return
        self._stopping = True
        self._process.terminate()
        self._kill_timer.start()

    def shutdown(self, wait_ms: int = STOP_KILL_MS) -> None:
        """Stop and wait for it (the app quits: no worker is left serving behind it)."""
        process = self._process
        if process is None:
            return
        self.stop()
        if not process.waitForFinished(wait_ms):
            process.kill()
            process.waitForFinished(1000)

    @property
    def running(self) -> bool:
        return self._process is not None

    # -- the process -----------------------------------------------------------------------

    def _on_stdout(self) -> None:
        if self._process is not None:
            self._show(self._stdout.feed(bytes(self._process.readAllStandardOutput().data())))

    def _show(self, lines: list[str]) -> None:
        for line in lines:
            if not line.strip():
                continue
            self.output.appendPlainText(line)
            self.line_received.emit(line)
            if line.startswith(READY_PREFIX) and self.state == WorkerState.STARTING:
                self._set_state(WorkerState.SERVING)

    def _on_stderr(self) -> None:
        if self._process is not None:
            self._read_stderr(self._process)

    def _read_stderr(self, process: QtCore.QProcess) -> None:
        text = bytes(process.readAllStandardError().data()).decode("utf-8", "replace")
        self._stderr.extend(line.strip() for line in text.splitlines() if line.strip())

    def _on_finished(self, exit_code: int, _status: QtCore.QProcess.ExitStatus) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        self._kill_timer.stop()
        self._on_stdout_of(process)
        self._read_stderr(process)
        process.deleteLater()
        if self._stopping or exit_code == 0:
            self._set_state(WorkerState.STOPPED)
        else:
            self._fail(failure_line(list(self._stderr), exit_code))

    def _on_stdout_of(self, process: QtCore.QProcess) -> None:
        self._show(self._stdout.feed(bytes(process.readAllStandardOutput().data())))
        self._show(self._stdout.rest())

    def _on_error(self, error: QtCore.QProcess.ProcessError) -> None:
        if error == QtCore.QProcess.ProcessError.FailedToStart and self._process is not None:
            process, self._process = self._process, None
            process.deleteLater()
            self._fail(f"could not run {self.command.program}: {process.errorString()}")

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()

    # -- showing ---------------------------------------------------------------------------

    def _fail(self, reason: str) -> None:
        self.error.setText(reason)
        self.error.show()
        self._set_state(WorkerState.FAILED)

    def _set_state(self, state: WorkerState) -> None:
        changed = state != self.state
        self.state = state
        self._update()
        if changed:
            self.state_changed.emit(state)

    def _update(self, *_args: object) -> None:
        running = self._process is not None
        try:
            host, _, port = self.endpoint().rpartition(":")
            warning = exposure_warning(host, int(port))
            valid = True
        except SettingsError as exc:
            warning, valid = str(exc), False
        self.warning.setText(warning or "")
        self.warning.setVisible(bool(warning))
        self.host.setEnabled(not running)
        self.port.setEnabled(not running)
        self.start_button.setEnabled(valid and not running)
        self.stop_button.setEnabled(running and not self._stopping)
        self.state_label.setText(self.state.value)
