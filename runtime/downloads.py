"""Downloads that never lose a byte: a persistent queue of Hub files, fetched N at a time.

    manager = DownloadManager(hub, on_event=print, max_concurrent=2)
    manager.start()
    job = manager.enqueue("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q8_0.gguf")
    manager.pause(job.id); manager.resume(job.id)        # any time, from any thread
    [done] = manager.wait([job.id])
    done.path   # models/Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q8_0.gguf

What happens to one file:

1. HEAD `resolve/<revision>/<file>` (huggingface_hub's `get_hf_file_metadata`): the etag (the
   LFS sha256), size, resolved commit and the URL to GET. 404 → `RemoteFileNotFound`,
   401/403 → `GatedRepo` (asks for a token; `set_token` + `retry` continues).
2. The partial `downloads/<job>.part` is checked against that etag: if the file changed
   upstream since the partial was started, it restarts from zero and says so (a notice event).
3. Free disk space is checked (`DiskFull`) before a byte is fetched.
4. GET with `Range: bytes=<partial size>-`; every received chunk is appended and hashed at once.
   A resumed partial is first hashed from disk (hashlib's state cannot be saved across runs).
5. Connection errors, HTTP 5xx/429 and stalls (no byte for `stall_timeout` seconds) are retried
   with exponential backoff; an attempt that made progress resets the count.
6. Size and sha256 are verified. A mismatch moves the file aside (`downloads/*.bad`) and fails
   with `HashMismatch`; only a verified file is moved into the library, atomically.

Why not `hf_hub_download`: it cannot pause, reports progress only through tqdm and resumes
only within one call. Outrider wraps the smallest piece itself, one ranged GET
(`runtime.transfer.fetch_into`); every Hub-specific part (URLs, headers, token, metadata,
errors) stays in huggingface_hub's hands.

Jobs live in `downloads/queue.json` (rewritten atomically on each state change), so the queue
survives a crash or restart: a job that was running comes back queued and resumes from its
partial file. The app and `outrider pull` may both write it: each change is a read-modify-write
under a cross-process file lock, so neither drops the other's jobs (`_QueueFile`). Events
(`DownloadProgress`, `DownloadStateChanged`, `DownloadNotice`) are delivered from worker
threads to `on_event`; the Qt app wraps them into signals.

One job, one downloader. Two processes may hold the same job (the app queued it, then
`outrider pull` loaded the queue), but only the one holding the job's lock
(`downloads/<job>.part.lock`: an OS lock the worker takes without waiting and holds until the
job is done, failed, paused or cancelled) touches its partial file. The other leaves the job
to it and shows it as `state="running", elsewhere=True`; every `watch_interval` seconds it
reads the job's record in the queue file and the partial's size (progress events, the end),
and it takes the job up itself when the lock comes free with the job unfinished: its owner
was shut down, or died (the kernel drops a dead process's lock), and the partial resumes.

    app:   worker takes a1b2.part.lock, writes a1b2.part
    pull:  cannot take a1b2.part.lock -> a1b2 running elsewhere; watches it
    app:   saves "done", then releases the lock   -> pull shows a1b2 done
      or:  is killed                              -> pull resumes a1b2.part itself
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import filelock
import httpx

from runtime.atomic_file import atomic_output
from runtime.errors import (
    DiskFull,
    DownloadError,
    DownloadFailed,
    DownloadRunningElsewhere,
    GatedRepo,
    HashMismatch,
    HubServerError,
    HubUnreachable,
    OutriderError,
)
from runtime.hub import FileMetadata, Hub
from runtime.transfer import (
    Hashing,
    Rate,
    Retryable,
    StopFlag,
    Stopped,
    fetch_into,
    fmt_bytes,
    same_origin,
)

JobState = Literal["queued", "running", "paused", "done", "failed", "cancelled"]
SETTLED: frozenset[str] = frozenset({"paused", "done", "failed", "cancelled"})
ACTIVE: frozenset[str] = frozenset({"queued", "running", "paused"})


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again. Delays: initial, ×factor per failed attempt, capped at `max_delay`.

    >>> [RetryPolicy().delay(n) for n in (1, 2, 3, 8)]
    [1.0, 2.0, 4.0, 60.0]
    """

    max_attempts: int = 8  # consecutive attempts that brought no new byte
    initial_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 60.0
    stall_timeout: float = 30.0  # no byte for this long counts as a stall
    connect_timeout: float = 20.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_delay, self.initial_delay * self.factor ** max(0, attempt - 1)))


