"""One job, one downloader: a job another Outrider process is fetching (it holds the job's lock)
is watched, never fetched twice; it is taken up, from its partial file, when that process stops
or dies before the end; `outrider pull` waits for it. The fake hub's byte counters prove who
fetched what, and every wait is on an event (a manager's event, a child's line)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from runtime.downloads.manager import (
    DownloadEvent,
    DownloadManager,
    DownloadProgress,
    DownloadStateChanged,
)
from runtime.downloads.queue import DownloadJob, QueueFile, RetryPolicy
from runtime.errors import DownloadRunningElsewhere
from runtime.hub.client import Hub
from runtime.paths import user_dirs
from tests.hubserver import TINY_REPO, FakeHub, Fault
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[3]
FILE = "tiny-F32.gguf"
AT = 600_000  # where the first download stalls
FAST = RetryPolicy(max_attempts=4, initial_delay=0.01, max_delay=0.05, stall_timeout=1.0,
                   connect_timeout=5.0)
# The other process: it sits in the stall until the test releases it (no retry meanwhile).
PATIENT = RetryPolicy(max_attempts=4, initial_delay=0.01, max_delay=0.05, stall_timeout=60.0,
                      connect_timeout=5.0)
WATCH = 0.02  # watch_interval of the manager that watches

# A manager in its own process: downloads FILE, says "reached <job>" once AT bytes are in, then
# runs until killed.
PULLER = f"""
import sys
from runtime.downloads.queue import RetryPolicy
from runtime.downloads.manager import DownloadManager, DownloadProgress
from runtime.hub.client import Hub
said = []
def on_event(e):
    if isinstance(e, DownloadProgress) and e.received >= {AT} and not said:
        said.append(e)
        print("reached", e.job_id, flush=True)
m = DownloadManager(Hub(), retry=RetryPolicy(stall_timeout=60.0), on_event=on_event,
                    progress_interval=0.0)
m.start()
m.enqueue("{TINY_REPO}", "{FILE}")
sys.stdin.readline()
"""

# Holds a lock file until its stdin closes (a clean exit) or it is killed.
HOLDER = """
import sys
import filelock
lock = filelock.FileLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()
"""


class Events:
    """A manager's events, with thresholds to wait on."""

    def __init__(self) -> None:
        self.events: list[DownloadEvent] = []
        self._lock = threading.Lock()
        self._waits: list[tuple[Callable[[list[DownloadEvent]], bool], threading.Event]] = []

    def __call__(self, event: DownloadEvent) -> None:
        with self._lock:
            self.events.append(event)
            for test, reached in self._waits:
                if test(self.events):
                    reached.set()

    def when(self, test: Callable[[list[DownloadEvent]], bool]) -> threading.Event:
        reached = threading.Event()
        with self._lock:
            self._waits.append((test, reached))
            if test(self.events):
                reached.set()
        return reached

    def watched(self, job_id: str, polls: int = 3) -> threading.Event:
        """Set once the job showed as running elsewhere and was looked at `polls` times."""
        return self.when(lambda events: any(
            isinstance(e, DownloadStateChanged) and e.job.elsewhere for e in events) and sum(
            isinstance(e, DownloadProgress) and e.job_id == job_id for e in events) >= polls)

    def changed(self, job_id: str) -> threading.Event:
        """Set once a state change of the job was announced."""
        return self.when(lambda events: bool(self.states(job_id, events)))

    def received(self, n: int) -> threading.Event:
        return self.when(lambda events: any(
            isinstance(e, DownloadProgress) and e.received >= n for e in events))

    def states(self, job_id: str,
               events: list[DownloadEvent] | None = None) -> list[tuple[str, bool]]:
        """(state, elsewhere) of each state change of the job."""
        return [(e.job.state, e.job.elsewhere) for e in (self.events if events is None else events)
                if isinstance(e, DownloadStateChanged) and e.job.id == job_id]


def source(hub: FakeHub) -> bytes:
    blob = hub.repo(TINY_REPO).files("main")[FILE]  # type: ignore[index]
    return blob.read(0, blob.size)


