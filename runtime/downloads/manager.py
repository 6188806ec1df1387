"""Downloads that never lose a byte: a persistent queue of Hub files, fetched N at a time.

    manager = DownloadManager(hub, on_event=print, max_concurrent=2)
    manager.start()
    job = manager.enqueue("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q8_0.gguf")
    manager.pause(job.id); manager.resume(job.id)        # any time, from any thread
    [done] = manager.wait([job.id])
    done.path   # models/Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q8_0.gguf

How one file is fetched, resumed, verified and placed in the library: runtime.downloads.file.

Jobs live in `downloads/queue.json`, which every Outrider process shares
(runtime.downloads.queue), so the queue survives a crash or restart: a job that was running
comes back queued and resumes from its partial file. Events (`DownloadProgress`,
`DownloadStateChanged`, `DownloadNotice`, `QueueSaveChanged`) are delivered from worker threads
to `on_event`; the Qt app wraps them into signals.

A full disk stops no queue: when `queue.json` cannot be written, every change still holds in
memory (downloads go on, finish, fail, are paused), `QueueSaveChanged("disk full: ...")` says so
once, and the next write that succeeds puts in every change kept off the file meanwhile (and
`QueueSaveChanged(None)` says so); shutdown tries once more. What a job leaves in the downloads
folder (its partial file, a copy kept aside after a failed check) is `job.leftover` bytes, which
`delete_files` frees without forgetting the job; `remove` forgets the job and its files.

    manager.enqueue(...)   # queue.json: {a1b2: queued}
    (disk full)            # a1b2 running, done: in memory; QueueSaveChanged("disk full: ...")
    (room again)           # the next change writes {a1b2: done, ...}; QueueSaveChanged(None)

Two ways to start. `start()` runs the whole queue (the app), and takes in the jobs other
processes add to the file later; `start(only=ids)` runs those jobs alone (`outrider pull X`:
X's files); the other queued jobs stay on file for the app, and no new job is taken in.

One job, one downloader: a worker downloads a job only while it holds the job's lock, and a
job another process holds is shown running elsewhere and followed until it ends there, or
taken up here when its owner stops before the end. Which process owns which job, and how
this one follows the others', is runtime.downloads.ownership.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import filelock
import httpx

from runtime.downloads.file import FileDownload, kept_aside
from runtime.downloads.ownership import Ownership
from runtime.downloads.queue import (
    ACTIVE,
    SETTLED,
    DownloadJob,
    JobState,
    QueueFile,
    QueueSaveChanged,
    QueueWriter,
    RetryPolicy,
)
from runtime.downloads.transfer import StopFlag, Stopped
from runtime.errors import DownloadError, OutriderError, shown
from runtime.hub.client import Hub
from runtime.paths import user_dirs

# The manager's face, the queue module's DownloadJob, QueueSaveChanged and RetryPolicy included.
__all__ = ["DownloadEvent", "DownloadJob", "DownloadManager", "DownloadNotice",
           "DownloadProgress", "DownloadStateChanged", "EventSink", "JobState",
           "QueueSaveChanged", "RetryPolicy"]

@dataclass(frozen=True)
class DownloadProgress:
    job_id: str
    filename: str
    received: int
    total: int | None
    rate: float  # bytes per second over the last few seconds
    eta_s: float | None


@dataclass(frozen=True)
class DownloadStateChanged:
    job: DownloadJob


@dataclass(frozen=True)
class DownloadNotice:
    """Something the user should be told that is not a failure (a retry, an upstream change)."""

    job_id: str
    message: str


DownloadEvent = DownloadProgress | DownloadStateChanged | DownloadNotice | QueueSaveChanged
EventSink = Callable[[DownloadEvent], None]


class DownloadManager:
    """The queue and its worker threads. Every public method is thread-safe and returns at once
    (except `wait` and `shutdown`). A change waits for the queue file's lock: milliseconds,
    unless another process hangs holding it — then `DownloadError` after `queue_lock_timeout` s.
    Jobs other processes add or download are followed every `watch_interval` s
    (runtime.downloads.ownership)."""

    def __init__(self, hub: Hub, *, models_dir: Path | None = None,
                 downloads_dir: Path | None = None, max_concurrent: int = 2,
                 retry: RetryPolicy | None = None, on_event: EventSink | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 disk_usage: Callable[[Path], Any] = shutil.disk_usage,
                 progress_interval: float = 0.25, reserve_bytes: int = 64 << 20,
                 queue_lock_timeout: float = 30.0, watch_interval: float = 0.5) -> None:

        if max_concurrent < 1:
            raise DownloadError(f"concurrent downloads must be at least 1, not {max_concurrent}")
        dirs = user_dirs()
        self._hub = hub
        self.models_dir = models_dir or dirs.models
        self.downloads_dir = downloads_dir or dirs.downloads
        self.max_concurrent = max_concurrent
        self.retry_policy = retry or RetryPolicy()
        self._on_event = on_event
        self._clock = clock
        self._disk_usage = disk_usage
        self._progress_interval = progress_interval
        self._reserve = reserve_bytes
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._queue_file = QueueFile(self.downloads_dir / "queue.json", queue_lock_timeout)
        self._writer = QueueWriter(self._queue_file)  # survives a full disk (module doc)
        self._jobs: dict[str, DownloadJob] = {}
        for job in self._queue_file.load():
            # A job that was running when the process died resumes from its partial file.
            self._jobs[job.id] = dataclasses.replace(job, state="queued") if job.state == "running" else job
        self._controls: dict[str, StopFlag] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._started = False
        # Which process downloads which job; follows the others' through the queue file.
        self._ownership = Ownership(
            self.downloads_dir, self._queue_file, self._writer, lock=self._lock, jobs=self._jobs,
            put=self._put, live=self._live, progress=self._progress, pump=self._pump,
            working=lambda job_id: job_id in self._controls, interval=watch_interval,
            clock=clock)
        self._client = self._new_client()

    def __repr__(self) -> str:
        return f"DownloadManager(hub={self._hub!r}, jobs={len(self._jobs)})"

    # -- the queue -----------------------------------------------------------------------------

    def _new_client(self) -> httpx.Client:
        # The read timeout is the stall detector: no byte for this long ends the attempt.
        return httpx.Client(follow_redirects=True, timeout=httpx.Timeout(
            self.retry_policy.stall_timeout, connect=self.retry_policy.connect_timeout))

    def start(self, only: Iterable[str] | None = None) -> None:
        """Begin (or continue) fetching queued jobs, including those found from a previous run,
        and take in the jobs other processes add. With `only`: fetch those jobs alone, leave
        the other queued jobs as they are, and take in nothing (`outrider pull`)."""
        with self._lock:
            if self._client.is_closed:  # started again after a shutdown
                self._client = self._new_client()
            self._started = True
            self._ownership.start(None if only is None else frozenset(only))
        self._pump()

    def enqueue(self, repo_id: str, filename: str, revision: str = "main", *,
                size: int | None = None, sha256: str | None = None,
                group: str | None = None) -> DownloadJob:
        """Add a file (or return the job already fetching it, or already done with it)."""
        with self._lock:
            for job in self._jobs.values():
                if (job.repo_id, job.filename, job.revision) != (repo_id, filename, revision):
                    continue
                if job.state == "done" and job.path and Path(job.path).is_file():
                    return job
                if job.state in ("queued", "running", "paused"):
                    self._ownership.claim(job.id)  # asked for here: started here if it waits
                    self._pump()
                    return job
                if job.state == "failed":
                    self.retry(job.id)
                    return self._jobs[job.id]
            new = DownloadJob(id=uuid.uuid4().hex[:12], repo_id=repo_id, filename=filename,
                              revision=revision, size=size, sha256=sha256, group=group,
                              added=time.time())
            # On file first (when the queue file stays locked, nothing was added), and joining
            # the job of another process that queued this file after this one read the queue.
            job = self._queue_file.add(new, lambda j: j.state in ACTIVE and (
                j.repo_id, j.filename, j.revision) == (repo_id, filename, revision))
            if job.state == "running":  # its worker, if alive, holds the job's lock
                job = dataclasses.replace(job, state="queued")
            self._jobs[job.id] = job
            saved = self._writer.save(self._jobs) if self._writer.pending else None
        self._emit(DownloadStateChanged(job))
        if saved is not None:
            self._emit(saved)
        self._pump()
        return job

    def jobs(self) -> list[DownloadJob]:
        """All jobs, oldest first, with `received` read from their partial files now."""
        with self._lock:
            return [self._live(j) for j in sorted(self._jobs.values(), key=lambda j: j.added)]

    def job(self, job_id: str) -> DownloadJob:
        with self._lock:
            if job_id not in self._jobs:
                raise DownloadError(f"no download with id {job_id}")
            return self._live(self._jobs[job_id])

    def _live(self, job: DownloadJob) -> DownloadJob:
        """The job with what its files hold now: `received` (the partial) and `leftover`."""
        partial, aside = (_size(path) for path in self._files(job))
        if job.state == "done":  # its bytes are in the library; an old bad copy may be left
            return dataclasses.replace(job, leftover=partial + aside)
        return dataclasses.replace(job, received=partial, leftover=partial + aside)

    def _files(self, job: DownloadJob) -> tuple[Path, Path]:
        """What a job may hold in the downloads folder: its partial file, its copy kept aside."""
        return self._partial(job.id), kept_aside(self.downloads_dir, job)

    def pause(self, job_id: str) -> None:
        self._stop_or_set(job_id, "pause", "paused", from_states=("queued", "running"))

    def resume(self, job_id: str) -> None:
        if self.job(job_id).state == "paused":
            self._ownership.claim(job_id)
            self._set(job_id, state="queued")
            self._pump()

    def cancel(self, job_id: str) -> None:
        """Stop and forget the bytes: the partial file is deleted (by the worker, when one of
        this process's runs it; here otherwise, unless another process is writing it)."""
        states = ("queued", "running", "paused", "failed")
        with self._lock:
            if self.job(job_id).state not in states:
                return
            if job_id in self._controls:
                self._stop_or_set(job_id, "cancel", "cancelled", from_states=states)
                return
            with self._ownership.owning(job_id, "cancel"):
                self._stop_or_set(job_id, "cancel", "cancelled", from_states=states)
                self._partial(job_id).unlink(missing_ok=True)

    def retry(self, job_id: str) -> None:
        """Queue a failed or cancelled job again (after a token was set, space freed ...)."""
        if self.job(job_id).state in ("failed", "cancelled"):
            self._ownership.claim(job_id)
            self._set(job_id, state="queued", error=None, error_kind=None)
            self._pump()

    def remove(self, job_id: str) -> None:
        """Forget a finished, failed or cancelled job (unless another process took it up again)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.state not in ("done", "failed", "cancelled"):
                return
            # Our own worker may still be winding down (it no longer touches the bytes).
            owning = contextlib.nullcontext() if job_id in self._controls else \
                self._ownership.owning(job_id, "remove")
            with owning:
                # A full disk keeps the removal for the next write; a locked queue: not removed.
                saved = self._writer.save(self._jobs, removed=job_id)
                del self._jobs[job_id]
                for path in self._files(job):
                    path.unlink(missing_ok=True)
                self._ownership.lock_path(job_id).unlink(missing_ok=True)
        if saved is not None:
            self._emit(saved)

    def delete_files(self, job_id: str) -> int:
        """Delete what a failed, cancelled or finished job left in the downloads folder (its
        partial file, the copy kept aside after a failed check) and return the bytes freed.
        The job stays: a retry fetches the file from zero. A job still downloading or paused
        is refused (cancel it: that deletes its partial)."""
        with self._lock:
            job = self.job(job_id)
            if job.state not in ("done", "failed", "cancelled"):
                raise DownloadError(f"{shown(job.filename)} is {job.state}; cancel it to delete its "
                                    "partial file")
            with self._ownership.owning(job_id, "delete the files of"):
                freed = 0
                for path in self._files(job):
                    size = _size(path)
                    try:
                        path.unlink(missing_ok=True)
                    except OSError as exc:
                        raise DownloadError(f"cannot delete {shown(path)} ({exc.strerror})") from exc
                    freed += size
            job = self._live(self._jobs[job_id])
        self._emit(DownloadStateChanged(job))
        return freed

    def set_token(self, token: str | None) -> None:
        """Use this token from the next request on (a gated repo asked for one)."""
        with self._lock:
            self._hub = self._hub.with_token(token)

    def set_hub(self, hub: Hub) -> None:
        """Fetch from this Hub (another mirror, endpoint or token) from now on: queued jobs
        start against it, and each job in flight restarts its request against it, resuming
        from its partial file (a job waiting out a retry's backoff restarts at once).

        Why a restart and not only the next attempt: a worker stuck retrying an unreachable
        endpoint would keep at it for minutes ("retrying in 16.0 s (attempt 6 of 8)") while
        the user has already chosen a mirror that works. The worker is stopped as a shutdown
        stops it — the job goes back to queued with its bytes — and its freed slot starts it
        again at once, with a `FileDownload` that asks for the new Hub. A transfer notices the
        stop at its next chunk; one stalled on the old endpoint when the stall detector fires."""
        with self._lock:
            self._hub = hub
            moved = [self._jobs[i] for i, control in self._controls.items() if not control.stopped]
            for job in moved:
                self._controls[job.id].stop("shutdown")
        for job in moved:
            self._emit(DownloadNotice(job.id, f"{job.filename}: now fetching from {hub.endpoint}"))

    def wait(self, job_ids: Iterable[str] | None = None,
             timeout: float | None = None) -> list[DownloadJob]:
        """Block until the jobs are done, failed, cancelled or paused; returns them."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            ids = list(job_ids) if job_ids is not None else list(self._jobs)
            while any(self._jobs[i].state not in SETTLED for i in ids):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._changed.wait(remaining)
            return [self._jobs[i] for i in ids]

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the workers; running jobs stay queued (their partials resume next start)."""
        with self._lock:
            self._started = False
            for control in self._controls.values():
                control.stop("shutdown")
            watcher = self._ownership.stop()
            threads = list(self._threads.values())
            if watcher is not None:
                threads.append(watcher)
        for t in threads:
            t.join(timeout)
        saved: QueueSaveChanged | None = None
        with self._lock, contextlib.suppress(DownloadError):  # changes a full disk kept off
            saved = self._writer.save(self._jobs) if self._writer.pending else None
        if saved is not None:
            self._emit(saved)
        self._client.close()

    # -- internals -----------------------------------------------------------------------------

    def _partial(self, job_id: str) -> Path:
        return self.downloads_dir / f"{job_id}.part"

    def _emit(self, event: DownloadEvent) -> None:
        if self._on_event is None:
            return
        with contextlib.suppress(Exception):  # a broken listener must not break a download
            self._on_event(event)

    def _progress(self, job: DownloadJob, received: int, rate: float,
                  eta_s: float | None) -> None:
        """A job another process downloads moved on (runtime.downloads.ownership)."""
        self._emit(DownloadProgress(job.id, job.filename, received, job.size, rate, eta_s))

    def _set(self, job_id: str, **changes: Any) -> DownloadJob:
        """Change a job in memory at once, then on file. When the queue file stays locked the
        change still stands (and is announced), then the `DownloadError` is raised."""
        unsaved: DownloadError | None = None
        saved: QueueSaveChanged | None = None
        with self._lock:
            old = self._jobs[job_id]
            job = dataclasses.replace(old, **changes)
            self._jobs[job_id] = job
            self._changed.notify_all()
            try:
                saved = self._writer.save(self._jobs, changed=job_id)
            except DownloadError as exc:
                unsaved = exc
            # Announced before the lock is let go: a `wait` this change ends returns after its
            # event was delivered (`outrider pull` prints "done" before the paths, a test reads
            # every event). Listeners are quick (the app queues the event, the CLI prints a line).
            if job.state != old.state or "error" in changes:
                self._emit(DownloadStateChanged(self._live(job)))
        if saved is not None:
            self._emit(saved)
        if unsaved is not None:
            raise unsaved
        return job

    def _settle(self, job_id: str, **changes: Any) -> None:
        """`_set` for what a worker records: the outcome stands in memory even when the queue
        file stays locked (the file keeps the job's last saved state, which a restart resumes)."""
        with contextlib.suppress(DownloadError):
            self._set(job_id, **changes)

    def _put(self, job: DownloadJob) -> None:
        """Change a job in memory only (what this process learned of another's work)."""
        with self._lock:
            old = self._jobs.get(job.id)
            self._jobs[job.id] = job
            self._writer.forget(job.id)  # the file's record is newer than ours
            self._changed.notify_all()
        if old is None or (old.state, old.elsewhere) != (job.state, job.elsewhere):
            self._emit(DownloadStateChanged(job))

    def _stop_or_set(self, job_id: str, reason: Literal["pause", "cancel"], state: JobState,
                     from_states: tuple[str, ...]) -> None:
        with self._lock:
            job = self.job(job_id)
            if job.state not in from_states:
                return
            if job.elsewhere:
                raise self._ownership.elsewhere_error(job_id, reason)
            control = self._controls.get(job_id)
            if control is not None:
                control.stop(reason)
        # The state is the user's decision at once; the worker winds down in the background.
        self._set(job_id, state=state)

    def _pump(self) -> None:
        """Start workers for queued jobs while slots are free (oldest first), except those
        this process leaves to others (`Ownership.mine`). A job turns "running" once its
        worker holds the job's lock (`_begin`)."""
        with self._lock:
            if not self._started:
                return
            for job in sorted(self._jobs.values(), key=lambda j: j.added):
                if len(self._controls) >= self.max_concurrent:
                    break
                if job.state != "queued" or job.id in self._controls or \
                        not self._ownership.mine(job.id):
                    continue
                control = StopFlag()
                self._controls[job.id] = control
                thread = threading.Thread(target=self._work, args=(job.id, control),
                                          name=f"download-{job.id}", daemon=True)
                self._threads[job.id] = thread
                thread.start()

    def _work(self, job_id: str, control: StopFlag) -> None:
        """A worker: take the job's lock, or leave the job to the process that holds it."""
        try:
            lock = self._ownership.take(job_id)
        except OSError as exc:  # a downloads folder we cannot write
            self._settle(job_id, state="failed", error_kind="DownloadError",
                         error=f"cannot lock {self._ownership.lock_path(job_id)}: {exc}")
            self._free_slot(job_id)
        else:
            if lock is None:
                self._leave_to_other_process(job_id)
            else:
                self._run_holding(job_id, control, lock)
        self._pump()

    def _run_holding(self, job_id: str, control: StopFlag, lock: filelock.BaseFileLock) -> None:
        """Run the job with its lock taken, then let go of the lock and the slot."""
        try:
            self._run(job_id, control)
        finally:
            # Released after the outcome is saved, so a process that takes the lock next
            # reads it; and before the slot is freed, so our next worker for it can take it.
            lock.release()
            self._free_slot(job_id)

    def _free_slot(self, job_id: str) -> None:
        with self._lock:
            self._controls.pop(job_id, None)
            self._threads.pop(job_id, None)
            self._changed.notify_all()

    def _leave_to_other_process(self, job_id: str) -> None:
        """Another process holds the job's lock: show the job running there, and follow it."""
        with self._lock:
            self._controls.pop(job_id, None)
            self._threads.pop(job_id, None)
            if self._jobs[job_id].state == "queued":  # not paused or cancelled here meanwhile
                self._put(dataclasses.replace(self._jobs[job_id], state="running", elsewhere=True))
                self._ownership.watch()
            self._changed.notify_all()

    def _run(self, job_id: str, control: StopFlag) -> None:
        """Download a job whose lock this process holds, and record the outcome."""
        try:
            if not self._begin(job_id, control):
                return
            path = self._download(job_id, control)
        except Stopped:
            self._settle_stopped(job_id)
        except OutriderError as exc:
            if control.stopped:  # failed while stopping: the stop is what the user asked for
                self._settle_stopped(job_id)
            else:
                self._settle(job_id, state="failed", error_kind=type(exc).__name__, error=str(exc))
        except Exception as exc:  # a bug: fail the job visibly rather than hang it
            self._settle(job_id, state="failed", error_kind="DownloadFailed",
                         error=f"unexpected error: {type(exc).__name__}: {exc}")
        else:
            # Finished as a pause or cancel arrived: the verified file is in the library anyway.
            self._settle(job_id, state="done", path=str(path), error=None, error_kind=None)

    def _begin(self, job_id: str, control: StopFlag) -> bool:
        """Mark the job running, as the queue file has it now: another process may have
        downloaded part of it since this one read the queue (its etag must come along, or the
        partial would be thrown away), or finished, paused or cancelled it (then: False)."""
        try:
            record = self._queue_file.get(job_id)
        except DownloadError:
            record = None  # the queue file stays locked: go on with what we know
        with self._lock:  # a pause or cancel now either comes first or sees "running"
            control.check()
            if self._jobs[job_id].state != "queued":
                return False
            if record is not None and record.state in SETTLED:
                self._put(record)
                return False
            learned = {} if record is None else {
                "etag": record.etag, "commit": record.commit, "sha256": record.sha256,
                "size": record.size}
            self._settle(job_id, state="running", **learned)
        return True

    def _settle_stopped(self, job_id: str) -> None:
        # pause() and cancel() already set the state; a shutdown leaves the job queued.
        state = self.job(job_id).state
        if state == "cancelled":
            self._partial(job_id).unlink(missing_ok=True)
            self._emit(DownloadStateChanged(self.job(job_id)))  # its leftover is gone
        elif state == "running":
            self._settle(job_id, state="queued")

    def _download(self, job_id: str, control: StopFlag) -> Path:
        """Fetch a job's file into the library (runtime.downloads.file)."""
        job = self.job(job_id)
        return FileDownload(
            job, self._partial(job_id), hub=lambda: self._hub, client=self._client,
            policy=self.retry_policy, models_dir=self.models_dir,
            downloads_dir=self.downloads_dir, disk_usage=self._disk_usage,
            reserve_bytes=self._reserve, clock=self._clock,
            progress_interval=self._progress_interval,
            record=lambda **changes: self._set(job_id, **changes),
            notice=lambda message: self._emit(DownloadNotice(job_id, message)),
            progress=lambda *p: self._emit(DownloadProgress(job_id, job.filename, *p)),
        ).run(control)


def _size(path: Path) -> int:
    """A file's size now; 0 when it is not there (or cannot be looked at)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
