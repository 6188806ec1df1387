"""Which Outrider process downloads each job, and what the others see of it.

Two processes may hold the same job (the app queued it, then `outrider pull` loaded the
queue), but only the one holding the job's lock (`downloads/<job>.part.lock`: an OS lock the
worker takes without waiting and holds until the job is done, failed, paused or cancelled)
touches its partial file. The other leaves the job to it and shows it as `state="running",
elsewhere=True`; every `interval` seconds it reads the job's record in the queue file and the
partial's size (progress events, the end), and it takes the job up itself when the lock comes
free with the job unfinished: its owner was shut down, or died (the kernel drops a dead
process's lock), and the partial resumes.

    app:   worker takes a1b2.part.lock, writes a1b2.part
    pull:  cannot take a1b2.part.lock -> a1b2 running elsewhere; watches it
    app:   saves "done", then releases the lock   -> pull shows a1b2 done
      or:  is killed                              -> pull resumes a1b2.part itself

Following the whole queue (the app: `start(None)`), the same look at the file takes in the
jobs other processes add: every `interval` seconds the file's stamp is compared, the file read
when it changed, and each new job announced. A job another process queued is that process's
to start: it is shown queued, then running elsewhere once that process holds its lock, and
taken up here only as any job running elsewhere is (its owner stops before the end), or when
the user asks this process for it (`claim`). Following only some jobs (`outrider pull X`:
`start(only)`), nothing is taken in, and the watcher runs only while one of them runs
elsewhere.

`Ownership` serves one `DownloadManager` (runtime.downloads.manager): it shares the manager's
lock and job table and changes the table only through the manager's `put`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import filelock

from runtime.downloads.queue import SETTLED, DownloadJob, QueueFile, QueueWriter
from runtime.downloads.transfer import Rate
from runtime.errors import DownloadError, DownloadRunningElsewhere

# How long a worker waits for its job's lock before leaving the job to another process (`take`).
LOCK_GRACE_S = 0.25

# A job another process downloads: (the job, bytes in its partial now, bytes/s, ETA s or None).
Progress = Callable[[DownloadJob, int, float, "float | None"], None]


class Ownership:
    """The job locks of one downloads folder, and the watcher that follows the jobs of other
    processes through the queue file (module doc).

    Called with the manager's `lock` held, or taking it; `take` and the lock files need no
    lock. The manager's collaborators, passed in:
        jobs: the manager's job table (read here, under `lock`).
        put(job): change a job in memory only, announcing a new state.
        live(job): the job with `received` read from its partial file now.
        progress(job, received, rate, eta): a job running elsewhere moved on.
        pump(): start workers for queued jobs, in free slots.
        working(job_id): whether a worker of this process holds the job.
    """

    def __init__(self, downloads_dir: Path, queue_file: QueueFile, writer: QueueWriter, *,
                 lock: threading.RLock, jobs: Mapping[str, DownloadJob],
                 put: Callable[[DownloadJob], None], live: Callable[[DownloadJob], DownloadJob],
                 progress: Progress, pump: Callable[[], None], working: Callable[[str], bool],
                 interval: float, clock: Callable[[], float]) -> None:
        self.downloads_dir = downloads_dir
        self.interval = interval
        self._queue_file = queue_file
        self._writer = writer
        self._lock = lock
        self._jobs = jobs
        self._put = put
        self._live = live
        self._progress = progress
        self._pump = pump
        self._working = working
        self._clock = clock
        self._following = False  # between `start` and `stop`
        self._only: frozenset[str] | None = None  # start(only=...): the jobs this process runs
        self._foreign: set[str] = set()  # queued by another process, for it to start
        self._watcher: threading.Thread | None = None
        self._watch_stop = threading.Event()

    # -- the manager's questions ---------------------------------------------------------------

    def start(self, only: frozenset[str] | None) -> None:
        """Follow the queue file: all of it (None), or only the jobs `only` (module doc)."""
        self._following = True
        self._only = only
        self._watch_stop.clear()
        self.watch()

    def stop(self) -> threading.Thread | None:
        """Stop following; returns the watcher thread to join, if one runs."""
        self._following = False
        self._watch_stop.set()
        return self._watcher

    def mine(self, job_id: str) -> bool:
        """Whether this process may start the queued job: not another process's to start, and
        one of `only`'s when started for some."""
        return job_id not in self._foreign and (self._only is None or job_id in self._only)

    def claim(self, job_id: str) -> None:
        """The user asked this process for the job: it may start it, whoever queued it."""
        with self._lock:
            self._foreign.discard(job_id)

    def watch(self) -> None:
        """Start following the queue file, if not yet (with `lock` held): while started for
        the whole queue; started for `only` some, while one of them runs elsewhere."""
        if not self._following or self._watcher is not None:
            return
        if self._only is not None and not self._followed():
            return
        self._watcher = threading.Thread(target=self._watch, name="download-watcher", daemon=True)
        self._watcher.start()

    # -- the job locks -------------------------------------------------------------------------

    def lock_path(self, job_id: str) -> Path:
        return self.downloads_dir / f"{job_id}.part.lock"

    def take(self, job_id: str) -> filelock.BaseFileLock | None:
        """The job's lock, taken for a worker; None when another process holds it. OSError:
        the downloads folder cannot be written."""
        lock = self._job_lock(job_id)
        try:
            # A short grace, for the worker only: `_held_elsewhere` (a watcher here, or another
            # process) takes the lock for a moment to ask, and a worker meeting such a probe
            # with no wait gave its own job away as "running elsewhere" (1 run in ~10 of
            # test_download_ownership). An owner holds the lock for a whole download.
            lock.acquire(timeout=LOCK_GRACE_S, poll_interval=LOCK_GRACE_S / 10)
        except filelock.Timeout:
            return None
        return lock

    @contextlib.contextmanager
    def owning(self, job_id: str, action: str) -> Iterator[None]:
        """Hold the job's lock for a change to its bytes (with `lock` held, so no worker of
        the manager starts meanwhile). Another process holding it: the job is shown running
        elsewhere and `DownloadRunningElsewhere` says so."""
        lock = self._job_lock(job_id)
        try:
            lock.acquire()
        except filelock.Timeout:
            if self._jobs[job_id].state != "running":
                self._put(dataclasses.replace(self._jobs[job_id], state="running",
                                              elsewhere=True))
                self.watch()
            raise self.elsewhere_error(job_id, action) from None
        try:
            yield
        finally:
            lock.release()

    def elsewhere_error(self, job_id: str, action: str) -> DownloadRunningElsewhere:
        return DownloadRunningElsewhere(
            f"{self._jobs[job_id].filename} is being downloaded by another Outrider process "
            f"(the app or `outrider pull`); {action} it there, or wait for it to finish")

    def _job_lock(self, job_id: str) -> filelock.BaseFileLock:
        """The job's cross-process lock; whoever holds it is the one process downloading it.
        timeout=0: a held lock is an answer (another process has it), never a wait. Different
        FileLock objects conflict within one process too (flock is per open file)."""
        self.downloads_dir.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(self.lock_path(job_id), timeout=0)

    def _held_elsewhere(self, job_id: str) -> bool:
        """Whether another process holds the job's lock now (asked by taking it for a moment)."""
        lock = self._job_lock(job_id)
        try:
            lock.acquire()
        except filelock.Timeout:
            return True
        lock.release()
        return False

    # -- the watcher ---------------------------------------------------------------------------

    def _followed(self) -> list[str]:
        """Jobs looked at each round: running elsewhere, or queued there and not started yet."""
        return [j.id for j in self._jobs.values()
                if j.elsewhere or (j.state == "queued" and j.id in self._foreign)]

    def _watch(self) -> None:
        """Every `interval` s: read the queue file when it changed (or while jobs are
        followed), take in new jobs, follow the others' jobs. Stops at `stop` or, started for
        `only` some, when none of them runs elsewhere."""
        rates: dict[str, Rate] = {}
        seen: tuple[int, int, int] | None = None  # the stamp of the file last read
        try:
            while not self._watch_stop.wait(self.interval):
                with self._lock:
                    ids = self._followed()
                    if self._only is not None and not ids:
                        return
                stamp = self._queue_file.stamp()
                if not ids and stamp == seen:
                    continue
                try:
                    on_file = self._read_queue()
                except DownloadError:
                    continue  # the queue file is busy: look again next time
                seen = stamp
                for job_id in ids:
                    self._follow(job_id, on_file.get(job_id),
                                 rates.setdefault(job_id, Rate(self._clock)))
                self._pump()  # jobs taken up, in free slots
        finally:
            with self._lock:
                self._watcher = None
                self.watch()  # a job went elsewhere as this one was leaving

    def _read_queue(self) -> dict[str, DownloadJob]:
        """The queue file's jobs by id, after taking in those other processes added (unless
        started for `only` some)."""
        on_file = {j.id: j for j in self._queue_file.load()}
        with self._lock:
            # A job removed here while the disk was full is still on file: it stays removed.
            new = on_file.keys() - self._jobs.keys() - self._writer.removed
            if self._only is not None or not new:
                return on_file
            # Read again under our lock: a job this process removed meanwhile stays removed.
            on_file = {j.id: j for j in self._queue_file.load()}
            for record in on_file.values():
                if record.id not in self._jobs and record.id not in self._writer.removed:
                    self._take_in(record)
        return on_file

    def _take_in(self, record: DownloadJob) -> None:
        """Show a job another process added (with `lock` held), as it stands: settled;
        running there (its lock held); running on file with its lock free (its process died):
        queued here, to resume, as at start; queued there: that process's to start."""
        if record.state in SETTLED:
            self._put(record)
        elif self._held_elsewhere(record.id):
            self._put(dataclasses.replace(record, state="running", elsewhere=True))
        elif record.state == "running":
            self._put(dataclasses.replace(record, state="queued"))
        else:
            self._foreign.add(record.id)
            self._put(record)

    def _follow(self, job_id: str, record: DownloadJob | None, rate: Rate) -> None:
        """One look at a job another process downloads, or queued and has not started.

        Its record settled (done, failed, paused, cancelled there): show that. Its lock held:
        show it running there, with progress from the partial file's size. Its lock free with
        the job unfinished after it ran there (the owner shut down or died): queue it here, to
        resume from the partial; one only queued there stays for that process to start."""
        with self._lock:
            job = self._jobs.get(job_id)
            foreign = job_id in self._foreign
        if job is None or not (job.elsewhere or foreign):
            return
        if record is not None and record.state in SETTLED:
            self._put(record)
            return
        known = record or job
        held = self._held_elsewhere(job_id)
        if not held and not job.elsewhere and known.state != "running":
            return  # still waiting for its process to start it
        with self._lock:
            if self._working(job_id):  # the user asked this process for it meanwhile
                return
            self._foreign.discard(job_id)  # it ran there: from now on, like any job elsewhere
            job = dataclasses.replace(known, state="running" if held else "queued", elsewhere=held)
            self._put(job)  # what the owner learned (size, etag): no event while the state stays
        if not held:
            return
        received = self._live(job).received
        bps = rate.add(received)
        eta = (job.size - received) / bps if job.size is not None and bps > 0 else None
        self._progress(job, received, bps, eta)
