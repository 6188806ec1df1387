"""What the download queue is made of, and where it is kept: each job's record (`DownloadJob`),
the file that holds them all, `downloads/queue.json` (`QueueFile`), and how hard a job is
retried (`RetryPolicy`).

Every Outrider process of this user (the app, each `outrider pull`) runs its own
`DownloadManager` (runtime.downloads.manager) over the same downloads folder, and this file is all
they share about the jobs. So the records and their file live apart from the manager, free of
threads and the network: the manager decides what to fetch and when; `QueueFile` only reads
and writes records, one job at a time, so that no process drops another's jobs; `QueueWriter`
keeps the changes a full disk kept off the file for the next write.

    queue = QueueFile(Path("downloads/queue.json"))
    job = queue.add(DownloadJob(id="a1b2", repo_id="o/r", filename="m.gguf"), same=lambda j: False)
    queue.update([dataclasses.replace(job, state="running")])
    [j.state for j in queue.load()]    # ["running"], in this process and every other
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import filelock

from runtime.atomic_file import write_text
from runtime.errors import DownloadError, GatedRepo, QueueNotSaved

JobState = Literal["queued", "running", "paused", "done", "failed", "cancelled"]
SETTLED: frozenset[str] = frozenset({"paused", "done", "failed", "cancelled"})
ACTIVE: frozenset[str] = frozenset({"queued", "running", "paused"})
VIEW_ONLY: frozenset[str] = frozenset({"elsewhere", "leftover"})  # never written to the file


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
    # This process's view too: bytes the job holds in the downloads folder now (its partial
    # file and a copy kept aside after a failed check), which the user may delete.
    leftover: int = 0

    @property
    def library_relpath(self) -> Path:
        owner, _, name = self.repo_id.partition("/")
        return Path(owner) / name / self.filename

    @property
    def needs_token(self) -> bool:
        return self.error_kind == GatedRepo.__name__


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


class QueueFile:
    """The jobs as JSON, shared by every Outrider process of this user (the app, `outrider pull`).

    Each change is one read-modify-write under a cross-process file lock (`queue.json.lock`,
    through `filelock`): read the file, put in the one job this process changed (or drop the
    one it removed), write it back atomically (temporary file + rename). Jobs another process
    added or changed meanwhile survive; a whole-list rewrite would drop them.

        app:  update([A])   -> file {A}
        pull: update([B])   -> file {A, B}     (a plain rewrite of pull's own list: {B})

    The lock is an OS lock (flock / LockFileEx): the kernel drops it when its holder dies, so
    a crashed process never leaves the queue locked. A live holder that hangs for `timeout`
    seconds ends the wait with a `DownloadError` instead of blocking forever. A write that
    fails (a full disk) is `QueueNotSaved` and leaves the file as it was, whole.
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

    def stamp(self) -> tuple[int, int, int] | None:
        """What tells one version of the file from the next, without reading or locking it:
        (inode, mtime in ns, size), None while there is no file. Each write renames a new file
        over the old one, so the inode and mtime change with every write. A process that
        follows other processes' changes compares stamps and loads only when one changed."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

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
        known = {f.name for f in dataclasses.fields(DownloadJob)} - VIEW_ONLY
        jobs = [DownloadJob(**{k: v for k, v in d.items() if k in known})
                for d in data.get("jobs", [])]
        return {job.id: job for job in jobs}

    def _write(self, jobs: Iterable[DownloadJob]) -> None:
        records = [{k: v for k, v in dataclasses.asdict(j).items() if k not in VIEW_ONLY}
                   for j in jobs]  # VIEW_ONLY: one process's view, not the job's
        text = json.dumps({"version": 1, "jobs": records}, indent=1)
        try:
            write_text(self.path, text, prefix=".queue-", suffix=".tmp")
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise QueueNotSaved(f"disk full: the download queue could not be saved "
                                    f"({self.path}); downloads go on, and it is saved again "
                                    "once there is room") from exc
            raise QueueNotSaved(f"the download queue could not be saved ({self.path}: "
                                f"{exc.strerror or exc}); it is saved again at its next "
                                "change") from exc


@dataclass(frozen=True)
class QueueSaveChanged:
    """Whether the queue file holds this process's changes: `problem` (a `QueueNotSaved`
    message, "disk full: ...") when a write first failed, None when a write succeeded again
    and put in every change made meanwhile. Said once each way, not at every failed write."""

    problem: str | None


class QueueWriter:
    """One process's writes to its `QueueFile`, which a full disk does not stop: a change a
    failed write kept off the file waits for the next write that succeeds, and goes in with
    it; meanwhile the queue goes on in memory. What `save` returns is the news, once each way:

        writer = QueueWriter(queue_file)
        writer.save(jobs, changed="a1b2")  # disk full: a1b2 waits; QueueSaveChanged("disk full: …")
        writer.save(jobs, changed="c3d4")  # still full: both wait; None (said already)
        writer.save(jobs)                  # room again: a1b2 and c3d4 written; QueueSaveChanged(None)

    Why not write the whole list of this process's jobs instead: other processes' changes to
    the file would be lost (`QueueFile`). Not thread-safe: the manager calls it under its lock.
    """

    def __init__(self, file: QueueFile) -> None:
        self.file = file
        self.changed: set[str] = set()  # ids whose record in memory the file lacks
        self.removed: set[str] = set()  # ids removed here, still on file
        self._problem: str | None = None

    @property
    def pending(self) -> bool:
        return bool(self.changed or self.removed)

    def save(self, jobs: Mapping[str, DownloadJob], changed: str | None = None,
             removed: str | None = None) -> QueueSaveChanged | None:
        """Write `changed` (its record in `jobs`) or drop `removed`, with every change waiting.
        A queue locked too long is the `DownloadError`, raised (a removal it refused is not
        kept: the caller keeps the job); a full disk (`QueueNotSaved`) keeps them waiting."""
        if changed is not None:
            self.changed.add(changed)
        if removed is not None:
            self.changed.discard(removed)
            self.removed.add(removed)
        try:
            self.file.update([jobs[i] for i in self.changed if i in jobs], removed=self.removed)
        except QueueNotSaved as exc:
            if self._problem is not None:
                return None
            self._problem = str(exc)
            return QueueSaveChanged(self._problem)
        except DownloadError:
            if removed is not None:
                self.removed.discard(removed)
            raise
        self.changed.clear()
        self.removed.clear()
        if self._problem is None:
            return None
        self._problem = None
        return QueueSaveChanged(None)

    def forget(self, job_id: str) -> None:
        """The file's record of the job is newer than ours (another process changed it)."""
        self.changed.discard(job_id)
