"""One job's file, from the Hub into the library, resumed from its partial file. The download
manager (runtime.downloads.manager) runs one `FileDownload` in each worker; the queue, the workers and
the other processes are its business, the bytes of one file are this module's.

    path = FileDownload(job, downloads / f"{job.id}.part", hub=lambda: hub, client=client,
                        policy=RetryPolicy(), models_dir=models, downloads_dir=downloads,
                        record=save_job, notice=print, progress=print).run(StopFlag())

What happens to one file:

1. HEAD `resolve/<revision>/<file>` (huggingface_hub's `get_hf_file_metadata`): the etag (the
   LFS sha256), size, resolved commit and the URL to GET. 404 → `RemoteFileNotFound`,
   401/403 → `GatedRepo` (asks for a token; `set_token` + `retry` continues).
2. The partial `downloads/<job>.part` is checked against that etag: if the file changed
   upstream since the partial was started, it restarts from zero and says so (a notice). A
   partial longer than the file, or one that cannot be read, is discarded the same way: it
   can never become the file, and left in place it would fail every later attempt.
3. Free disk space is checked (`DiskFull`) before a byte is fetched.
4. GET with `Range: bytes=<partial size>-`; every received chunk is appended and hashed at once,
   never past the file's size (`OversizedDownload`). A resumed partial is first hashed from
   disk (hashlib's state cannot be saved across runs). A disk that fills up meanwhile is
   `DiskFull` too; the bytes already fetched stay in the partial for a retry.
5. Connection errors, HTTP 5xx/429 and stalls (no byte for `stall_timeout` seconds) are retried
   with exponential backoff; an attempt that made progress resets the count.
6. Size and sha256 are verified. A mismatch moves the file aside and fails with
   `HashMismatch`; only a verified file is moved into the library, atomically. One copy is
   kept aside per job (`kept_aside`: the next mismatch replaces it), deleted once the file
   arrives whole — a model-sized copy per failed attempt would fill the disk.

The disk-full message is one format, before the transfer and during it:

    disk full: 1.2 GB free on /home/me/.local/share/outrider/downloads, 4.4 GB needed for m.gguf

Why not `hf_hub_download`: it cannot pause, reports progress only through tqdm and resumes
only within one call. Outrider wraps the smallest piece itself, one ranged GET
(`runtime.downloads.transfer.fetch_into`); every Hub-specific part (URLs, headers, token, metadata,
errors) stays in huggingface_hub's hands.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from runtime.atomic_file import atomic_output
from runtime.downloads.queue import DownloadJob, RetryPolicy
from runtime.downloads.transfer import (
    Hashing,
    OutOfSpace,
    Rate,
    Retryable,
    StopFlag,
    fetch_into,
    same_origin,
)
from runtime.errors import (
    DiskFull,
    DownloadError,
    DownloadFailed,
    HashMismatch,
    HubServerError,
    HubUnreachable,
    shown,
)
from runtime.hub.client import FileMetadata, Hub
from runtime.units import fmt_bytes

# (received, total, bytes per second, seconds left)
ProgressSink = Callable[[int, int | None, float, float | None], None]


def kept_aside(downloads_dir: Path, job: DownloadJob) -> Path:
    """Where a job's bytes that failed verification are kept: one name per job, so a second
    mismatch replaces the first copy. `downloads/m.gguf.a1b2c3d4e5f6.bad`"""
    return downloads_dir / f"{Path(job.filename).name}.{job.id}.bad"


class FileDownload:
    """Fetches one job's file (the steps above) and returns its place in the library.

    What it learns of the job (etag, commit, size, sha256) goes to `record`, which saves it
    and returns the job as it now stands; `notice` (retries, upstream changes) and `progress`
    tell the user. `hub` is asked again at each attempt, so a token set meanwhile applies.
    """

    def __init__(self, job: DownloadJob, partial: Path, *, hub: Callable[[], Hub],
                 client: httpx.Client, policy: RetryPolicy, models_dir: Path,
                 downloads_dir: Path, record: Callable[..., DownloadJob],
                 notice: Callable[[str], None], progress: ProgressSink,
                 disk_usage: Callable[[Path], Any] = shutil.disk_usage,
                 reserve_bytes: int = 64 << 20, clock: Callable[[], float] = time.monotonic,
                 progress_interval: float = 0.25) -> None:
        self.job = job
        self.partial = partial
        self._hub = hub
        self._client = client
        self.policy = policy
        self.models_dir = models_dir
        self.downloads_dir = downloads_dir
        self._record = record
        self._notice = notice
        self._progress = progress
        self._disk_usage = disk_usage
        self._reserve = reserve_bytes
        self._clock = clock
        self._progress_interval = progress_interval

    def run(self, stop: StopFlag) -> Path:
        """Fetch, verify and place the file; `Stopped` when `stop` is raised, a typed
        `OutriderError` when it cannot be done."""
        policy, partial = self.policy, self.partial
        partial.parent.mkdir(parents=True, exist_ok=True)
        hashing = Hashing()
        attempt = 0
        while True:
            stop.check()
            job = self.job
            try:
                meta = self._hub().file_metadata(job.repo_id, job.filename, job.revision)
                job = self._reconcile(meta)
                size = meta.size or job.size
                offset = self._resume_from(size, hashing)
                self._check_disk((size - offset) if size is not None else 0, size or 0)
                if size is None or offset < size:
                    self._fetch(meta, offset, size, hashing, stop)
                break
            except OutOfSpace as exc:
                raise DiskFull(self._disk_full(self.downloads_dir, self._rest(exc))) from None
            except Retryable as exc:
                attempt = 1 if exc.received > 0 else attempt + 1
                reason = exc.reason
            except (HubUnreachable, HubServerError) as exc:
                attempt += 1
                reason = str(exc)
            if attempt >= policy.max_attempts:
                raise DownloadFailed(f"{shown(job.filename)}: gave up after {attempt} attempts "
                                     f"without progress ({reason})")
            delay = policy.delay(attempt)
            self._notice(f"{shown(job.filename)}: {reason}; retrying in {delay:.1f} s "
                         f"(attempt {attempt + 1} of {policy.max_attempts})")
            stop.wait(delay)
        stop.check()
        return self._verify_and_place(hashing)

    def _set(self, **changes: Any) -> DownloadJob:
        self.job = self._record(**changes)
        return self.job

    def _reconcile(self, meta: FileMetadata) -> DownloadJob:
        """Make sure the partial holds bytes of the file upstream has now; restart if not."""
        job = self.job
        expected = meta.sha256 or job.sha256
        if job.etag is None:
            if job.sha256 and meta.sha256 and job.sha256 != meta.sha256:
                self._notice(f"{job.filename} changed upstream since it was listed (now at "
                             f"revision {meta.commit[:8]})")
            self.partial.unlink(missing_ok=True)  # no etag yet: nothing valid can be in it
            return self._set(etag=meta.etag, commit=meta.commit, sha256=expected,
                             size=meta.size or job.size)
        if job.etag != meta.etag:
            self._notice(f"{job.filename} changed upstream (revision {(job.commit or '?')[:8]} → "
                         f"{meta.commit[:8]}); restarting it from zero")
            self.partial.unlink(missing_ok=True)
            return self._set(etag=meta.etag, commit=meta.commit, sha256=meta.sha256,
                             size=meta.size, received=0)
        if job.commit != meta.commit:  # a newer commit with this very file: the bytes still hold
            return self._set(commit=meta.commit)
        return job

    def _resume_from(self, size: int | None, hashing: Hashing) -> int:
        """Where the partial resumes, its bytes hashed (a resumed partial: hashed from disk).
        One longer than the file or unreadable is discarded, with a notice: 0."""
        partial = self.partial
        try:
            offset = partial.stat().st_size if partial.exists() else 0
            if size is None or offset <= size:
                hashing.sync(partial)
                return offset
            problem = f"the partial file is longer than the file ({offset:,} > {size:,} bytes)"
        except OSError as exc:
            problem = f"the partial file cannot be read ({exc.strerror or exc})"
        self._notice(f"{shown(self.job.filename)}: {problem}; discarded it, restarting from zero")
        try:
            partial.unlink(missing_ok=True)
        except OSError as exc:
            raise DownloadError(f"cannot delete the partial file {partial} ({exc.strerror}); "
                                "delete it, then Retry") from exc
        hashing.reset()
        return 0

    def _rest(self, exc: OutOfSpace) -> int:
        """Bytes still to fetch when the disk filled up (the partial holds the rest)."""
        try:
            held = self.partial.stat().st_size
        except OSError:
            held = exc.received
        return max(0, (self.job.size or held) - held)

    def _disk_full(self, folder: Path, needed: int) -> str:
        """The one disk-full message (module doc), naming a copy kept aside that could go."""
        free = self._disk_usage(folder).free
        message = (f"disk full: {fmt_bytes(free)} free on {folder}, {fmt_bytes(needed)} needed "
                   f"for {shown(self.job.filename)}")
        bad = kept_aside(self.downloads_dir, self.job)
        with contextlib.suppress(OSError):
            message += (f"; deleting the copy kept aside from a failed attempt ({shown(bad.name)}, "
                        f"{fmt_bytes(bad.stat().st_size)}) would make room")
        return message

    def _check_disk(self, remaining: int, size: int) -> None:
        """Enough room for the rest of the file (and, on another file system, the library copy),
        with `reserve_bytes` to spare."""
        self.models_dir.mkdir(parents=True, exist_ok=True)
        needs = [(self.downloads_dir, remaining)]
        if os.stat(self.models_dir).st_dev != os.stat(self.downloads_dir).st_dev:
            needs.append((self.models_dir, size))
        for folder, needed in needs:
            if self._disk_usage(folder).free < needed + self._reserve:
                raise DiskFull(self._disk_full(folder, needed + self._reserve))

    def _fetch(self, meta: FileMetadata, offset: int, size: int | None, hashing: Hashing,
               stop: StopFlag) -> None:
        job = self.job
        headers = self._hub().headers()
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
                self._progress(total, size, bps, eta)

        fetch_into(self._client, meta.location, headers, self.partial, offset, size, hashing,
                   stop, stall_timeout=self.policy.stall_timeout, on_progress=progress,
                   what=f"{job.repo_id}/{job.filename}")

    def _verify_and_place(self, hashing: Hashing) -> Path:
        job, partial = self.job, self.partial
        size = partial.stat().st_size
        if job.size is not None and size != job.size:
            self._set_aside()
            raise HashMismatch(f"{shown(job.filename)} is {size} bytes, not {job.size}; kept aside in "
                               f"{self.downloads_dir}")
        hashing.sync(partial)
        if job.sha256 is not None and hashing.digest.hexdigest() != job.sha256:
            bad = self._set_aside()
            raise HashMismatch(f"{shown(job.filename)} does not match its published sha256; the bad file "
                               f"is kept aside as {shown(bad.name)}")
        dest = self.models_dir / job.library_relpath
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(partial, dest)  # same file system: atomic
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise DownloadError(f"cannot move {shown(job.filename)} into {shown(dest.parent)}: {exc}") from exc
            self._copy_into(dest)
        with contextlib.suppress(OSError):  # an earlier attempt's bad copy is of no use now
            kept_aside(self.downloads_dir, job).unlink(missing_ok=True)
        with contextlib.suppress(DownloadError):  # the file is in place: that stands
            self._set(received=size)
        return dest

    def _copy_into(self, dest: Path) -> None:
        """Another file system: copy beside the target under a dot-name no scan lists, then
        rename, so the library never shows a half-copied file; a failed copy leaves nothing
        there (the verified partial stays for a retry)."""
        try:
            with atomic_output(dest, prefix=f".{dest.name}.", suffix=".incoming") as incoming:
                shutil.copyfile(self.partial, incoming)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(self._disk_full(dest.parent, self.partial.stat().st_size)) from None
            raise DownloadError(f"cannot copy {shown(self.job.filename)} into {shown(dest.parent)}: "
                                f"{exc.strerror or exc}") from exc
        self.partial.unlink()

    def _set_aside(self) -> Path:
        bad = kept_aside(self.downloads_dir, self.job)
        os.replace(self.partial, bad)
        return bad
