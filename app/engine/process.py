"""The engine server as a supervised child process (QProcess: never blocks the GUI thread).

The app runs `python -m runtime.cli.main serve --host 127.0.0.1 --port 1234 --api-key=KEY
--parent-pid PID` (an empty KEY: none asked for) (a frozen build runs itself with `--engine`), waits for the one
`OUTRIDER_SERVER_READY {json}` line on stdout, and keeps everything the engine writes to
stderr in a log file under `user_dirs().logs`, so a crash can be read afterwards from the
Server page. `--parent-pid` makes the child exit when the app dies without stopping it.

Where it listens follows the user's server settings (`engine_listen`): the settings' port
(1234 unless changed: what LM Studio users expect), remembered across starts, so other tools
keep one address. On loopback no key is needed (the API key, if set, is asked for anyway); all
interfaces only with network access allowed *and* a key. A port another program holds is not
fought over: that run listens on a free port and says which one was taken (`port_taken`). A
change applies at the next (re)start.
"""

from __future__ import annotations

import collections
import datetime as _dt
import os
import secrets
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from app.engine.wire import ServerAddress, WireError, parse_ready_line
from app.qt import QtCore, Signal
from runtime.settings.user import Secret, ServerSettings

DEFAULT_API_PORT = 1234  # LM Studio's: what other tools expect a local server on
STARTUP_TIMEOUT_MS = 120_000  # loading llama.cpp on a cold, busy disk can take a while
KEEP_LOGS = 20


@dataclass(frozen=True)
class EngineListen:
    """Where the engine server listens and the key it asks for.

    >>> EngineListen()                                  # the default: this computer, no key
    EngineListen(host='127.0.0.1', port=1234, api_key=None)
    >>> EngineListen(port=0).fixed                      # any free port: for tests
    False
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_API_PORT  # 0: any free port
    api_key: Secret | None = None  # None: no key (loopback only)

    @property
    def fixed(self) -> bool:
        """True when other tools can rely on the address (a set port)."""
        return self.port != 0

    @property
    def network(self) -> bool:
        return self.host != "127.0.0.1"


def engine_listen(server: ServerSettings, api_key: Secret | None) -> EngineListen:
    """The listening the user's settings ask for: always the settings' port; other computers
    may connect only with network access allowed *and* a key (without one the engine stays on
    this computer, where no key is needed).

    >>> engine_listen(ServerSettings(port=8080, allow_network=True), None)
    EngineListen(host='127.0.0.1', port=8080, api_key=None)
    >>> engine_listen(ServerSettings(port=8080), Secret("k"))
    EngineListen(host='127.0.0.1', port=8080, api_key=Secret('***'))
    >>> engine_listen(ServerSettings(port=9000, allow_network=True), Secret("k")).host
    '0.0.0.0'
    """
    if api_key is None:
        return EngineListen("127.0.0.1", server.port, None)
    return EngineListen(server.host, server.port, api_key)


def port_is_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` now (another program may hold it). SO_REUSEADDR,
    as the server sets it: a port left in TIME_WAIT by the engine's last run is free."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class _ChildOwner(Protocol):
    """What owns a child process's output and end (EngineProcess, the worker card)."""

    def _on_stdout(self) -> None: ...
    def _on_stderr(self) -> None: ...
    def _on_finished(self, exit_code: int, status: QtCore.QProcess.ExitStatus) -> None: ...
    def _on_error(self, error: QtCore.QProcess.ProcessError) -> None: ...


class LineBuffer:
    """A child's stdout cut into whole lines as it arrives (the engine's ready line, the
    worker's); a line cut mid-way waits for the rest, and `rest` hands over what is left
    when the child has ended.

    >>> lines = LineBuffer()
    >>> lines.feed(b"one\\r\\ntw"), lines.feed(b"o\\nthr"), lines.rest()
    (['one'], ['two'], ['thr'])
    """

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[str]:
        *whole, self._pending = (self._pending + data).split(b"\n")
        return [raw.decode("utf-8", errors="replace").rstrip("\r") for raw in whole]

    def rest(self) -> list[str]:
        pending, self._pending = self._pending, b""
        return [pending.decode("utf-8", errors="replace").rstrip("\r")] if pending else []


