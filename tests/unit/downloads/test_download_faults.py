"""Downloads against a hostile server and a full disk: a body longer than the file is cut at
the file's size (a small excess and a promised 2 GiB alike) and the attempt fails in one line;
a partial file longer than the file, or unreadable, is discarded and restarted with a notice;
a disk that fills up, under the partial file or under queue.json, fails the download in one
line or goes on in memory, with no traceback; at most one bad copy is kept per job and it goes
once the file arrives; and no failure leaves a byte in the library or blocks the next pull."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime.atomic_file
import runtime.downloads.transfer
from runtime.cli.main import main
from runtime.downloads.manager import (
    DownloadEvent,
    DownloadManager,
    DownloadNotice,
    DownloadProgress,
    DownloadStateChanged,
    QueueSaveChanged,
)
from runtime.downloads.queue import DownloadJob, RetryPolicy
from runtime.errors import QueueNotSaved
from runtime.hub.client import Hub
from runtime.paths import user_dirs
from runtime.units import fmt_bytes
from tests.hubserver import TINY_REPO, FakeHub, Fault
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)

# A worker thread that dies prints a traceback: here that fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

FILE = "tiny-F32.gguf"
OTHER = "tiny-Q4_K_M.gguf"
FAST = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05, stall_timeout=5.0,
                   connect_timeout=5.0)
# What may cross the wire past the file's end before the client hangs up: the chunk that
# crosses it and what the loopback socket buffers hold. Far below what the server promised.
SLACK = 32 << 20


class Events:
    """A manager's events, and the sizes the partial file had at each progress event."""

    def __init__(self) -> None:
        self.all: list[DownloadEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: DownloadEvent) -> None:
        with self._lock:
            self.all.append(event)

    def of(self, kind: type) -> list[Any]:
        with self._lock:
            return [e for e in self.all if isinstance(e, kind)]

    def notices(self) -> list[str]:
        return [e.message for e in self.of(DownloadNotice)]


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def manager(fake_hub: FakeHub, events: Events) -> Iterator[DownloadManager]:  # noqa: F811
    m = DownloadManager(Hub(), retry=FAST, on_event=events, progress_interval=0.0)
    m.start()
    yield m
    m.shutdown(timeout=5)


def source(hub: FakeHub, name: str = FILE) -> bytes:
    blob = hub.repo(TINY_REPO).files("main")[name]  # type: ignore[index]
    return blob.read(0, blob.size)


def settle(manager: DownloadManager, job: DownloadJob) -> DownloadJob:
    [final] = manager.wait([job.id], timeout=60)
    return final


def library_files() -> list[Path]:
    """Every file in the models folder, dot-files (a half-copied `.incoming`) included."""
    models = user_dirs().models
    return sorted(p for p in models.rglob("*") if p.is_file()) if models.exists() else []


def no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def write_queue(*jobs: dict[str, Any]) -> None:
    """What an earlier run left: queue.json with these jobs."""
    downloads = user_dirs().downloads
    downloads.mkdir(parents=True, exist_ok=True)
    (downloads / "queue.json").write_text(json.dumps({"version": 1, "jobs": list(jobs)}))


def known_job(hub: FakeHub, state: str, **more: Any) -> dict[str, Any]:
    data = source(hub)
    etag = hub.repo(TINY_REPO).files("main")[FILE].sha256  # type: ignore[index]
    return {"id": "abc123", "repo_id": TINY_REPO, "filename": FILE, "state": state,
            "etag": etag, "sha256": etag, "commit": hub.repo(TINY_REPO).head,
            "size": len(data), "added": 1.0, **more}


# -- a body longer than the file -----------------------------------------------------------


