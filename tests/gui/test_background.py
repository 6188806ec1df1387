"""BackgroundRunner at shutdown: a job still running (a Hub request waiting for its timeout)
must not hold the window's close, and its late result must be dropped without touching Qt."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator

import pytest
from shiboken6 import delete as shiboken_delete

from app.qt import QtCore, QtWidgets
from app.services.background import BackgroundRunner, Job
from app.services.inbox import Inbox
from tests.gui.conftest import fake_command

GUARD_S = 60  # only a regression (an unbounded wait) ever gets near this


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """The event a blocking job waits on. A watchdog sets it if the test hangs, so that a
    shutdown which waits for the job returns (late) instead of hanging the run, and the
    test's `not release.is_set()` check fails."""
    event = threading.Event()
    watchdog = threading.Timer(GUARD_S, event.set)
    watchdog.start()
    yield event
    watchdog.cancel()
    watchdog.join()
    event.set()


def blocking_job(release: threading.Event, started: threading.Event,
                 finished: threading.Event) -> Callable[[], str]:
    def job() -> str:
        started.set()
        release.wait()
        finished.set()
        return "late result"
    return job


def record(job: Job) -> list[object]:
    seen: list[object] = []
    job.done.connect(seen.append)
    job.failed.connect(seen.append)
    return seen


def deliver_posted_events() -> None:
    """Hand out whatever the worker posted (and run deferred deletes)."""
    QtCore.QCoreApplication.sendPostedEvents()
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)


def test_shutdown_does_not_wait_for_a_job_in_flight(qtbot, release: threading.Event) -> None:
    started, finished = threading.Event(), threading.Event()
    runner = BackgroundRunner()
    worker = runner._thread
    seen = record(runner.submit(blocking_job(release, started, finished)))
    assert started.wait(GUARD_S)

    ended = runner.shutdown()

    assert not release.is_set(), "shutdown waited for the running job"
    assert not ended and worker.is_alive()
    release.set()  # the job ends now, after shutdown
    assert finished.wait(GUARD_S)
    worker.join(GUARD_S)
    assert not worker.is_alive()
    deliver_posted_events()
    assert seen == []  # the late result was dropped


def test_a_late_result_after_the_runner_is_deleted_is_dropped(
        qtbot, release: threading.Event) -> None:
    """As when the window closes mid-request: the runner (a child of the window) is deleted
    while its job still runs."""
    started, finished = threading.Event(), threading.Event()
    owner = QtCore.QObject()
    runner = BackgroundRunner(owner)
    worker = runner._thread
    seen = record(runner.submit(blocking_job(release, started, finished)))
    failing = record(runner.submit(lambda: 1 / 0))
    assert started.wait(GUARD_S)
    runner.shutdown()
    assert not release.is_set()

    owner.deleteLater()
    del runner
    deliver_posted_events()
    gc.collect()
    release.set()
    assert finished.wait(GUARD_S)
    worker.join(GUARD_S)
    assert not worker.is_alive()
    deliver_posted_events()
    assert seen == [] and failing == []  # never run, never reported


def test_jobs_not_started_never_run_and_posted_results_are_dropped(
        qtbot, release: threading.Event) -> None:
    ran: list[str] = []
    started, finished = threading.Event(), threading.Event()
    runner = BackgroundRunner()
    quick = record(runner.submit(lambda: ran.append("quick") or "quick"))
    runner.submit(blocking_job(release, started, finished))
    queued = record(runner.submit(lambda: ran.append("queued")))
    assert started.wait(GUARD_S)  # so "quick" has ended and its result is posted
    assert ran == ["quick"]

    runner.shutdown()  # before the GUI thread handed "quick" out
    release.set()
    runner._thread.join(GUARD_S)
    deliver_posted_events()
    assert ran == ["quick"]  # "queued" was skipped
    assert quick == [] and queued == []
    never = record(runner.submit(lambda: ran.append("after")))
    deliver_posted_events()
    assert ran == ["quick"] and never == []


def test_a_runner_deleted_without_shutdown_ends_its_thread(qtbot) -> None:
    owner = QtCore.QObject()
    runner = BackgroundRunner(owner)
    worker = runner._thread
    done = record(runner.submit(lambda: 7))
    qtbot.waitUntil(lambda: done == [7])
    owner.deleteLater()
    del runner
    deliver_posted_events()
    worker.join(GUARD_S)
    assert not worker.is_alive()