@dataclass(frozen=True)
class EngineCommand:
    """How to start an engine server; the server flags are appended by `argv`.

    >>> cmd = EngineCommand("python3", ("-m", "runtime.cli.main", "serve"))
    >>> cmd.argv("-k3y", 42)[-7:]
    ['--host', '127.0.0.1', '--port', '0', '--api-key=-k3y', '--parent-pid', '42']
    >>> cmd.argv("k", 42, "0.0.0.0", 8080)[-7:-2]
    ['--host', '0.0.0.0', '--port', '8080', '--api-key=k']
    """

    program: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def default(cls) -> EngineCommand:
        # --allow-any-path: the user may open any file they can read; the engine listens on
        # loopback only, behind a random key.
        return cls.outrider("serve", "--allow-any-path")

    @classmethod
    def outrider(cls, *args: str) -> EngineCommand:
        """`outrider ARGS…` as this app runs it: the engine server, or the worker that lends
        this machine to another (the Server page's "Lend this machine").

            >>> EngineCommand.outrider("worker").args[-3:]
            ('-m', 'runtime.cli.main', 'worker')
        """
        if getattr(sys, "frozen", False):  # PyInstaller: the app binary doubles as the engine
            return cls(sys.executable, ("--engine", *args))
        # The child must import this very `runtime` even when the project is not installed.
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        return cls(sys.executable, ("-m", "runtime.cli.main", *args), {"PYTHONPATH": path})

    def process(self, parent: QtCore.QObject, owner: _ChildOwner) -> QtCore.QProcess:
        """A QProcess (not started) for this command: unbuffered Python output, this command's
        environment, and `owner`'s four slots connected — the one way the app makes the child
        of an `outrider` command (the engine server, a worker)."""
        process = QtCore.QProcess(parent)
        env = QtCore.QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        for key, value in self.env.items():
            env.insert(key, value)
        process.setProcessEnvironment(env)
        process.readyReadStandardOutput.connect(owner._on_stdout)
        process.readyReadStandardError.connect(owner._on_stderr)
        process.finished.connect(owner._on_finished)
        process.errorOccurred.connect(owner._on_error)
        return process

    def argv(self, api_key: str, parent_pid: int, host: str = "127.0.0.1",
             port: int = 0, saved_kv_gib: float | None = None) -> list[str]:
        """The engine's arguments; `saved_kv_gib`: the saved-KV-cache budget from the app's
        settings (None: the engine's own default).

        >>> EngineCommand("python3", ("-m", "x")).argv("", 7, saved_kv_gib=1.5)[-2:]
        ['--saved-kv-gib', '1.5']
        """
        # `--api-key=KEY` in one word: a random key may start with "-", which argparse
        # would otherwise take for an option.
        budget = () if saved_kv_gib is None else ("--saved-kv-gib", f"{saved_kv_gib:g}")
        return [*self.args, "--host", host, "--port", str(port), f"--api-key={api_key}",
                "--parent-pid", str(parent_pid), *budget]


@dataclass(frozen=True)
class EngineExit:
    """How the engine process ended. `expected` is False for crashes and kills."""

    exit_code: int
    crashed: bool  # killed by a signal or an abort
    expected: bool
    log_path: Path | None
    tail: str  # the last lines of its stderr, for the message shown to the user

    def describe(self) -> str:
        if self.expected:
            return "The engine stopped."
        how = "crashed" if self.crashed else f"exited with code {self.exit_code}"
        return f"The engine {how}."