@pytest.mark.parametrize(("extra", "framing"), [
    (50 << 20, "length"),  # Content-Length says 50 MiB more than the Hub advertised
    (2 << 30, "length"),  # ... 2 GiB more
    (2 << 30, "close"),  # no length at all: 2 GiB more, until the client hangs up
], ids=["50MiB-declared", "2GiB-declared", "2GiB-unframed"])
def test_a_body_longer_than_the_file_stops_at_its_size(
        fake_hub: FakeHub, manager: DownloadManager, events: Events,  # noqa: F811
        capfd: pytest.CaptureFixture[str], extra: int, framing: str) -> None:
    data = source(fake_hub)
    fake_hub.set_fault(TINY_REPO, FILE, Fault(extra=extra, extra_framing=framing))  # type: ignore[arg-type]
    job = manager.enqueue(TINY_REPO, FILE)
    failed = settle(manager, job)
    assert failed.state == "failed" and failed.error_kind == "OversizedDownload"
    assert (failed.error or "").startswith("the server sent more than the file's size")
    assert "\n" not in (failed.error or "")
    # Never a byte past the size: not on disk, not in any progress report.
    assert manager.job(job.id).received == len(data)
    assert max(p.received for p in events.of(DownloadProgress)) == len(data)
    assert fake_hub.stats(TINY_REPO, FILE).bytes_sent < len(data) + SLACK
    assert library_files() == []
    no_traceback(capfd)

    # The next pull is not blocked: the bytes up to the size are checked, and they are the file.
    fake_hub.set_fault(TINY_REPO, FILE, None)
    again = manager.enqueue(TINY_REPO, FILE)
    assert again.id == job.id
    done = settle(manager, job)
    assert done.state == "done", done.error
    assert Path(done.path or "").read_bytes() == data
    assert fake_hub.stats(TINY_REPO, FILE).gets == 1  # nothing fetched again


def test_bytes_past_content_length_are_never_read(fake_hub: FakeHub,  # noqa: F811
                                                  manager: DownloadManager) -> None:
    data = source(fake_hub)
    fake_hub.set_fault(TINY_REPO, FILE, Fault(extra=4096, extra_framing="after-length"))
    done = settle(manager, manager.enqueue(TINY_REPO, FILE))
    assert done.state == "done", done.error
    assert Path(done.path or "").read_bytes() == data
    # The connection that carried the junk is not reused for the next file.
    other = settle(manager, manager.enqueue(TINY_REPO, OTHER))
    assert other.state == "done", other.error
    assert Path(other.path or "").read_bytes() == source(fake_hub, OTHER)


# -- a partial file left from before -------------------------------------------------------


def test_a_partial_longer_than_the_file_is_discarded_and_restarted(
        fake_hub: FakeHub, events: Events) -> None:  # noqa: F811
    """What an older Outrider left after a server sent too much: a partial past the size."""
    data = source(fake_hub)
    write_queue(known_job(fake_hub, "failed", error_kind="HashMismatch", error="too long"))
    (user_dirs().downloads / "abc123.part").write_bytes(data + bytes(50_000))
    m = DownloadManager(Hub(), retry=FAST, on_event=events)
    m.start()
    try:
        m.retry("abc123")
        [done] = m.wait(["abc123"], timeout=60)
    finally:
        m.shutdown(timeout=5)
    assert done.state == "done", done.error
    assert Path(done.path or "").read_bytes() == data
    [note] = [n for n in events.notices() if "partial" in n]
    assert "longer than the file" in note and "restarting from zero" in note
    assert "\n" not in note
    assert fake_hub.stats(TINY_REPO, FILE).ranges == [None]  # fetched whole, from byte 0


