"""Drives BackgroundRunner and Inbox the way the app does, for many rounds, in a process of its
own (a crash is then a failed test with its output, not a dead test run).

    python -m tests.gui.background_stress --rounds 5000      # offscreen; exit 0, or a crash

Each round, as the first-run page, the Models pages and the settings do:
- a page (a shown widget) holds its runner and an inbox, and submits jobs whose callbacks are
  its bound methods and lambdas that hold the page;
- one job posts progress to the page's inbox from the worker thread, as pip's and the
  quantizer's progress do; a plain thread posts to it too, as a download worker does;
- one job blocks until released, as a Hub request or a download does;
- the round then ends one of four ways: the runner shut down while the job still runs (the
  window closing mid-request); the page deleted while results are still on their way; the
  job released and its result delivered; or everything simply dropped, the way a test's
  locals are, so that the last reference to the page (and through it to the runner) is the
  callback of a job.

On the design before the fix (a QObject per job, a child of the runner) the last way freed the
runner from inside its own job's destructor, which deleted the job a second time: glibc's
"malloc_consolidate(): unaligned fastbin chunk detected", or a segmentation fault.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
from collections.abc import Callable

from app.gui_gc import collect_on_gui_thread
from app.qt import QtCore, QtWidgets
from app.services.background import BackgroundRunner
from app.services.inbox import Inbox
from app.services.outcome import on_result

WAIT_S = 10.0


class Page(QtWidgets.QWidget):
    def __init__(self, runner: BackgroundRunner) -> None:
        super().__init__()
        self.runner = runner
        self.inbox = Inbox(self)
        self.inbox.received.connect(self._on_progress)
        self.bar = QtWidgets.QProgressBar(self)
        self.status = QtWidgets.QLabel(self)
        self.release = threading.Event()
        self.results: list[object] = []

    def start(self, reports: int) -> None:
        post = self.inbox.post
        job = self.runner.submit(lambda: [post(i) for i in range(reports)] and reports)
        job.done.connect(self._on_done)
        job.failed.connect(lambda exc: self.status.setText(f"failed: {exc}"))
        on_result(self.runner.submit(sum, range(reports)), self, self._on_done,
                  lambda exc: self.status.setText(str(exc)))
        release = self.release
        blocking = self.runner.submit(lambda: release.wait(WAIT_S) and "late")
        blocking.done.connect(lambda value: self.results.append(value))
        failing = self.runner.submit(lambda: 1 // 0)
        on_result(failing, self, None, lambda exc: self.status.setText(type(exc).__name__))

    def _on_progress(self, value: int) -> None:
        self.bar.setValue(value)

    def _on_done(self, value: object) -> None:
        self.results.append(value)
        self.status.setText(str(value))


def _pump(app: QtWidgets.QApplication, until: Callable[[], bool] | None = None,
          ms: int = 0) -> None:
    """Deliver events, but not deferred deletes (those wait, as they do while a test's
    qtbot.waitUntil spins), until `until()` holds or, without `until`, for `ms` ms."""
    timer = QtCore.QElapsedTimer()
    timer.start()
    wait = QtCore.QEventLoop.ProcessEventsFlag.WaitForMoreEvents
    app.processEvents()
    while (until is not None and not until()) or (until is None and timer.elapsed() < ms):
        if timer.elapsed() > WAIT_S * 1000:
            raise TimeoutError("a round's results never arrived")
        app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents | wait, 5)


def _delete_deferred(app: QtWidgets.QApplication) -> None:
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)
    app.processEvents()


def one_round(app: QtWidgets.QApplication, window: QtWidgets.QWidget, n: int) -> None:
    parented = n % 5 == 0
    runner = BackgroundRunner(window if parented else None)
    page = Page(runner)
    page.show()
    page.start(reports=1 + n % 40)
    poster = threading.Thread(target=lambda post=page.inbox.post: [post(i) for i in range(20)])
    poster.start()
    _pump(app, ms=n % 3)
    way = n % 4
    if way == 0:  # the window closes mid-request; the job ends later, its result dropped
        runner.shutdown(timeout=0)
        page.release.set()
    elif way == 1:  # the page goes away while results are on their way
        page.release.set()
        page.deleteLater()
    else:  # every result arrives: two values and the blocking job's "late"
        page.release.set()
        results = page.results
        _pump(app, until=lambda: len(results) == 3)
        if way == 2:  # closed in order
            page.close()
            runner.shutdown(timeout=WAIT_S)
        # way 3: only dropped, as a test's locals are: then only the jobs' callbacks hold
        # the page, and the page the runner, when the jobs' deferred deletes come
    poster.join()
    del page
    if parented:
        runner.shutdown(timeout=WAIT_S)
        runner.deleteLater()
    del runner
    _delete_deferred(app)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5000)
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QtWidgets.QApplication([sys.argv[0]])
    collect_on_gui_thread(interval_s=0.05)  # collect often: cycles through pages are freed
    window = QtWidgets.QWidget()
    for n in range(args.rounds):
        one_round(app, window, n)
    # Every round's worker thread has ended (the blocking jobs were released, and the runners
    # that only cycles held are collected).
    gc.collect()
    deadline = QtCore.QDeadlineTimer(int(WAIT_S * 1000))
    while sum(t.name == "outrider-background" for t in threading.enumerate()) and \
            not deadline.hasExpired():
        _pump(app, ms=10)
        _delete_deferred(app)
    left = [t.name for t in threading.enumerate() if t.name == "outrider-background"]
    print(f"{args.rounds} rounds, {len(left)} worker threads left", flush=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