def test_closing_the_window_does_not_wait_for_a_hub_request(
        make_window, qtbot, release: threading.Event) -> None:
    from app.services.outcome import on_result

    window = make_window(fake_command())
    started, finished = threading.Event(), threading.Event()
    net = window.model_services.net
    worker = net._thread
    answers: list[object] = []
    job = window.model_services.on_net(blocking_job(release, started, finished))
    on_result(job, window.models_page, answers.append, answers.append)
    assert started.wait(GUARD_S)

    window.close()

    assert not release.is_set(), "closing the window waited for the Hub request"
    assert not window.isVisible()
    release.set()
    assert finished.wait(GUARD_S)
    worker.join(GUARD_S)
    assert not worker.is_alive()
    deliver_posted_events()
    assert answers == []


class _Target:
    def __init__(self) -> None:
        self.seen: list[object] = []

    def take(self, value: object) -> None:
        self.seen.append(value)


def test_a_job_lets_go_of_its_callbacks_once_it_has_called_one(qtbot) -> None:
    """A job holds its callbacks (and what they hold: a page) only until it settles, so no
    Qt object's deletion is ever what drops the last reference to a page."""
    runner = BackgroundRunner()
    try:
        target = _Target()
        alive = weakref.ref(target)
        job = runner.submit(lambda: 5)
        job.done.connect(target.take)
        job.failed.connect(target.take)
        del target
        qtbot.waitUntil(lambda: alive() is None or alive().seen == [5])  # type: ignore[union-attr]
        gc.collect()
        assert alive() is None, "the settled job still holds its callbacks"
    finally:
        runner.shutdown()


def test_a_method_of_a_deleted_qt_object_is_not_called(qtbot) -> None:
    """As a Qt connection would: the page went away before its answer came."""
    runner = BackgroundRunner()
    try:
        label = QtWidgets.QLabel()
        job = runner.submit(lambda: "late answer")
        job.done.connect(label.setText)
        seen = record(job)
        shiboken_delete(label)
        qtbot.waitUntil(lambda: seen == ["late answer"])  # delivered, and no RuntimeError
    finally:
        runner.shutdown()


def test_an_inbox_hands_items_over_in_order_on_the_gui_thread(qtbot) -> None:
    inbox = Inbox()
    got: list[tuple[int, str]] = []
    inbox.received.connect(lambda item: got.append((item, threading.current_thread().name)))
    posters = [threading.Thread(target=lambda k=k: [inbox.post(k * 1000 + i) for i in range(200)])
               for k in range(3)]
    for thread in posters:
        thread.start()
    for thread in posters:
        thread.join(GUARD_S)
    qtbot.waitUntil(lambda: len(got) == 600)
    assert {name for _, name in got} == {threading.current_thread().name}
    for k in range(3):  # each thread's items in the order it posted them
        mine = [item for item, _ in got if item // 1000 == k]
        assert mine == sorted(mine)


def test_posting_to_a_deleted_or_closed_inbox_drops_the_item(qtbot) -> None:
    owner = QtCore.QObject()
    inbox = Inbox(owner)
    got: list[object] = []
    inbox.received.connect(got.append)
    post = inbox.post  # what a download thread holds
    owner.deleteLater()
    deliver_posted_events()
    thread = threading.Thread(target=lambda: [post(i) for i in range(100)])
    thread.start()
    thread.join(GUARD_S)
    deliver_posted_events()
    assert got == []

    closed = Inbox()
    closed.received.connect(got.append)
    closed.post("before")
    closed.close()
    closed.post("after")
    deliver_posted_events()
    assert got == []


def test_a_failing_callback_is_reported_and_the_others_still_run(
        qtbot, monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[BaseException] = []
    monkeypatch.setattr("sys.excepthook", lambda kind, value, tb: reported.append(value))
    runner = BackgroundRunner()
    try:
        job = runner.submit(lambda: 3)
        job.done.connect(lambda value: 1 // 0)
        seen = record(job)
        qtbot.waitUntil(lambda: seen == [3])
        assert [type(exc) for exc in reported] == [ZeroDivisionError]
    finally:
        runner.shutdown()


def test_a_job_can_be_waited_for_like_a_signal(qtbot) -> None:
    """qtbot.waitSignal connects, then disconnects once it has fired, as with a Qt signal."""
    runner = BackgroundRunner()
    try:
        job = runner.submit(lambda: 11)
        with qtbot.waitSignal(job.done, timeout=int(GUARD_S * 1000)) as done:
            pass
        assert done.args == [11]
        dropped = runner.submit(lambda: 12)
        seen = record(dropped)
        assert dropped.done.disconnect(seen.append) is True
        assert dropped.done.disconnect(seen.append) is False
        after = record(runner.submit(lambda: 13))
        qtbot.waitUntil(lambda: after == [13])  # in order: 12's result was handed out first
        assert seen == []
    finally:
        runner.shutdown()