@dataclass(frozen=True)
class DownloadJob:
    """One file to fetch. `etag`/`commit` name the upstream version the partial file holds."""

    id: str
    repo_id: str
    filename: str
    revision: str = "main"
    state: JobState = "queued"
    size: int | None = None
    sha256: str | None = None
    etag: str | None = None
    commit: str | None = None
    received: int = 0
    path: str | None = None  # the library file, once done
    error_kind: str | None = None  # the OutriderError subclass name, when failed
    error: str | None = None
    group: str | None = None  # ties the parts of a split model together ("repo:Q4_K_M")
    added: float = 0.0
    # This process's view, never saved: another Outrider process holds the job's lock and is
    # downloading it (state "running"; `received` follows its partial file). Here it can
    # only be watched: pause, cancel and remove raise DownloadRunningElsewhere.
    elsewhere: bool = False

    @property
    def library_relpath(self) -> Path:
        owner, _, name = self.repo_id.partition("/")
        return Path(owner) / name / self.filename

    @property
    def needs_token(self) -> bool:
        return self.error_kind == GatedRepo.__name__


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


DownloadEvent = DownloadProgress | DownloadStateChanged | DownloadNotice
EventSink = Callable[[DownloadEvent], None]


class _QueueFile:
    """The jobs as JSON, shared by every Outrider process of this user (the app, `outrider pull`).

    Each change is one read-modify-write under a cross-process file lock (`queue.json.lock`,
    through `filelock`): read the file, put in the one job this process changed (or drop the
    one it removed), write it back atomically (temporary file + rename). Jobs another process
    added or changed meanwhile survive; a whole-list rewrite would drop them.

        app:  update([A])   -> file {A}
        pull: update([B])   -> file {A, B}     (a plain rewrite of pull's own list: {B})

    The lock is an OS lock (flock / LockFileEx): the kernel drops it when its holder dies, so
    a crashed process never leaves the queue locked. A live holder that hangs for `timeout`
    seconds ends the wait with a `DownloadError` instead of blocking forever.
    """

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        self.path = path
        self.timeout = timeout
        self._lock = filelock.FileLock(path.with_name(path.name + ".lock"), timeout=timeout)

    def load(self) -> list[DownloadJob]:
        """The jobs on file now (none when there is no file yet)."""
        with self._locked():
            return list(self._read().values())

    def get(self, job_id: str) -> DownloadJob | None:
        with self._locked():
            return self._read().get(job_id)

    def add(self, job: DownloadJob, same: Callable[[DownloadJob], bool]) -> DownloadJob:
        """Put `job` in, unless a job on file is the `same` (another process queued the file
        since this one read the queue): then that job, and nothing is written."""
        with self._locked():
            jobs = self._read()
            found = next((j for j in jobs.values() if same(j)), None)
            if found is not None:
                return found
            jobs[job.id] = job
            self._write(jobs.values())
            return job

    def update(self, changed: Iterable[DownloadJob] = (), removed: Iterable[str] = ()) -> None:
        """Put `changed` in (by id, replacing what is there) and drop the ids in `removed`."""
        with self._locked():
            jobs = self._read()
            for job_id in removed:
                jobs.pop(job_id, None)
            for job in changed:
                jobs[job.id] = job
            self._write(jobs.values())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._lock:
                yield
        except filelock.Timeout as exc:
            raise DownloadError(
                f"another Outrider process has held the download queue for over "
                f"{self.timeout:g} s ({self._lock.lock_file}); try again when it is done, "
                "or quit it") from exc

    def _read(self) -> dict[str, DownloadJob]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # A queue file we cannot read is kept for inspection, never silently overwritten.
            os.replace(self.path, self.path.with_suffix(".json.unreadable"))
            return {}
        known = {f.name for f in dataclasses.fields(DownloadJob)} - {"elsewhere"}
        jobs = [DownloadJob(**{k: v for k, v in d.items() if k in known})
                for d in data.get("jobs", [])]
        return {job.id: job for job in jobs}

    def _write(self, jobs: Iterable[DownloadJob]) -> None:
        records = [dataclasses.asdict(j) for j in jobs]
        for record in records:
            del record["elsewhere"]  # one process's view, not the job's
        text = json.dumps({"version": 1, "jobs": records}, indent=1)
        with atomic_output(self.path, prefix=".queue-", suffix=".tmp") as tmp:
            tmp.write_text(text)


