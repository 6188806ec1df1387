"""Crash reports: faulthandler output for hard crashes, tracebacks for unhandled exceptions,
both kept in `user_dirs().crash_reports` and shown on the next start (as qutebrowser does).

Each running app writes faulthandler's output into `session-<pid>.log`; a clean exit deletes
it. A non-empty session file whose process is gone is therefore a crash: the next start
renames it `crash-<time>.txt` and shows it.

To see the whole path on a real build: `OUTRIDER_DEBUG_CRASH=segfault outrider` dies of a
segmentation fault once its window is up; the next start says "Outrider closed unexpectedly"
with the report (`tests/gui/test_crash_report.py` does exactly that).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import faulthandler
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TextIO

import psutil

DEBUG_CRASH_ENV = "OUTRIDER_DEBUG_CRASH"


def crash_if_asked(environ: Mapping[str, str] = os.environ) -> None:
    """Die now of a real SIGSEGV when `OUTRIDER_DEBUG_CRASH=segfault` (checking the crash
    handler on a build, as a user's crash would reach it); otherwise nothing."""
    if environ.get(DEBUG_CRASH_ENV) == "segfault":
        sys.stderr.write(f"{DEBUG_CRASH_ENV}=segfault: crashing on purpose\n")
        sys.stderr.flush()
        faulthandler._sigsegv()  # type: ignore[attr-defined]  # CPython's own test hook


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


class CrashReporter:
    """Attributes:
        on_exception: called with the saved report path after an unhandled exception (the
        app shows a notice); None to only save and print it.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.on_exception: Callable[[Path, str], None] | None = None
        self._session: Path | None = None
        self._file: TextIO | None = None
        self._previous_hook = sys.excepthook

    def install(self) -> list[Path]:
        """Start recording; return reports of earlier crashes found (newest last)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        found = self._collect_previous()
        self._session = self.folder / f"session-{os.getpid()}.log"
        self._file = self._session.open("w", encoding="utf-8")
        faulthandler.enable(self._file, all_threads=True)
        sys.excepthook = self._excepthook
        return found

    def uninstall(self) -> None:
        """A clean exit: stop recording and drop the (empty) session file."""
        sys.excepthook = self._previous_hook
        if self._file is not None:
            faulthandler.disable()
            self._file.close()
            self._file = None
        if self._session is not None:
            self._session.unlink(missing_ok=True)
            self._session = None

    def _collect_previous(self) -> list[Path]:
        reports = []
        for session in sorted(self.folder.glob("session-*.log")):
            pid = session.stem.removeprefix("session-")
            if pid.isdigit() and psutil.pid_exists(int(pid)) and int(pid) != os.getpid():
                continue  # another Outrider is running
            if session.stat().st_size == 0:  # killed without a word (SIGKILL): nothing to show
                session.unlink(missing_ok=True)
                continue
            report = self.folder / f"crash-{_stamp()}-{pid}.txt"
            session.replace(report)
            reports.append(report)
        return reports

    def _excepthook(self, kind: type[BaseException], value: BaseException,
                    tb: TracebackType | None) -> None:
        text = "".join(traceback.format_exception(kind, value, tb))
        report = self.folder / f"error-{_stamp()}.txt"
        with contextlib.suppress(OSError):
            report.write_text(text, encoding="utf-8")
        sys.stderr.write(text)
        if self.on_exception is not None:
            self.on_exception(report, f"{kind.__name__}: {value}")


def read_report(path: Path, limit: int = 20_000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-limit:]
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror or exc})"
