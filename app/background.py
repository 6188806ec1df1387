"""Run blocking functions (disk, a pip download, NVML) off the GUI thread, one at a time.

The superqt pattern: one worker `QObject` moved to one `QThread`; jobs reach it through a
queued signal and results come back as signals on a `Job` that lives on the GUI thread.

    runner = BackgroundRunner(parent=window)
    job = runner.submit(plan_for, path)
    job.done.connect(show_plan)          # the function's return value
    job.failed.connect(show_error)       # the exception it raised
    ...
    runner.shutdown()                    # when the window closes: waits for the current job
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from app.qt import QtCore, Signal, Slot


class Job(QtCore.QObject):
    """Signals: done(object) with the result, or failed(object) with the exception."""

    done = Signal(object)
    failed = Signal(object)


class _Worker(QtCore.QObject):
    result = Signal(int, bool, object)

    @Slot(int, object)
    def run(self, job_id: int, call: Callable[[], Any]) -> None:
        try:
            value = call()
        except Exception as exc:  # handed to the GUI thread as an object, never lost
            self.result.emit(job_id, False, exc)
        else:
            self.result.emit(job_id, True, value)


class BackgroundRunner(QtCore.QObject):
    _submit = Signal(int, object)

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._thread = QtCore.QThread()
        self._thread.setObjectName("outrider-background")
        self._worker = _Worker()
        self._worker.moveToThread(self._thread)
        self._submit.connect(self._worker.run)
        self._worker.result.connect(self._on_result)
        self._thread.finished.connect(self._worker.deleteLater)
        self._thread.start()

    def submit(self, func: Callable[..., Any], *args: Any) -> Job:
        job_id = next(self._ids)
        job = Job(self)
        self._jobs[job_id] = job
        self._submit.emit(job_id, lambda: func(*args))
        return job

    def shutdown(self) -> None:
        if self._thread.isRunning():
            self._thread.quit()
            self._thread.wait()

    def _on_result(self, job_id: int, ok: bool, value: object) -> None:
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        (job.done if ok else job.failed).emit(value)
        job.deleteLater()