class EngineProcess(QtCore.QObject):
    """One engine server child process at a time.

    Signals:
        ready(ServerAddress): the server printed its ready line and listens.
        exited(EngineExit): the process ended (after `ready` or not).
        failed(str): it could not be started or never became ready; a one-line reason.

    Attributes:
        log_path: the stderr log of the current (or last) process.
        listen: where the next start listens (set from the user's settings).
        listening: what the running process was started with (None when none runs).
    """

    ready = Signal(object)
    exited = Signal(object)
    failed = Signal(str)

    def __init__(self, command: EngineCommand, log_dir: Path,
                 parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._command = command
        self._log_dir = log_dir
        self._process: QtCore.QProcess | None = None
        self._log: TextIO | None = None
        self._stdout = LineBuffer()
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self._expected_exit = False
        self.address: ServerAddress | None = None
        self.log_path: Path | None = None
        self.listen = EngineListen()
        self.listening: EngineListen | None = None
        # The settings' port when another program held it at the last start (it then ran on
        # a free port), else None.
        self.port_taken: int | None = None
        # False after the Server page's Stop API: the next start serves the chat alone, on a
        # free port with a random key (the API's address is free for other programs).
        self.api_enabled = True
        # The saved-KV-cache budget the app's settings ask for (None: the engine's default).
        self.saved_kv_gib: float | None = None
        self._port = 0  # the port the running start asked for (0: any free one)
        self._timeout = QtCore.QTimer(self, singleShot=True, interval=STARTUP_TIMEOUT_MS)
        self._timeout.timeout.connect(self._on_startup_timeout)

    @property
    def running(self) -> bool:
        return self._process is not None

    @property
    def pid(self) -> int | None:
        return int(self._process.processId()) if self._process is not None else None

    def start(self, *, port_taken: int | None = None) -> None:
        """Start the engine on the listening `self.listen` asks for. `port_taken`: that port
        was found held by another program (here, or as the last start exited); use a free one."""
        if self._process is not None:
            return
        listen = self.listen
        api_key = listen.api_key.reveal() if listen.api_key else ""  # "": no key
        self.port_taken = port_taken
        host, port = listen.host, 0 if port_taken else listen.port
        if not self.api_enabled:  # the chat's engine only: no fixed address, a private key
            host, port, api_key = "127.0.0.1", 0, secrets.token_urlsafe(24)
        elif port and not port_is_free(host, port):
            # Another program holds the port: run on a free one and say so (the Server page).
            self.port_taken, port = port, 0
        self._port = port
        self._expected_exit = False
        self.address = None
        self._stdout = LineBuffer()
        self._tail.clear()
        self._open_log()
        process = self._command.process(self, self)
        self._process = process
        self._api_key = api_key
        self.listening = listen
        self._write_log(f"$ {self._command.program} {' '.join(self._command.args)} "
                        f"--host {host} --port {port} …\n")
        process.start(self._command.program,
                      self._command.argv(api_key, os.getpid(), host, port, self.saved_kv_gib))
        self._timeout.start()

    def stop(self, wait_ms: int = 3000) -> None:
        """Ask the engine to exit (SIGTERM), then kill it. Waits at most `wait_ms` in total:
        only called when the app closes or the user restarts the engine."""
        process = self._process
        if process is None:
            return
        self._expected_exit = True
        process.terminate()
        if not process.waitForFinished(wait_ms):
            process.kill()
            process.waitForFinished(1000)

    def kill(self) -> None:
        """Kill without warning, as a crash would (tests and the "force stop" action)."""
        if self._process is not None:
            self._process.kill()

    # -- slots -------------------------------------------------------------------------

    def _on_stdout(self) -> None:
        if self._process is None:
            return
        for line in self._stdout.feed(bytes(self._process.readAllStandardOutput().data())):
            self._write_log(line + "\n")
            if self.address is not None:
                continue
            try:
                address = parse_ready_line(line, self._api_key)
            except WireError as exc:
                self._give_up(str(exc))
                return
            if address is not None:
                self._timeout.stop()
                self.address = address
                self.ready.emit(address)

    def _on_stderr(self) -> None:
        if self._process is None:
            return
        text = bytes(self._process.readAllStandardError().data()).decode("utf-8", "replace")
        self._write_log(text)
        self._tail.extend(line for line in text.splitlines() if line.strip())

    def _on_finished(self, exit_code: int, status: QtCore.QProcess.ExitStatus) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        self.listening = None
        self._on_stderr_of(process)
        self._timeout.stop()
        # An intended stop ends in SIGTERM, which QProcess reports as a crash (code 15): it is
        # neither a crash for the user nor for the log.
        crashed = status == QtCore.QProcess.ExitStatus.CrashExit and not self._expected_exit
        info = EngineExit(int(exit_code), crashed, self._expected_exit, self.log_path,
                          "\n".join(self._tail))
        if self._expected_exit:
            self._write_log("--- exit: stopped as asked\n")
        else:
            self._write_log(f"--- exit: code {exit_code}, {'crash' if crashed else 'normal'}\n")
        self._close_log()
        process.deleteLater()
        was_ready = self.address is not None
        self.address = None
        if not was_ready and not self._expected_exit and self._port and exit_code == 2 \
                and any("already in use" in line for line in self._tail):
            # Taken between our check and the engine's bind (another program, or an engine of
            # ours still closing): the same answer as a port found taken, a free one.
            self.start(port_taken=self._port)
            return
        if not was_ready and not self._expected_exit:
            last = self._tail[-1] if self._tail else f"exit code {exit_code}"
            self.failed.emit(f"The engine did not start: {last}")
        self.exited.emit(info)

    def _on_stderr_of(self, process: QtCore.QProcess) -> None:
        rest = bytes(process.readAllStandardError().data()).decode("utf-8", "replace")
        if rest:
            self._write_log(rest)
            self._tail.extend(line for line in rest.splitlines() if line.strip())

    def _on_error(self, error: QtCore.QProcess.ProcessError) -> None:
        if error == QtCore.QProcess.ProcessError.FailedToStart and self._process is not None:
            process, self._process = self._process, None
            self.listening = None
            self._timeout.stop()
            self._close_log()
            process.deleteLater()
            self.failed.emit(f"Could not run {self._command.program}: "
                             f"{process.errorString()}")

    def _on_startup_timeout(self) -> None:
        self._give_up(f"The engine did not report ready within {STARTUP_TIMEOUT_MS // 1000} s")

    def _give_up(self, reason: str) -> None:
        self._write_log(f"--- {reason}\n")
        self._tail.append(reason)
        if self._process is not None:
            self._process.kill()

    # -- log file ----------------------------------------------------------------------

    def _open_log(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        self.log_path = self._log_dir / f"engine-{stamp}.log"
        self._log = self.log_path.open("a", encoding="utf-8")
        logs = sorted(self._log_dir.glob("engine-*.log"))
        for old in logs[:-KEEP_LOGS]:
            old.unlink(missing_ok=True)

    def _write_log(self, text: str) -> None:
        log = self._log
        if log is not None:
            log.write(text)
            log.flush()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def engine_logs(log_dir: Path) -> list[Path]:
    """The kept engine logs, newest first."""
    return sorted(log_dir.glob("engine-*.log"), reverse=True)
