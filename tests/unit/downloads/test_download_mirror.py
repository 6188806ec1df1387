"""A new Hub endpoint (a mirror chosen in Settings → App) reaches the download queue at once:
queued jobs start against it, a job in flight restarts its request there keeping its bytes, and
a job waiting out a retry against the old endpoint does not wait for its backoff."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from runtime.downloads.manager import DownloadManager, DownloadNotice, DownloadProgress
from runtime.downloads.queue import RetryPolicy
from runtime.hub.client import Hub
from runtime.paths import user_dirs
from tests.conftest import _REAL_DIRS
from tests.hubserver import TINY_REPO, FakeHub, Fault, add_tiny_repos
from tests.unit.downloads.test_downloads import Recorder, source_bytes, when_received

FILE = "tiny-F32.gguf"


@pytest.fixture
def mirror() -> Iterator[FakeHub]:
    """A second fake hub with the same repositories (same files, same commits)."""
    hub = FakeHub().start()
    add_tiny_repos(hub, _REAL_DIRS.cache / "test-models")
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def origin() -> Iterator[FakeHub]:
    hub = FakeHub().start()
    add_tiny_repos(hub, _REAL_DIRS.cache / "test-models")
    try:
        yield hub
    finally:
        hub.stop()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_job_in_flight_moves_to_the_new_endpoint_keeping_its_bytes(
        origin: FakeHub, mirror: FakeHub) -> None:
    recorder = Recorder(user_dirs().models)
    # The origin stalls at byte 500,000; after the stall detector (1 s) an ordinary retry
    # would wait 10 minutes. The move must not wait for that.
    policy = RetryPolicy(max_attempts=4, initial_delay=600.0, max_delay=600.0,
                         stall_timeout=1.0, connect_timeout=5.0)
    origin.set_fault(TINY_REPO, FILE, Fault(stall_at=500_000, stall_seconds=120))
    manager = DownloadManager(Hub(endpoint=origin.url), retry=policy, on_event=recorder,
                              progress_interval=0.0)
    manager.start()
    try:
        reached = when_received(recorder, 500_000)
        job = manager.enqueue(TINY_REPO, FILE)
        assert reached.wait(30)
        manager.set_hub(Hub(endpoint=mirror.url))
        [final] = manager.wait([job.id], timeout=30)
    finally:
        manager.shutdown(timeout=5)
    assert final.state == "done", final.error
    size = len(source_bytes(origin))
    assert mirror.stats(TINY_REPO, FILE).ranges == ["bytes=500000-"]
    assert mirror.stats(TINY_REPO, FILE).bytes_sent == size - 500_000
    assert any(f"now fetching from {mirror.url}" in n for n in recorder.notices())
    assert recorder.unverified_seen == []


def test_job_retrying_an_unreachable_endpoint_moves_without_waiting_its_backoff(
        mirror: FakeHub) -> None:
    recorder = Recorder(user_dirs().models)
    # After the first refusal the job would wait 10 minutes before its next attempt.
    policy = RetryPolicy(max_attempts=8, initial_delay=600.0, max_delay=600.0,
                         stall_timeout=5.0, connect_timeout=5.0)
    dead = Hub(endpoint=f"http://127.0.0.1:{closed_port()}")
    manager = DownloadManager(dead, retry=policy, on_event=recorder, progress_interval=0.0)
    manager.start()
    try:
        backing_off = threading.Event()
        recorder.hooks.append(lambda e: isinstance(e, DownloadNotice) and "retrying" in e.message
                              and backing_off.set())
        job = manager.enqueue(TINY_REPO, FILE)
        assert backing_off.wait(30)  # "retrying in 600.0 s": the worker sleeps its backoff
        manager.set_hub(Hub(endpoint=mirror.url))
        [final] = manager.wait([job.id], timeout=30)
    finally:
        manager.shutdown(timeout=5)
    assert final.state == "done", final.error
    assert mirror.stats(TINY_REPO, FILE).gets == 1
    assert any(isinstance(e, DownloadProgress) for e in recorder.events)
    assert [e.job_id for e in recorder.events if isinstance(e, DownloadNotice)
            and "now fetching" in e.message] == [job.id]
