"""The download manager against the fake hub: byte counters prove nothing is fetched twice,
faults prove retries, and the library never shows an unverified file."""

from __future__ import annotations

import json
import threading
from collections import namedtuple
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime.downloads.manager import (
    DownloadEvent,
    DownloadManager,
    DownloadNotice,
    DownloadProgress,
    DownloadStateChanged,
)
from runtime.downloads.queue import DownloadJob, RetryPolicy
from runtime.hub.client import Hub
from runtime.paths import user_dirs
from tests.hubserver import GATED_REPO, GATED_TOKEN, TINY_REPO, FakeHub, Fault
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)

FILE = "tiny-F32.gguf"
# Tiny backoffs; a stall is 1 s without a byte (long enough that a busy machine is not one).
FAST = RetryPolicy(max_attempts=4, initial_delay=0.01, max_delay=0.05, stall_timeout=1.0,
                   connect_timeout=5.0)
ALWAYS = 1_000_000  # a fault that fires on every attempt


class Recorder:
    """Collects events; checks at each one that the library holds only verified files."""

    def __init__(self, models_dir: Path) -> None:
        self.events: list[DownloadEvent] = []
        self.models_dir = models_dir
        self.unverified_seen: list[str] = []
        self.hooks: list[Callable[[DownloadEvent], None]] = []
        self._lock = threading.Lock()

    def __call__(self, event: DownloadEvent) -> None:
        with self._lock:
            self.events.append(event)
        done = isinstance(event, DownloadStateChanged) and event.job.state == "done"
        if not done and self.models_dir.exists():
            for path in self.models_dir.rglob("*"):
                if path.is_file() and path.name.endswith(".gguf") and not self._was_done(path):
                    self.unverified_seen.append(str(path))
        for hook in self.hooks:
            hook(event)

    def _was_done(self, path: Path) -> bool:
        return any(isinstance(e, DownloadStateChanged) and e.job.state == "done"
                   and e.job.path == str(path) for e in self.events)

    def notices(self) -> list[str]:
        return [e.message for e in self.events if isinstance(e, DownloadNotice)]

    def states(self, job_id: str) -> list[str]:
        return [e.job.state for e in self.events
                if isinstance(e, DownloadStateChanged) and e.job.id == job_id]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder(user_dirs().models)


@pytest.fixture
def manager(fake_hub: FakeHub, recorder: Recorder) -> Iterator[DownloadManager]:  # noqa: F811
    m = DownloadManager(Hub(), retry=FAST, on_event=recorder, progress_interval=0.0)
    m.start()
    yield m
    m.shutdown(timeout=5)


def source_bytes(hub: FakeHub, repo: str = TINY_REPO, name: str = FILE) -> bytes:
    blob = hub.repo(repo).files("main")[name]  # type: ignore[index]
    return blob.read(0, blob.size)


def wait_done(manager: DownloadManager, job: DownloadJob) -> DownloadJob:
    [final] = manager.wait([job.id], timeout=60)
    return final


def when_received(recorder: Recorder, n: int) -> threading.Event:
    """An event set once a progress event reports at least `n` bytes."""
    reached = threading.Event()

    def hook(e: DownloadEvent) -> None:
        if isinstance(e, DownloadProgress) and e.received >= n:
            reached.set()

    recorder.hooks.append(hook)
    return reached


def test_download_lands_verified_in_the_library(fake_hub: FakeHub, manager: DownloadManager,  # noqa: F811
                                                recorder: Recorder) -> None:
    job = manager.enqueue(TINY_REPO, FILE)
    final = wait_done(manager, job)
    assert final.state == "done", final.error
    path = Path(final.path or "")
    assert path == user_dirs().models / "tiny" / "Tiny-GGUF" / FILE
    assert path.read_bytes() == source_bytes(fake_hub)
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.bytes_sent == len(source_bytes(fake_hub))
    assert stats.ranges == [None]
    assert recorder.states(job.id) == ["queued", "running", "done"]
    progress = [e for e in recorder.events if isinstance(e, DownloadProgress)]
    assert [p.received for p in progress] == sorted(p.received for p in progress)
    assert progress[-1].received == progress[-1].total == path.stat().st_size
    assert not list(manager.downloads_dir.glob("*.part"))
    assert recorder.unverified_seen == []


def test_second_enqueue_of_a_done_file_downloads_nothing(fake_hub: FakeHub,  # noqa: F811
                                                        manager: DownloadManager) -> None:
    first = wait_done(manager, manager.enqueue(TINY_REPO, FILE))
    again = manager.enqueue(TINY_REPO, FILE)
    assert again.id == first.id and again.state == "done"
    assert fake_hub.stats(TINY_REPO, FILE).gets == 1