class DownloadManager:
    """The queue and its worker threads. Every public method is thread-safe and returns at once
    (except `wait` and `shutdown`). A change waits for the queue file's lock: milliseconds,
    unless another process hangs holding it — then `DownloadError` after `queue_lock_timeout` s.
    Jobs another process is downloading are followed every `watch_interval` s (module doc)."""

    def __init__(self, hub: Hub, *, models_dir: Path | None = None,
                 downloads_dir: Path | None = None, max_concurrent: int = 2,
                 retry: RetryPolicy | None = None, on_event: EventSink | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 disk_usage: Callable[[Path], Any] = shutil.disk_usage,
                 progress_interval: float = 0.25, reserve_bytes: int = 64 << 20,
                 queue_lock_timeout: float = 30.0, watch_interval: float = 0.5) -> None:
        from runtime.paths import user_dirs

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
        self.watch_interval = watch_interval
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._queue_file = _QueueFile(self.downloads_dir / "queue.json", queue_lock_timeout)
        self._jobs: dict[str, DownloadJob] = {}
        for job in self._queue_file.load():
            # A job that was running when the process died resumes from its partial file.
            self._jobs[job.id] = dataclasses.replace(job, state="queued") if job.state == "running" else job
        self._controls: dict[str, StopFlag] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._watcher: threading.Thread | None = None  # runs while a job runs elsewhere
        self._watch_stop = threading.Event()
        self._started = False
        self._client = self._new_client()

    def __repr__(self) -> str:
        return f"DownloadManager(hub={self._hub!r}, jobs={len(self._jobs)})"

    # -- the queue -----------------------------------------------------------------------------

    def _new_client(self) -> httpx.Client:
        # The read timeout is the stall detector: no byte for this long ends the attempt.
        return httpx.Client(follow_redirects=True, timeout=httpx.Timeout(
            self.retry_policy.stall_timeout, connect=self.retry_policy.connect_timeout))

    def start(self) -> None:
        """Begin (or continue) fetching queued jobs, including those found from a previous run."""
        with self._lock:
            if self._client.is_closed:  # started again after a shutdown
                self._client = self._new_client()
            self._started = True
            self._watch_stop.clear()
            self._start_watcher()
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
        self._emit(DownloadStateChanged(job))
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
        if job.state == "done":
            return job
        try:
            return dataclasses.replace(job, received=self._partial(job.id).stat().st_size)
        except OSError:
            return dataclasses.replace(job, received=0)

    def pause(self, job_id: str) -> None:
        self._stop_or_set(job_id, "pause", "paused", from_states=("queued", "running"))

    def resume(self, job_id: str) -> None:
        if self.job(job_id).state == "paused":
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
            with self._owning(job_id, "cancel"):
                self._stop_or_set(job_id, "cancel", "cancelled", from_states=states)
                self._partial(job_id).unlink(missing_ok=True)

    def retry(self, job_id: str) -> None:
        """Queue a failed or cancelled job again (after a token was set, space freed ...)."""
        if self.job(job_id).state in ("failed", "cancelled"):
            self._set(job_id, state="queued", error=None, error_kind=None)
            self._pump()

    def remove(self, job_id: str) -> None:
        """Forget a finished, failed or cancelled job (unless another process took it up again)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.state not in ("done", "failed", "cancelled"):
                return
            # Our own worker may still be winding down (it no longer touches the bytes).
            owning = contextlib.nullcontext() if job_id in self._controls else self._owning(
                job_id, "remove")
            with owning:
                self._queue_file.update(removed=[job_id])
                del self._jobs[job_id]
                self._partial(job_id).unlink(missing_ok=True)
                self._lock_path(job_id).unlink(missing_ok=True)

    def set_token(self, token: str | None) -> None:
        """Use this token from the next request on (a gated repo asked for one)."""
        with self._lock:
            self._hub = self._hub.with_token(token)

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
            self._watch_stop.set()
            threads = list(self._threads.values())
            if self._watcher is not None:
                threads.append(self._watcher)
        for t in threads:
            t.join(timeout)
        self._client.close()

    # -- internals -----------------------------------------------------------------------------

    def _partial(self, job_id: str) -> Path:
        return self.downloads_dir / f"{job_id}.part"

    def _lock_path(self, job_id: str) -> Path:
        return self.downloads_dir / f"{job_id}.part.lock"

    def _job_lock(self, job_id: str) -> filelock.BaseFileLock:
        """The job's cross-process lock; whoever holds it is the one process downloading it.
        timeout=0: a held lock is an answer (another process has it), never a wait. Different
        FileLock objects conflict within one process too (flock is per open file)."""
        self.downloads_dir.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(self._lock_path(job_id), timeout=0)

    def _held_elsewhere(self, job_id: str) -> bool:
        """Whether another process holds the job's lock now (asked by taking it for a moment)."""
        lock = self._job_lock(job_id)
        try:
            lock.acquire()
        except filelock.Timeout:
            return True
        lock.release()
        return False

    @contextlib.contextmanager
    def _owning(self, job_id: str, action: str) -> Iterator[None]:
        """Hold the job's lock for a change to its bytes (call with `self._lock` held, so no
        worker of ours starts meanwhile). Another process holding it: the job is shown running
        elsewhere and `DownloadRunningElsewhere` says so."""
        lock = self._job_lock(job_id)
        try:
            lock.acquire()
        except filelock.Timeout:
            if self._jobs[job_id].state != "running":
                self._put(dataclasses.replace(self._jobs[job_id], state="running",
                                              elsewhere=True))
                self._start_watcher()
            raise self._elsewhere_error(job_id, action) from None
        try:
            yield
        finally:
            lock.release()

    def _elsewhere_error(self, job_id: str, action: str) -> DownloadRunningElsewhere:
        return DownloadRunningElsewhere(
            f"{self._jobs[job_id].filename} is being downloaded by another Outrider process "
            f"(the app or `outrider pull`); {action} it there, or wait for it to finish")

    def _save(self, job: DownloadJob) -> None:
        """Write this one job to the shared queue file (other processes' jobs stay)."""
        self._queue_file.update([job])

    def _emit(self, event: DownloadEvent) -> None:
        if self._on_event is None:
            return
        with contextlib.suppress(Exception):  # a broken listener must not break a download
            self._on_event(event)

    def _set(self, job_id: str, **changes: Any) -> DownloadJob:
        """Change a job in memory at once, then on file. When the queue file stays locked the
        change still stands (and is announced), then the `DownloadError` is raised."""
        unsaved: DownloadError | None = None
        with self._lock:
            old = self._jobs[job_id]
            job = dataclasses.replace(old, **changes)
            self._jobs[job_id] = job
            self._changed.notify_all()
            try:
                self._save(job)
            except DownloadError as exc:
                unsaved = exc
        if job.state != old.state or "error" in changes:
            self._emit(DownloadStateChanged(job))
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
                raise self._elsewhere_error(job_id, reason)
            control = self._controls.get(job_id)
            if control is not None:
                control.stop(reason)
        # The state is the user's decision at once; the worker winds down in the background.
        self._set(job_id, state=state)

    def _pump(self) -> None:
        """Start workers for queued jobs while slots are free (oldest first). A job turns
        "running" once its worker holds the job's lock (`_begin`)."""
        with self._lock:
            if not self._started:
                return
            for job in sorted(self._jobs.values(), key=lambda j: j.added):
                if len(self._controls) >= self.max_concurrent:
                    break
                if job.state != "queued" or job.id in self._controls:
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
            lock = self._job_lock(job_id)
            lock.acquire()
        except filelock.Timeout:
            self._leave_to_other_process(job_id)
        except OSError as exc:  # a downloads folder we cannot write
            self._settle(job_id, state="failed", error_kind="DownloadError",
                         error=f"cannot lock {self._lock_path(job_id)}: {exc}")
            self._free_slot(job_id)
        else:
            try:
                self._run(job_id, control)
            finally:
                # Released after the outcome is saved, so a process that takes the lock next
                # reads it; and before the slot is freed, so our next worker for it can take it.
                lock.release()
                self._free_slot(job_id)
        self._pump()

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
                self._start_watcher()
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

    # -- jobs another process downloads --------------------------------------------------------

    def _start_watcher(self) -> None:
        """Start following jobs that run elsewhere, if any and not yet (with `self._lock` held)."""
        if not self._started or self._watcher is not None:
            return
        if not any(j.elsewhere for j in self._jobs.values()):
            return
        self._watcher = threading.Thread(target=self._watch, name="download-watcher", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """Every `watch_interval` s, until no job runs elsewhere: read their records once, then
        follow each. Stops at shutdown."""
        rates: dict[str, Rate] = {}
        try:
            while not self._watch_stop.wait(self.watch_interval):
                with self._lock:
                    ids = [j.id for j in self._jobs.values() if j.elsewhere]
                    if not ids:
                        return
                try:
                    on_file = {j.id: j for j in self._queue_file.load()}
                except DownloadError:
                    continue  # the queue file is busy: look again next time
                for job_id in ids:
                    self._follow(job_id, on_file.get(job_id),
                                 rates.setdefault(job_id, Rate(self._clock)))
                self._pump()  # jobs taken up, in free slots
        finally:
            with self._lock:
                self._watcher = None
                self._start_watcher()  # a job went elsewhere as this one was leaving

    def _follow(self, job_id: str, record: DownloadJob | None, rate: Rate) -> None:
        """One look at a job another process downloads.

        Its record settled (done, failed, paused, cancelled there): show that. Its lock free
        with the job unfinished (the owner shut down or died): queue it here, to resume from
        the partial. Otherwise report progress from the partial file's size."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or not job.elsewhere:
            return
        if record is not None and record.state in SETTLED:
            self._put(record)
            return
        known = record or job
        if not self._held_elsewhere(job_id):
            self._put(dataclasses.replace(known, state="queued", elsewhere=False))
            return
        job = dataclasses.replace(known, state="running", elsewhere=True)
        self._put(job)  # what the owner learned (size, etag): no event, the state stays
        received = self._live(job).received
        bps = rate.add(received)
        eta = (job.size - received) / bps if job.size is not None and bps > 0 else None
        self._emit(DownloadProgress(job_id, job.filename, received, job.size, bps, eta))

    def _settle_stopped(self, job_id: str) -> None:
        # pause() and cancel() already set the state; a shutdown leaves the job queued.
        state = self.job(job_id).state
        if state == "cancelled":
            self._partial(job_id).unlink(missing_ok=True)
        elif state == "running":
            self._settle(job_id, state="queued")

    def _download(self, job_id: str, control: StopFlag) -> Path:
        policy = self.retry_policy
        partial = self._partial(job_id)
        partial.parent.mkdir(parents=True, exist_ok=True)
        hashing = Hashing()
        attempt = 0
        while True:
            control.check()
            job = self.job(job_id)
            try:
                meta = self._hub.file_metadata(job.repo_id, job.filename, job.revision)
                job = self._reconcile(job, meta, partial)
                size = meta.size or job.size
                offset = partial.stat().st_size if partial.exists() else 0
                if size is not None and offset > size:  # longer than the file: cannot be it
                    partial.unlink()
                    offset = 0
                self._check_disk(job, (size - offset) if size is not None else 0, size or 0)
                hashing.sync(partial)  # a resumed partial: hash what is already on disk
                if size is None or offset < size:
                    self._fetch(job, meta, partial, offset, size, hashing, control)
                break
            except Retryable as exc:
                attempt = 1 if exc.received > 0 else attempt + 1
                reason = exc.reason
            except (HubUnreachable, HubServerError) as exc:
                attempt += 1
                reason = str(exc)
            if attempt >= policy.max_attempts:
                raise DownloadFailed(f"{job.filename}: gave up after {attempt} attempts "
                                     f"without progress ({reason})")
            delay = policy.delay(attempt)
            self._emit(DownloadNotice(job_id, f"{job.filename}: {reason}; retrying in {delay:.1f} s "
                                      f"(attempt {attempt + 1} of {policy.max_attempts})"))
            control.wait(delay)
        control.check()
        return self._verify_and_place(self.job(job_id), partial, hashing)

    def _reconcile(self, job: DownloadJob, meta: FileMetadata, partial: Path) -> DownloadJob:
        """Make sure the partial holds bytes of the file upstream has now; restart if not."""
        expected = meta.sha256 or job.sha256
        if job.etag is None:
            if job.sha256 and meta.sha256 and job.sha256 != meta.sha256:
                self._emit(DownloadNotice(job.id, f"{job.filename} changed upstream since it was "
                                          f"listed (now at revision {meta.commit[:8]})"))
            partial.unlink(missing_ok=True)  # no etag yet: nothing valid can be in it
            return self._set(job.id, etag=meta.etag, commit=meta.commit, sha256=expected,
                             size=meta.size or job.size)
        if job.etag != meta.etag:
            self._emit(DownloadNotice(job.id, (
                f"{job.filename} changed upstream (revision {(job.commit or '?')[:8]} → "
                f"{meta.commit[:8]}); restarting it from zero")))
            partial.unlink(missing_ok=True)
            return self._set(job.id, etag=meta.etag, commit=meta.commit, sha256=meta.sha256,
                             size=meta.size, received=0)
        if job.commit != meta.commit:  # a newer commit with this very file: the bytes still hold
            return self._set(job.id, commit=meta.commit)
        return job

    def _check_disk(self, job: DownloadJob, remaining: int, size: int) -> None:
        """Enough room for the rest of the file (and, on another file system, the library copy)."""
        self.models_dir.mkdir(parents=True, exist_ok=True)
        needs = [(self.downloads_dir, remaining)]
        if os.stat(self.models_dir).st_dev != os.stat(self.downloads_dir).st_dev:
            needs.append((self.models_dir, size))
        for folder, needed in needs:
            free = self._disk_usage(folder).free
            if free < needed + self._reserve:
                raise DiskFull(f"{job.filename} needs {fmt_bytes(needed)} more but only "
                               f"{fmt_bytes(free)} is free on {folder}")

    def _fetch(self, job: DownloadJob, meta: FileMetadata, partial: Path, offset: int,
               size: int | None, hashing: Hashing, stop: StopFlag) -> None:
        headers = self._hub.headers()
        if not same_origin(meta.location, meta.url):
            # A signed CDN URL (the Hub's redirect for LFS files): the token stays on the Hub.
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        rate = Rate(self._clock)
        last = [float("-inf")]

        def progress(total: int) -> None:
            now = self._clock()
            if now - last[0] >= self._progress_interval or total == size:
                last[0] = now
                bps = rate.add(total)
                eta = (size - total) / bps if size is not None and bps > 0 else None
                self._emit(DownloadProgress(job.id, job.filename, total, size, bps, eta))

        fetch_into(self._client, meta.location, headers, partial, offset, size, hashing, stop,
                   stall_timeout=self.retry_policy.stall_timeout, on_progress=progress,
                   what=f"{job.repo_id}/{job.filename}")

    def _verify_and_place(self, job: DownloadJob, partial: Path, hashing: Hashing) -> Path:
        size = partial.stat().st_size
        if job.size is not None and size != job.size:
            self._set_aside(job, partial)
            raise HashMismatch(f"{job.filename} is {size} bytes, not {job.size}; kept aside in "
                               f"{self.downloads_dir}")
        hashing.sync(partial)
        if job.sha256 is not None and hashing.digest.hexdigest() != job.sha256:
            bad = self._set_aside(job, partial)
            raise HashMismatch(f"{job.filename} does not match its published sha256; the bad file "
                               f"is kept aside as {bad.name}")
        dest = self.models_dir / job.library_relpath
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(partial, dest)  # same file system: atomic
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise DownloadError(f"cannot move {job.filename} into {dest.parent}: {exc}") from exc
            # Another file system: copy beside the target under a name no scan picks up, then
            # rename, so the library never shows a half-copied file.
            incoming = dest.with_name(f".{dest.name}.{job.id}.incoming")
            shutil.copyfile(partial, incoming)
            os.replace(incoming, dest)
            partial.unlink()
        self._settle(job.id, received=size)
        return dest

    def _set_aside(self, job: DownloadJob, partial: Path) -> Path:
        bad = self.downloads_dir / f"{job.filename}.{job.id}.bad"
        os.replace(partial, bad)
        return bad
