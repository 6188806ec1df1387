"""Run blocking functions (disk, the Hub, NVML) off the GUI thread, one at a time.

One worker thread per runner takes jobs from a queue; each result comes back as a signal on
the job's `Job`, which lives on the GUI thread.

    runner = BackgroundRunner(parent=window)
    job = runner.submit(plan_for, path)
    job.done.connect(show_plan)          # the function's return value
    job.failed.connect(show_error)       # the exception it raised
    ...
    runner.shutdown()                    # when the window closes: waits at most ~1 s

Closing the window must not wait for a Hub request that may take its whole 20 s timeout, and
a running function cannot be interrupted. So `shutdown` skips the jobs not yet started, waits
a short while for the running one and then leaves it to finish on its own; its result is
dropped. That is why the worker is a daemon `threading.Thread`, not a `QThread`: a QThread
still running when PySide deletes its Python-owned objects at exit aborts the process
("QThread: Destroyed while thread is still running"), while a daemon thread simply ends with it.

Results cross threads as in `app.services.outcome.Inbox`: the worker appends to a locked list and
posts one wake-up event (`QCoreApplication.postEvent` is thread-safe; no Qt signal is emitted
from the worker). `shutdown` takes the same lock to close the mailbox, so once it has returned
nothing more is posted to the runner, and the runner may be deleted right away.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any

from app.qt import QtCore, Signal

SHUTDOWN_WAIT_S = 1.0  # how long closing the window waits for a running job
_WAKE = QtCore.QEvent.Type(QtCore.QEvent.registerEventType())

_Call = Callable[[], Any]
_Result = tuple[int, bool, object]  # job id, succeeded, value or exception


class Job(QtCore.QObject):
    """Signals: done(object) with the result, or failed(object) with the exception."""

    done = Signal(object)
    failed = Signal(object)


class _Mailbox:
    """Results on their way from the worker thread to the runner on the GUI thread.

    Once closed it drops whatever is posted, and it never refers to the runner again, so a
    result that arrives after shutdown touches no Qt object at all.
    """

    def __init__(self, receiver: QtCore.QObject) -> None:
        self._lock = threading.Lock()
        self._receiver: QtCore.QObject | None = receiver
        self._results: list[_Result] = []

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._receiver is None

    def post(self, result: _Result) -> None:
        """Called on the worker thread."""
        with self._lock:
            if self._receiver is None:
                return  # shut down: the result is dropped
            self._results.append(result)
            if len(self._results) == 1:  # otherwise a wake-up is already on its way
                QtCore.QCoreApplication.postEvent(self._receiver, QtCore.QEvent(_WAKE))

    def take(self) -> list[_Result]:
        with self._lock:
            results, self._results = self._results, []
        return results

    def close(self) -> None:
        with self._lock:
            self._receiver = None
            self._results.clear()


def _work(jobs: queue.SimpleQueue[tuple[int, _Call] | None], mailbox: _Mailbox) -> None:
    """The worker thread: run jobs in order until told to stop (None) or shut down."""
    while (item := jobs.get()) is not None and not mailbox.closed:
        job_id, call = item
        try:
            value = call()
        except Exception as exc:  # handed to the GUI thread as an object, never lost
            mailbox.post((job_id, False, exc))
        else:
            mailbox.post((job_id, True, value))
            del value
        # Let go of the job (its function, its arguments: often bound methods of Qt objects)
        # now, while their owners are alive, not at the next jobs.get() — which may come only
        # at shutdown, after those owners were deleted on the GUI thread.
        del item, call


def _stop(jobs: queue.SimpleQueue[tuple[int, _Call] | None], mailbox: _Mailbox) -> None:
    mailbox.close()
    jobs.put(None)  # wakes an idle worker so that it ends


class BackgroundRunner(QtCore.QObject):
    """Runs submitted functions one at a time on its own worker thread."""

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._queue: queue.SimpleQueue[tuple[int, _Call] | None] = queue.SimpleQueue()
        self._mailbox = _Mailbox(self)
        # The thread holds the queue and the mailbox (which lets go of the runner once
        # closed), so a job left running after shutdown keeps no Qt object alive.
        self._thread = threading.Thread(target=_work, args=(self._queue, self._mailbox),
                                        name="outrider-background", daemon=True)
        self._thread.start()
        # Deleted with its parent without a shutdown: post nothing more to the dead object.
        jobs, mailbox = self._queue, self._mailbox
        self.destroyed.connect(lambda *_: _stop(jobs, mailbox))

    def submit(self, func: Callable[..., Any], *args: Any) -> Job:
        """Run `func(*args)` after the jobs submitted before it. After `shutdown` the job
        never runs and its signals never fire."""
        job_id = next(self._ids)
        job = Job(self)
        self._jobs[job_id] = job
        self._queue.put((job_id, lambda: func(*args)))
        return job

    def shutdown(self, timeout: float | None = SHUTDOWN_WAIT_S) -> bool:
        """Stop: jobs not started yet never run, and no result is delivered any more (not
        even one already on its way). Waits up to `timeout` seconds (None: as long as it
        takes) for the running job. True when the worker thread has ended; False when a job
        still runs — it ends on its own and its result is dropped."""
        _stop(self._queue, self._mailbox)
        self._jobs.clear()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def event(self, event: QtCore.QEvent) -> bool:
        if event.type() != _WAKE:
            return super().event(event)
        for job_id, ok, value in self._mailbox.take():
            job = self._jobs.pop(job_id, None)
            if job is not None:
                (job.done if ok else job.failed).emit(value)
                job.deleteLater()
        return True