def child(code: str, *args: str, stderr: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def library_file() -> Path:
    return user_dirs().models / "tiny" / "Tiny-GGUF" / FILE


def test_a_download_in_another_manager_is_watched_not_fetched(fake_hub: FakeHub) -> None:  # noqa: F811
    """B leaves A's download alone, shows it running elsewhere with its progress, refuses to
    pause or cancel it, and shows it done when A finishes."""
    size = len(source(fake_hub))
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=AT, stall_seconds=60))
    a_events, b_events = Events(), Events()
    a = DownloadManager(Hub(), retry=PATIENT, on_event=a_events, progress_interval=0.0)
    b: DownloadManager | None = None
    try:
        reached = a_events.received(AT)
        a.start()
        job = a.enqueue(TINY_REPO, FILE)
        assert reached.wait(30)
        b = DownloadManager(Hub(), retry=FAST, on_event=b_events, watch_interval=WATCH)
        watched = b_events.watched(job.id)
        b.start()
        assert watched.wait(30)
        view = b.job(job.id)
        assert (view.state, view.elsewhere, view.received, view.size) == ("running", True, AT, size)
        assert fake_hub.stats(TINY_REPO, FILE).gets == 1  # A's GET, none from B
        for action in (b.pause, b.cancel):
            with pytest.raises(DownloadRunningElsewhere, match="another Outrider process"):
                action(job.id)
        assert (b.downloads_dir / f"{job.id}.part").stat().st_size == AT
        assert b.job(job.id).elsewhere

        fake_hub.release_stalls()  # A's connection drops; A resumes and finishes
        [final] = b.wait([job.id], timeout=60)
        assert final.state == "done", final.error
        assert (final.path, final.elsewhere) == (str(library_file()), False)
        assert b_events.states(job.id) == [("running", True), ("done", False)]
        b.remove(job.id)
    finally:
        a.shutdown(timeout=5)
        if b is not None:
            b.shutdown(timeout=5)
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges == [None, f"bytes={AT}-"]  # both A's
    assert stats.bytes_sent == size
    assert library_file().read_bytes() == source(fake_hub)
    assert sorted(p.name for p in a.downloads_dir.iterdir()) == ["queue.json", "queue.json.lock"]


def test_a_lock_released_unfinished_is_taken_up_from_the_partial(fake_hub: FakeHub) -> None:  # noqa: F811
    """Another process holds the job's lock over a partial file, then exits without finishing:
    B, which was watching, resumes the partial and verifies the whole file."""
    data = source(fake_hub)
    downloads = user_dirs().downloads
    downloads.mkdir(parents=True)
    (downloads / "abc123.part").write_bytes(data[:AT])
    sha = fake_hub.repo(TINY_REPO).files("main")[FILE].sha256  # type: ignore[index]
    record = {"id": "abc123", "repo_id": TINY_REPO, "filename": FILE, "state": "running",
              "etag": sha, "sha256": sha, "commit": fake_hub.repo(TINY_REPO).head,
              "size": len(data), "added": 1.0}
    (downloads / "queue.json").write_text(json.dumps({"version": 1, "jobs": [record]}))
    holder = child(HOLDER, str(downloads / "abc123.part.lock"))
    events = Events()
    b = DownloadManager(Hub(), retry=FAST, on_event=events, watch_interval=WATCH)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        watched = events.watched("abc123")
        b.start()
        assert watched.wait(30)
        assert b.job("abc123").received == AT
        with pytest.raises(DownloadRunningElsewhere):
            b.cancel("abc123")
        assert (downloads / "abc123.part").stat().st_size == AT  # not deleted under its owner
        assert fake_hub.stats(TINY_REPO, FILE).gets == 0

        assert holder.stdin is not None
        holder.stdin.close()  # it exits: the lock is free, the job unfinished
        assert holder.wait(30) == 0
        [final] = b.wait(["abc123"], timeout=60)
    finally:
        stop(holder)
        b.shutdown(timeout=5)
    assert final.state == "done", final.error
    assert events.states("abc123") == [("running", True), ("queued", False),
                                       ("running", False), ("done", False)]
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges == [f"bytes={AT}-"]
    assert stats.bytes_sent == len(data) - AT
    assert library_file().read_bytes() == data  # and it passed the sha256 check to get there


