"""What the download queue is made of, and where it is kept: each job's record (`DownloadJob`),
the file that holds them all, `downloads/queue.json` (`QueueFile`), and how hard a job is
retried (`RetryPolicy`).

Every Outrider process of this user (the app, each `outrider pull`) runs its own
`DownloadManager` (runtime.downloads.manager) over the same downloads folder, and this file is all
they share about the jobs. So the records and their file live apart from the manager, free of
threads and the network: the manager decides what to fetch and when; `QueueFile` only reads
and writes records, one job at a time, so that no process drops another's jobs.

    queue = QueueFile(Path("downloads/queue.json"))
    job = queue.add(DownloadJob(id="a1b2", repo_id="o/r", filename="m.gguf"), same=lambda j: False)
    queue.update([dataclasses.replace(job, state="running")])
    [j.state for j in queue.load()]    # ["running"], in this process and every other
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import filelock

from runtime.atomic_file import write_text
from runtime.errors import DownloadError, GatedRepo

JobState = Literal["queued", "running", "paused", "done", "failed", "cancelled"]
SETTLED: frozenset[str] = frozenset({"paused", "done", "failed", "cancelled"})
ACTIVE: frozenset[str] = frozenset({"queued", "running", "paused"})


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
        known = {f.name for f in dataclasses.fields(DownloadJob)} - {"elsewhere"}
        jobs = [DownloadJob(**{k: v for k, v in d.items() if k in known})
                for d in data.get("jobs", [])]
        return {job.id: job for job in jobs}

    def _write(self, jobs: Iterable[DownloadJob]) -> None:
        records = [dataclasses.asdict(j) for j in jobs]
        for record in records:
            del record["elsewhere"]  # one process's view, not the job's
        text = json.dumps({"version": 1, "jobs": records}, indent=1)
        write_text(self.path, text, prefix=".queue-", suffix=".tmp")
