"""Run blocking functions (disk, the Hub, NVML) off the GUI thread, one at a time.

One worker thread per runner takes jobs from a queue; each result comes back on the GUI
thread to the callbacks connected to the job's `done` or `failed`.

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

Results cross to the GUI thread through an `Inbox` (app.services.inbox: a queued signal, no
Python-made event). A `Job` is a plain Python object, not a QObject, and it lets go of its
callbacks as soon as it has called one: a callback is often a lambda that holds a page, the
page holds the runner, and a Qt object whose deletion drops the last reference to its own
parent is deleted twice. That was the heap corruption the GUI tests met one run in ten
(`tests/gui/test_background_stress.py` reproduces it on the old design).
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

from app.qt import QtCore, isValid
from app.services.inbox import Inbox

SHUTDOWN_WAIT_S = 1.0  # how long closing the window waits for a running job

_Call = Callable[[], Any]
_Result = tuple[int, bool, object]  # job id, succeeded, value or exception


class Callbacks:
    """What a job calls with its outcome, on the GUI thread: `connect(callback)`, like a
    signal's. Each is called once at most, then forgotten. As with a Qt connection, a method
    of a Qt object that has been deleted is not called."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], Any]] = []

    def connect(self, callback: Callable[[Any], Any]) -> None:
        self._callbacks.append(callback)

    def disconnect(self, callback: Callable[[Any], Any]) -> bool:
        """Forget `callback`; False when it was not connected (or has been called)."""
        try:
            self._callbacks.remove(callback)
        except ValueError:
            return False
        return True

    def emit(self, value: object) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            receiver = getattr(callback, "__self__", None)
            if isinstance(receiver, QtCore.QObject) and not isValid(receiver):
                continue
            try:
                callback(value)
            except Exception:  # as a Qt slot's: reported (the app's crash reporter), and the
                sys.excepthook(*sys.exc_info())  # other callbacks still run

    def clear(self) -> None:
        self._callbacks = []


class Job:
    """One submitted call. Attributes:
        done: called with the function's return value.
        failed: called with the exception it raised.
    """

    def __init__(self) -> None:
        self.done = Callbacks()
        self.failed = Callbacks()

    def settle(self, ok: bool, value: object) -> None:
        """Call `done` or `failed` with `value`; then the job holds no callback at all."""
        (self.done if ok else self.failed).emit(value)  # reports, never raises, a failure
        self.forget()

    def forget(self) -> None:
        self.done.clear()
        self.failed.clear()


def _work(jobs: queue.SimpleQueue[tuple[int, _Call] | None],
          post: Callable[[_Result], None], stopped: threading.Event) -> None:
    """The worker thread: run jobs in order until told to stop (None) or shut down."""
    while (item := jobs.get()) is not None and not stopped.is_set():
        job_id, call = item
        try:
            value = call()
        except Exception as exc:  # handed to the GUI thread as an object, never lost
            post((job_id, False, exc))
        else:
            post((job_id, True, value))
            del value
        # Let go of the job (its function, its arguments: often bound methods of Qt objects)
        # now, while their owners are alive, not at the next jobs.get() — which may come only
        # at shutdown, after those owners were deleted on the GUI thread.
        del item, call


class BackgroundRunner(QtCore.QObject):
    """Runs submitted functions one at a time on its own worker thread."""

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._queue: queue.SimpleQueue[tuple[int, _Call] | None] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._results = Inbox(self)
        self._results.received.connect(self._on_result)
        # The thread holds the queue and the inbox's post, which drops everything once the
        # inbox is closed or deleted: a job left running after shutdown touches no Qt object
        # (it keeps only the inbox's Python wrapper alive, never a page).
        self._thread = threading.Thread(
            target=_work, args=(self._queue, self._results.post, self._stopped),
            name="outrider-background", daemon=True)
        self._thread.start()
        # Deleted with its parent without a shutdown: the worker ends after its current job.
        stopped, jobs = self._stopped, self._queue
        self.destroyed.connect(lambda *_: _stop(stopped, jobs))

    def submit(self, func: Callable[..., Any], *args: Any) -> Job:
        """Run `func(*args)` after the jobs submitted before it. After `shutdown` the job
        never runs and its callbacks are never called."""
        job = Job()
        if self._stopped.is_set():
            return job
        job_id = next(self._ids)
        self._jobs[job_id] = job
        self._queue.put((job_id, lambda: func(*args)))
        return job

    def shutdown(self, timeout: float | None = SHUTDOWN_WAIT_S) -> bool:
        """Stop: jobs not started yet never run, and no result is delivered any more (not
        even one already on its way). Waits up to `timeout` seconds (None: as long as it
        takes) for the running job. True when the worker thread has ended; False when a job
        still runs — it ends on its own and its result is dropped."""
        self._results.close()
        _stop(self._stopped, self._queue)
        jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            job.forget()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _on_result(self, result: _Result) -> None:
        job_id, ok, value = result
        job = self._jobs.pop(job_id, None)
        if job is not None:
            job.settle(ok, value)


def _stop(stopped: threading.Event, jobs: queue.SimpleQueue[tuple[int, _Call] | None]) -> None:
    stopped.set()
    jobs.put(None)  # wakes an idle worker so that it ends