def test_dropped_connection_resumes_without_refetching_a_byte(
        fake_hub: FakeHub, manager: DownloadManager, recorder: Recorder) -> None:  # noqa: F811
    size = len(source_bytes(fake_hub))
    fake_hub.set_fault(TINY_REPO, FILE, Fault(drop_at=1_000_000))
    final = wait_done(manager, manager.enqueue(TINY_REPO, FILE))
    assert final.state == "done", final.error
    fake_hub.set_fault(TINY_REPO, "tiny-Q4_K_M.gguf", Fault(drop_at=400_000))
    other = wait_done(manager, manager.enqueue(TINY_REPO, "tiny-Q4_K_M.gguf"))
    assert other.state == "done", other.error
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges[:2] == [None, "bytes=1000000-"]
    assert stats.bytes_sent == size  # every byte crossed the wire exactly once
    assert "bytes=400000-" in fake_hub.stats(TINY_REPO, "tiny-Q4_K_M.gguf").ranges
    assert Path(final.path or "").read_bytes() == source_bytes(fake_hub)
    assert any("connection lost" in n or "closed the file" in n for n in recorder.notices())
    assert recorder.unverified_seen == []


def test_stall_is_noticed_and_retried_from_the_partial(
        fake_hub: FakeHub, manager: DownloadManager, recorder: Recorder) -> None:  # noqa: F811
    size = len(source_bytes(fake_hub))
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=500_000, stall_seconds=10))
    final = wait_done(manager, manager.enqueue(TINY_REPO, FILE))
    assert final.state == "done", final.error
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges[:2] == [None, "bytes=500000-"]
    assert stats.bytes_sent == size
    assert any("stalled" in n for n in recorder.notices())


def test_server_errors_are_retried_with_backoff(fake_hub: FakeHub, manager: DownloadManager,  # noqa: F811
                                                recorder: Recorder) -> None:
    fake_hub.set_fault(TINY_REPO, FILE, Fault(fail_first=3))
    final = wait_done(manager, manager.enqueue(TINY_REPO, FILE))
    assert final.state == "done", final.error
    assert fake_hub.stats(TINY_REPO, FILE).errors_500 == 3
    assert len([n for n in recorder.notices() if "retrying" in n]) == 3


def test_retries_run_out_into_a_typed_failure(fake_hub: FakeHub, manager: DownloadManager) -> None:  # noqa: F811
    fake_hub.set_fault(TINY_REPO, FILE, Fault(fail_first=100))
    final = wait_done(manager, manager.enqueue(TINY_REPO, FILE))
    assert final.state == "failed"
    assert final.error_kind == "DownloadFailed"
    assert "gave up after 4 attempts" in (final.error or "")
    assert fake_hub.stats(TINY_REPO, FILE).errors_500 == 4


def test_missing_file_is_a_404_error(fake_hub: FakeHub, manager: DownloadManager) -> None:  # noqa: F811
    final = wait_done(manager, manager.enqueue(TINY_REPO, "no-such-file.gguf"))
    assert final.state == "failed"
    assert final.error_kind == "RemoteFileNotFound"
    assert "no-such-file.gguf" in (final.error or "")


def test_gated_repo_asks_for_a_token_then_works_with_it(
        fake_hub: FakeHub, manager: DownloadManager, recorder: Recorder) -> None:  # noqa: F811
    name = "tiny-gated-F32.gguf"
    job = manager.enqueue(GATED_REPO, name)
    failed = wait_done(manager, job)
    assert failed.state == "failed" and failed.needs_token
    assert failed.error_kind == "GatedRepo"
    assert "token" in (failed.error or "")
    manager.set_token(GATED_TOKEN)
    manager.retry(job.id)
    final = wait_done(manager, job)
    assert final.state == "done", final.error
    assert Path(final.path or "").read_bytes() == source_bytes(fake_hub, GATED_REPO, name)
    # The token went to the Hub, never to the CDN, and is written nowhere.
    assert True in fake_hub.stats(GATED_REPO, name).auth
    assert GATED_TOKEN not in (manager.downloads_dir / "queue.json").read_text()
    assert GATED_TOKEN not in repr(manager)
    assert all(GATED_TOKEN not in n for n in recorder.notices())