def test_a_killed_downloader_leaves_a_lock_taken_at_once(fake_hub: FakeHub) -> None:  # noqa: F811
    """A process killed mid-download: the kernel dropped its lock, so the next manager takes
    the job at once (never showing it elsewhere) and resumes from the bytes on disk."""
    data = source(fake_hub)
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=AT, stall_seconds=60))
    puller = child(PULLER)
    try:
        assert puller.stdout is not None
        word, job_id = puller.stdout.readline().split()
        assert word == "reached"
    finally:
        stop(puller)  # SIGKILL, mid-download, holding the job's lock
    events = Events()
    b = DownloadManager(Hub(), retry=FAST, on_event=events, watch_interval=WATCH)
    [restored] = b.jobs()
    # What reached the disk before the kill (Python's file buffer may have held the tail).
    on_disk = restored.received
    assert restored.id == job_id and restored.state == "queued" and 0 < on_disk <= AT
    b.start()
    try:
        [final] = b.wait([job_id], timeout=60)
    finally:
        b.shutdown(timeout=5)
    assert final.state == "done", final.error
    assert events.states(job_id) == [("running", False), ("done", False)]
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges == [None, f"bytes={on_disk}-"]
    assert stats.bytes_sent == len(data) + AT - on_disk
    assert library_file().read_bytes() == data


def test_a_started_manager_takes_in_jobs_another_process_adds(fake_hub: FakeHub) -> None:  # noqa: F811
    """The app (A) is running when `outrider pull` (B) queues files: A shows them, leaves them
    for B to start, shows B's download running there with its progress, then done; A fetches
    no byte of either file (B started one of them alone)."""
    size = len(source(fake_hub))
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=AT, stall_seconds=60))
    a_events, b_events = Events(), Events()
    a = DownloadManager(Hub(), retry=FAST, on_event=a_events, watch_interval=WATCH)
    b = DownloadManager(Hub(), retry=PATIENT, on_event=b_events, progress_interval=0.0)
    try:
        a.start()
        job = b.enqueue(TINY_REPO, FILE)
        assert a_events.changed(job.id).wait(30)
        # Once A took in a later job too, A had a round (and free slots) after taking in FILE.
        later = b.enqueue(TINY_REPO, "tiny-Q4_K_M.gguf")
        assert a_events.changed(later.id).wait(30)
        assert [a.job(i).state for i in (job.id, later.id)] == ["queued", "queued"]

        # Twice at AT: the second look read B's record after B had learned the size.
        watched = a_events.when(lambda events: sum(
            isinstance(e, DownloadProgress) and e.job_id == job.id and e.received >= AT
            for e in events) >= 2)
        b.start(only=[job.id])
        assert watched.wait(30)
        view = a.job(job.id)
        assert (view.state, view.elsewhere, view.received, view.size) == ("running", True, AT, size)
        fake_hub.release_stalls()  # B's connection drops; B resumes and finishes
        [final] = a.wait([job.id], timeout=60)
        assert (final.state, final.path) == ("done", str(library_file()))
    finally:
        b.shutdown(timeout=5)
        a.shutdown(timeout=5)
    assert a_events.states(job.id) == [("queued", False), ("running", True), ("done", False)]
    assert b_events.states(job.id) == [("queued", False), ("running", False), ("done", False)]
    assert a.job(later.id).state == "queued"
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges == [None, f"bytes={AT}-"]  # both B's: it never saw the job elsewhere
    assert stats.bytes_sent == size
    other = fake_hub.stats(TINY_REPO, "tiny-Q4_K_M.gguf")
    assert (other.heads, other.gets) == (0, 0)