def test_an_unreadable_partial_is_discarded_and_restarted(
        fake_hub: FakeHub, events: Events, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    data = source(fake_hub)
    write_queue(known_job(fake_hub, "running"))
    (user_dirs().downloads / "abc123.part").write_bytes(data[:300_000])

    def unreadable(path: Path, length: int, chunk: int = 0) -> object:
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(runtime.downloads.transfer, "sha256_prefix", unreadable)
    m = DownloadManager(Hub(), retry=FAST, on_event=events)
    m.start()
    try:
        [done] = m.wait(["abc123"], timeout=60)
    finally:
        m.shutdown(timeout=5)
    assert done.state == "done", done.error
    assert Path(done.path or "").read_bytes() == data
    assert any("cannot be read (Input/output error)" in n and "restarting from zero" in n
               for n in events.notices())
    assert fake_hub.stats(TINY_REPO, FILE).ranges == [None]


# -- a full disk ---------------------------------------------------------------------------


class Disk:
    """A disk that fills up: files opened through `open` take `room` more bytes, then each
    write fails with ENOSPC (having written what fit); `usage` reports what is left."""

    def __init__(self, room: int, only: str = "") -> None:
        self.room = room
        self.only = only  # fill up only for files whose name contains this
        self.usage_free = 10 << 30

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        real = open(file, mode, *args, **kwargs)  # noqa: SIM115  (returned, as open does)
        writing = "w" in mode or "a" in mode
        if not writing or self.only not in os.fspath(file):
            return real
        disk = self

        class Filling:
            def __init__(self) -> None:
                self._f = real

            def write(self, data: Any) -> int:
                view = memoryview(data).cast("B") if not isinstance(data, str) else data
                fits = min(len(view), max(disk.room, 0))
                if fits:
                    self._f.write(view[:fits])
                    disk.room -= fits
                if fits < len(view):
                    disk.usage_free = 0
                    raise OSError(errno.ENOSPC, "No space left on device")
                return fits

            def __getattr__(self, name: str) -> Any:
                return getattr(self._f, name)

            def __enter__(self) -> Filling:
                return self

            def __exit__(self, *exc: object) -> None:
                self._f.close()

        return Filling()

    def usage(self, path: Path) -> Any:
        return shutil._ntuple_diskusage(20 << 30, (20 << 30) - self.usage_free, self.usage_free)  # type: ignore[attr-defined]


def test_disk_full_mid_download_fails_in_one_line_and_keeps_the_bytes(
        fake_hub: FakeHub, events: Events, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capfd: pytest.CaptureFixture[str]) -> None:
    data = source(fake_hub)
    at = 700_000
    disk = Disk(room=at, only=".part")
    m = DownloadManager(Hub(), retry=FAST, on_event=events, disk_usage=disk.usage)
    m.start()
    try:
        with monkeypatch.context() as patched:
            patched.setattr(runtime.downloads.transfer, "open", disk.open, raising=False)
            job = m.enqueue(TINY_REPO, FILE)
            failed = settle(m, job)
        assert failed.state == "failed" and failed.error_kind == "DiskFull"
        downloads = m.downloads_dir
        assert failed.error == (f"disk full: 0 B free on {downloads}, "
                                f"{fmt_bytes(len(data) - at)} needed for {FILE}")
        assert m.job(job.id).received == at  # what fit is kept, for the retry
        assert library_files() == []
        no_traceback(capfd)

        disk.usage_free = 10 << 30  # room again: the retry resumes where the disk filled up
        m.retry(job.id)
        done = settle(m, job)
    finally:
        m.shutdown(timeout=5)
    assert done.state == "done", done.error
    assert Path(done.path or "").read_bytes() == data
    assert fake_hub.stats(TINY_REPO, FILE).ranges[-1] == f"bytes={at}-"


def test_disk_full_while_copying_into_another_file_system_leaves_nothing_in_the_library(
        fake_hub: FakeHub, manager: DownloadManager, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capfd: pytest.CaptureFixture[str]) -> None:
    """The models folder on another disk: the verified file is copied there, and the copy
    fills that disk halfway."""
    data = source(fake_hub)
    replace, copyfile = os.replace, shutil.copyfile

    def across_disks(src: Any, dst: Any) -> None:
        if str(src).endswith(".part") and user_dirs().models in Path(dst).parents:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        replace(src, dst)

    def filling(src: Any, dst: Any) -> None:
        Path(dst).write_bytes(Path(src).read_bytes()[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", across_disks)
        patched.setattr(shutil, "copyfile", filling)
        job = manager.enqueue(TINY_REPO, FILE)
        failed = settle(manager, job)
        assert failed.state == "failed" and failed.error_kind == "DiskFull"
        assert re.fullmatch(r"disk full: .+ free on .+, .+ needed for tiny-F32\.gguf",
                            failed.error or "")
        assert library_files() == []  # not even a hidden half copy
        assert manager.job(job.id).received == len(data)  # the verified bytes wait in downloads/
        no_traceback(capfd)

        patched.setattr(shutil, "copyfile", copyfile)  # room on the other disk again
        manager.retry(job.id)
        done = settle(manager, job)
    assert done.state == "done", done.error
    assert Path(done.path or "").read_bytes() == data
    assert fake_hub.stats(TINY_REPO, FILE).gets == 1  # the retry fetched nothing


def test_a_full_disk_under_the_queue_file_stops_no_download(
        fake_hub: FakeHub, events: Events, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capfd: pytest.CaptureFixture[str]) -> None:
    data = source(fake_hub)
    downloads = user_dirs().downloads
    queue_json = downloads / "queue.json"
    m = DownloadManager(Hub(), retry=FAST, on_event=events, progress_interval=0.0)
    disk = Disk(room=0, only=".queue-")
    with monkeypatch.context() as patched:
        patched.setattr(runtime.atomic_file, "open", disk.open, raising=False)
        # A new download needs the file: refused in one line, nothing queued.
        with pytest.raises(QueueNotSaved, match=r"^disk full: the download queue could not be"):
            m.enqueue(TINY_REPO, OTHER)
    assert m.jobs() == []

    job = m.enqueue(TINY_REPO, FILE)
    on_file = queue_json.read_text()
    disk.room = 200  # the next write fills the disk partway through
    try:
        with monkeypatch.context() as patched:
            patched.setattr(runtime.atomic_file, "open", disk.open, raising=False)
            m.start()
            done = settle(m, job)
            assert done.state == "done", done.error  # running, done: all in memory
            assert Path(done.path or "").read_bytes() == data
            assert queue_json.read_text() == on_file  # the old file, whole
            assert not list(downloads.glob(".queue-*"))  # no half-written temporary file
            problems = events.of(QueueSaveChanged)
            assert [p.problem is not None for p in problems] == [True]  # said once
            assert problems[0].problem.startswith("disk full: ")
            no_traceback(capfd)
        later = m.enqueue(TINY_REPO, OTHER)  # room again: the next write catches up
        settle(m, later)
    finally:
        m.shutdown(timeout=5)
    assert [p.problem for p in events.of(QueueSaveChanged)][1:] == [None]
    records = {j["id"]: j for j in json.loads(queue_json.read_text())["jobs"]}
    assert records[job.id]["state"] == "done" and records[job.id]["path"] == done.path
    assert records[later.id]["state"] == "done"
    no_traceback(capfd)


def test_changes_kept_off_a_full_disk_are_written_at_shutdown(
        fake_hub: FakeHub, events: Events, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    queue_json = user_dirs().downloads / "queue.json"
    m = DownloadManager(Hub(), retry=FAST, on_event=events)
    job = m.enqueue(TINY_REPO, FILE)
    with monkeypatch.context() as patched:
        patched.setattr(runtime.atomic_file, "open", Disk(room=0, only=".queue-").open,
                        raising=False)
        m.pause(job.id)
        m.cancel(job.id)
        m.remove(job.id)  # forgotten here at once; on file still, until a write succeeds
        assert m.jobs() == []
        assert [j["id"] for j in json.loads(queue_json.read_text())["jobs"]] == [job.id]
    m.shutdown(timeout=5)
    assert json.loads(queue_json.read_text())["jobs"] == []
    assert [p.problem is None for p in events.of(QueueSaveChanged)] == [False, True]


# -- copies kept aside ---------------------------------------------------------------------


def test_one_bad_copy_is_kept_per_job_and_a_success_deletes_it(
        fake_hub: FakeHub, manager: DownloadManager) -> None:  # noqa: F811
    data = source(fake_hub)
    fake_hub.set_fault(TINY_REPO, FILE, Fault(corrupt=True))
    job = manager.enqueue(TINY_REPO, FILE)
    for attempt in (1, 2):
        if attempt == 2:
            manager.retry(job.id)
        failed = settle(manager, job)
        assert failed.error_kind == "HashMismatch"
        [bad] = manager.downloads_dir.glob("*.bad")  # the second replaced the first
        assert bad.stat().st_size == len(data)
        assert manager.job(job.id).leftover == len(data)
    fake_hub.set_fault(TINY_REPO, FILE, None)
    manager.retry(job.id)
    done = settle(manager, job)
    assert done.state == "done", done.error
    assert list(manager.downloads_dir.glob("*.bad")) == []
    assert manager.job(job.id).leftover == 0
    assert Path(done.path or "").read_bytes() == data


def test_a_bad_copy_left_from_before_goes_once_the_file_arrives(
        fake_hub: FakeHub, events: Events) -> None:  # noqa: F811
    data = source(fake_hub)
    write_queue(known_job(fake_hub, "failed", error_kind="HashMismatch", error="damaged"))
    bad = user_dirs().downloads / f"{FILE}.abc123.bad"
    bad.write_bytes(data[::-1])
    m = DownloadManager(Hub(), retry=FAST, on_event=events)
    assert m.job("abc123").leftover == len(data)
    m.start()
    try:
        m.retry("abc123")
        [done] = m.wait(["abc123"], timeout=60)
    finally:
        m.shutdown(timeout=5)
    assert done.state == "done", done.error
    assert not bad.exists()
    final = [e.job for e in events.of(DownloadStateChanged) if e.job.state == "done"]
    assert [j.leftover for j in final] == [0]


def test_delete_files_frees_what_a_failed_job_left(fake_hub: FakeHub,  # noqa: F811
                                                   events: Events) -> None:
    data = source(fake_hub)
    write_queue(known_job(fake_hub, "failed", error_kind="DiskFull", error="disk full: ..."))
    downloads = user_dirs().downloads
    (downloads / "abc123.part").write_bytes(data[:400_000])
    (downloads / f"{FILE}.abc123.bad").write_bytes(data)
    m = DownloadManager(Hub(), retry=FAST, on_event=events)
    m.start()
    try:
        assert m.job("abc123").leftover == 400_000 + len(data)
        assert m.delete_files("abc123") == 400_000 + len(data)
        assert sorted(p.name for p in downloads.iterdir() if not p.name.startswith("queue.json")
                      and not p.name.endswith(".lock")) == []
        [shown] = [e.job for e in events.of(DownloadStateChanged)]
        assert (shown.state, shown.leftover, shown.received) == ("failed", 0, 0)
        m.retry("abc123")  # from zero now
        [done] = m.wait(["abc123"], timeout=60)
    finally:
        m.shutdown(timeout=5)
    assert done.state == "done", done.error
    assert fake_hub.stats(TINY_REPO, FILE).ranges == [None]


def test_remove_deletes_the_bad_copy_too(fake_hub: FakeHub,  # noqa: F811
                                         manager: DownloadManager) -> None:
    fake_hub.set_fault(TINY_REPO, FILE, Fault(corrupt=True))
    job = manager.enqueue(TINY_REPO, FILE)
    assert settle(manager, job).error_kind == "HashMismatch"
    assert list(manager.downloads_dir.glob("*.bad"))
    manager.remove(job.id)
    assert list(manager.downloads_dir.glob("*.bad")) == []
    assert list(manager.downloads_dir.glob("*.part")) == []


def test_pull_after_an_oversized_body_is_not_blocked(fake_hub: FakeHub,  # noqa: F811
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`outrider pull` says what went wrong in one line and what it kept; the next pull ends it."""
    data = source(fake_hub)
    fake_hub.set_fault(TINY_REPO, FILE, Fault(extra=2 << 30, extra_framing="close"))
    assert main(["pull", f"{TINY_REPO}:{FILE}"]) == 2
    out, err = capsys.readouterr()
    progress, line = [ln for ln in err.splitlines() if "the server sent more" in ln]
    assert progress.startswith(f"{FILE}: failed: ")
    assert f"{fmt_bytes(len(data))} is kept in {user_dirs().downloads} for the next pull" in line
    assert "Traceback" not in err and out == ""
    assert library_files() == []

    fake_hub.set_fault(TINY_REPO, FILE, None)
    assert main(["pull", f"{TINY_REPO}:{FILE}"]) == 0
    out, err = capsys.readouterr()
    assert Path(out.strip()).read_bytes() == data
    assert fake_hub.stats(TINY_REPO, FILE).gets == 1  # the kept bytes were the file