def test_bytes_that_do_not_match_the_hash_are_kept_aside(
        fake_hub: FakeHub, manager: DownloadManager, recorder: Recorder) -> None:  # noqa: F811
    fake_hub.set_fault(TINY_REPO, FILE, Fault(corrupt=True))
    final = wait_done(manager, manager.enqueue(TINY_REPO, FILE))
    assert final.state == "failed"
    assert final.error_kind == "HashMismatch"
    assert not (user_dirs().models / "tiny" / "Tiny-GGUF" / FILE).exists()
    [bad] = manager.downloads_dir.glob("*.bad")
    assert bad.stat().st_size == len(source_bytes(fake_hub))
    assert recorder.unverified_seen == []
    # Retrying starts from zero (the bad bytes are not reused) and succeeds once the server heals.
    fake_hub.set_fault(TINY_REPO, FILE, None)
    manager.retry(final.id)
    healed = wait_done(manager, final)
    assert healed.state == "done"
    assert fake_hub.stats(TINY_REPO, FILE).ranges == [None, None]


def test_upstream_change_restarts_from_zero_and_says_so(
        fake_hub: FakeHub, manager: DownloadManager, recorder: Recorder) -> None:  # noqa: F811
    new = source_bytes(fake_hub, TINY_REPO, "tiny-Q4_K_M.gguf")
    fake_hub.set_fault(TINY_REPO, FILE, Fault(drop_at=700_000))
    changed = threading.Event()

    def new_revision_on_first_retry(e: DownloadEvent) -> None:
        if isinstance(e, DownloadNotice) and not changed.is_set():
            fake_hub.update_file(TINY_REPO, FILE, new)  # pushed while we wait to retry
            changed.set()

    recorder.hooks.append(new_revision_on_first_retry)
    final = wait_done(manager, manager.enqueue(TINY_REPO, FILE))
    assert final.state == "done", final.error
    assert Path(final.path or "").read_bytes() == new
    assert final.commit == fake_hub.repo(TINY_REPO).head
    assert any("changed upstream" in n and "from zero" in n for n in recorder.notices())
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges[:2] == [None, None]  # the restart asked for the new file from byte 0
    assert stats.bytes_sent == 700_000 + len(new)


def test_disk_full_is_a_typed_error_before_any_byte(fake_hub: FakeHub, recorder: Recorder) -> None:  # noqa: F811
    usage = namedtuple("usage", "total used free")

    def tiny_disk(path: Path) -> object:
        return usage(10_000, 9_000, 1_000)

    m = DownloadManager(Hub(), retry=FAST, on_event=recorder, disk_usage=tiny_disk)
    m.start()
    try:
        final = wait_done(m, m.enqueue(TINY_REPO, FILE))
    finally:
        m.shutdown(timeout=5)
    assert final.state == "failed"
    assert final.error_kind == "DiskFull"
    assert "free" in (final.error or "")
    assert fake_hub.stats(TINY_REPO, FILE).gets == 0


def test_queue_survives_a_restart_and_resumes_the_partial(
        fake_hub: FakeHub, recorder: Recorder) -> None:  # noqa: F811
    size = len(source_bytes(fake_hub))
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=1_200_000, stall_times=ALWAYS, stall_seconds=30))
    reached = when_received(recorder, 1_200_000)
    first = DownloadManager(Hub(), retry=FAST, on_event=recorder, progress_interval=0.0)
    first.start()
    job = first.enqueue(TINY_REPO, FILE)
    assert reached.wait(30)
    first.shutdown(timeout=10)  # the app quits mid-download

    fake_hub.set_fault(TINY_REPO, FILE, None)
    fake_hub.release_stalls()
    second = DownloadManager(Hub(), retry=FAST, on_event=recorder, progress_interval=0.0)
    [restored] = second.jobs()
    assert restored.id == job.id and restored.state == "queued"
    assert restored.received == 1_200_000
    second.start()
    try:
        final = wait_done(second, job)
    finally:
        second.shutdown(timeout=5)
    assert final.state == "done", final.error
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges[0] is None and stats.ranges[-1] == "bytes=1200000-"
    assert stats.bytes_sent == size
    assert Path(final.path or "").read_bytes() == source_bytes(fake_hub)