def test_a_job_added_while_its_process_runs_it_shows_running_there(fake_hub: FakeHub) -> None:  # noqa: F811
    """A record appears in the queue file of a running manager with its lock held (a pull that
    queued and started it): shown running elsewhere at once, never fetched while the lock is
    held, and resumed from the partial once that process exits unfinished."""
    data = source(fake_hub)
    sha = fake_hub.repo(TINY_REPO).files("main")[FILE].sha256  # type: ignore[index]
    events = Events()
    a = DownloadManager(Hub(), retry=FAST, on_event=events, watch_interval=WATCH)
    downloads = a.downloads_dir  # made by the manager, which read the (empty) queue
    (downloads / "abc123.part").write_bytes(data[:AT])
    holder = child(HOLDER, str(downloads / "abc123.part.lock"))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        a.start()
        watched = events.watched("abc123")
        QueueFile(downloads / "queue.json").update([DownloadJob(
            id="abc123", repo_id=TINY_REPO, filename=FILE, state="running", etag=sha,
            sha256=sha, commit=fake_hub.repo(TINY_REPO).head, size=len(data), added=1.0)])
        assert watched.wait(30)
        assert a.job("abc123").received == AT
        assert fake_hub.stats(TINY_REPO, FILE).gets == 0
        assert holder.stdin is not None
        holder.stdin.close()  # it exits: the lock is free, the job unfinished
        assert holder.wait(30) == 0
        [final] = a.wait(["abc123"], timeout=60)
    finally:
        stop(holder)
        a.shutdown(timeout=5)
    assert final.state == "done", final.error
    assert events.states("abc123") == [("running", True), ("queued", False),
                                       ("running", False), ("done", False)]
    assert fake_hub.stats(TINY_REPO, FILE).ranges == [f"bytes={AT}-"]
    assert library_file().read_bytes() == data


class Lines:
    """A child's stream read on a thread, so the test can wait for a line with a timeout."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self.closed = False
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put("")  # closed

    def until(self, text: str, timeout: float = 60) -> bool:
        """Read up to a line holding `text` (True), or to the end of the stream (False)."""
        while not self.closed:
            line = self._queue.get(timeout=timeout)
            if line == "":
                self.closed = True
                break
            self.seen.append(line)
            if text in line:
                return True
        return False

    def rest(self, timeout: float = 60) -> str:
        self.until("\0", timeout)
        return "".join(self.seen)


def test_pull_waits_for_a_download_another_process_runs(fake_hub: FakeHub) -> None:  # noqa: F811
    """`outrider pull` of a file the app is downloading: it says so, waits, and prints the
    file once the app has finished it — without fetching a byte itself."""
    size = len(source(fake_hub))
    fake_hub.set_fault(TINY_REPO, FILE, Fault(stall_at=AT, stall_seconds=60))
    app_events = Events()
    app = DownloadManager(Hub(), retry=PATIENT, on_event=app_events, progress_interval=0.0)
    pull: subprocess.Popen[str] | None = None
    try:
        reached = app_events.received(AT)
        app.start()
        app.enqueue(TINY_REPO, FILE)
        assert reached.wait(30)
        pull = subprocess.Popen([sys.executable, "-m", "runtime.cli.main", "pull", f"{TINY_REPO}:F32"],
                                cwd=ROOT, text=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert pull.stderr is not None and pull.stdout is not None
        err = Lines(pull.stderr)
        assert err.until("already being downloaded by another Outrider process"), err.seen
        fake_hub.release_stalls()  # the app's download goes on
        assert pull.wait(120) == 0, err.rest()
        assert pull.stdout.read().strip() == str(library_file())
        assert f"{FILE}: done" in err.rest()
    finally:
        if pull is not None:
            stop(pull)
        app.shutdown(timeout=5)
    stats = fake_hub.stats(TINY_REPO, FILE)
    assert stats.ranges == [None, f"bytes={AT}-"]  # both the app's
    assert stats.bytes_sent == size