def test_a_crash_mid_download_resumes_from_the_partial(fake_hub: FakeHub,  # noqa: F811
                                                       recorder: Recorder) -> None:
    """What a killed process leaves: queue.json saying running, and a partial file."""
    data = source_bytes(fake_hub)
    dirs = user_dirs()
    dirs.downloads.mkdir(parents=True)
    (dirs.downloads / "abc123.part").write_bytes(data[:333_333])
    etag = fake_hub.repo(TINY_REPO).files("main")[FILE].sha256  # type: ignore[index]
    job = {"id": "abc123", "repo_id": TINY_REPO, "filename": FILE, "state": "running",
           "etag": etag, "sha256": etag, "commit": fake_hub.repo(TINY_REPO).head,
           "size": len(data), "added": 1.0}
    (dirs.downloads / "queue.json").write_text(json.dumps({"version": 1, "jobs": [job]}))
    m = DownloadManager(Hub(), retry=FAST, on_event=recorder)
    m.start()
    try:
        [final] = m.wait(["abc123"], timeout=60)
    finally:
        m.shutdown(timeout=5)
    assert final.state == "done", final.error
    assert fake_hub.stats(TINY_REPO, FILE).ranges == ["bytes=333333-"]
    assert fake_hub.stats(TINY_REPO, FILE).bytes_sent == len(data) - 333_333
    assert Path(final.path or "").read_bytes() == data


def test_pause_then_resume_continues_where_it_stopped(
        fake_hub: FakeHub, manager: DownloadManager, recorder: Recorder) -> None:  # noqa: F811
    size = len(source_bytes(fake_hub))
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=800_000, stall_times=ALWAYS, stall_seconds=30))
    reached = when_received(recorder, 800_000)
    job = manager.enqueue(TINY_REPO, FILE)
    assert reached.wait(30)
    manager.pause(job.id)
    assert manager.job(job.id).state == "paused"  # at once, even while the read is blocked
    fake_hub.set_fault(TINY_REPO, FILE, None)
    fake_hub.release_stalls()
    manager.resume(job.id)
    final = wait_done(manager, job)
    assert final.state == "done", final.error
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges[0] is None and stats.ranges[-1] == "bytes=800000-"
    assert stats.bytes_sent == size
    assert recorder.states(job.id)[:3] == ["queued", "running", "paused"]


def test_cancel_forgets_the_partial(fake_hub: FakeHub, manager: DownloadManager,  # noqa: F811
                                    recorder: Recorder) -> None:
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=400_000, stall_times=ALWAYS, stall_seconds=30))
    reached = when_received(recorder, 400_000)
    job = manager.enqueue(TINY_REPO, FILE)
    assert reached.wait(30)
    manager.cancel(job.id)
    fake_hub.release_stalls()
    manager.shutdown(timeout=10)  # joins the worker
    assert manager.job(job.id).state == "cancelled"
    assert not list(manager.downloads_dir.glob("*.part"))
    assert not (user_dirs().models / "tiny").exists() or not list((user_dirs().models / "tiny").rglob("*.gguf"))


def test_at_most_n_downloads_run_at_once(fake_hub: FakeHub, recorder: Recorder) -> None:  # noqa: F811
    running: set[str] = set()
    peak = [0]

    def track(e: DownloadEvent) -> None:
        if isinstance(e, DownloadStateChanged):
            (running.add if e.job.state == "running" else running.discard)(e.job.id)
            peak[0] = max(peak[0], len(running))

    recorder.hooks.append(track)
    m = DownloadManager(Hub(), retry=FAST, on_event=recorder, max_concurrent=1)
    jobs = [m.enqueue(TINY_REPO, n) for n in (FILE, "tiny-Q4_K_M.gguf", "tiny-Q8_0-00001-of-00002.gguf")]
    m.start()
    try:
        finals = m.wait([j.id for j in jobs], timeout=60)
    finally:
        m.shutdown(timeout=5)
    assert [f.state for f in finals] == ["done", "done", "done"]
    assert peak[0] == 1


def test_a_mirror_without_cdn_redirect_works_too(monkeypatch: pytest.MonkeyPatch,
                                                 tiny_draft: Path, recorder: Recorder) -> None:
    """Some HF_ENDPOINT mirrors serve resolve/ directly: the token then goes with the GET."""
    with FakeHub(lfs_redirect=False) as mirror:
        mirror.add_repo(GATED_REPO, {"m.gguf": tiny_draft}, gated=True, token=GATED_TOKEN)
        monkeypatch.setenv("HF_ENDPOINT", mirror.url)
        m = DownloadManager(Hub(token=GATED_TOKEN), retry=FAST, on_event=recorder)
        m.start()
        try:
            final = wait_done(m, m.enqueue(GATED_REPO, "m.gguf"))
        finally:
            m.shutdown(timeout=5)
        assert final.state == "done", final.error
        stats = mirror.stats(GATED_REPO, "m.gguf")
        assert (stats.heads, stats.gets, stats.bytes_sent) == (1, 1, tiny_draft.stat().st_size)
        assert stats.auth == [True, True]
