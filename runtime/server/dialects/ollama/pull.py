"""Ollama's `POST /api/pull`: a Hugging Face model into the library, through Outrider's download
manager (resumable, verified, shared with the app's queue), its progress as Ollama streams it.

The name is a Hub repository with an optional quant or file (`runtime.server.models.names`):

    owner/repo:Q4_K_M        the file whose name claims Q4_K_M (all parts, when split)
    owner/repo:file.gguf     that file
    owner/repo               the recommended quant (your preferred level, as `outrider pull`)
    hf.co/owner/repo:Q8_0    Ollama's spelling for Hub models: the prefix is dropped

Progress, one JSON object per line (Ollama's lines; the digest is the file's sha256):

    {"status": "pulling manifest"}
    {"status": "pulling 3f2a9c1b0d4e", "digest": "sha256:3f2a…", "total": 98765, "completed": 4096}
    …
    {"status": "verifying sha256 digest"}
    {"status": "writing manifest"}
    {"status": "success"}

A vision model's pull brings its projector (the repository's mmproj file: one more
"pulling <digest>" line), so the model reads images once it is in.
A repository or quant that does not exist is a 404 before anything streams; a download that
fails later is an `{"error": "..."}` line. A model already in the library answers success at
once. If the client goes away, the partial file is kept and resumes on the next pull (here,
in the app, or with `outrider pull`). The Hub is the one in the user's settings (a mirror),
else HF_ENDPOINT; its token too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from runtime.downloads.manager import DownloadManager, DownloadProgress, DownloadStateChanged
from runtime.errors import ModelNotFound, OutriderError, shown
from runtime.hub.client import Hub, RepoFile
from runtime.hub.quants import QuantEntry, entry_by_name, list_quants
from runtime.paths import user_dirs
from runtime.server.models.names import bare_name
from runtime.server.request.fields import refuse
from runtime.settings.user import SettingsStore


@dataclass(frozen=True)
class PullPlan:
    """What a pull fetches: the entry, from which Hub, into which folder."""

    hub: Hub
    entry: QuantEntry
    models_dir: Path

    @property
    def present(self) -> bool:
        """Every file already in the library at its published size."""
        return not self.missing

    @property
    def missing(self) -> tuple[RepoFile, ...]:
        """The files still to fetch (a vision model's projector among them)."""
        return self.entry.missing_in(self.models_dir / self.entry.repo_id)


def split_name(asked: str) -> tuple[str, str]:
    """(repository, quant or file; "" for the recommended one).

    >>> split_name("hf.co/bartowski/Qwen2.5-7B-Instruct-GGUF:q4_k_m")
    ('bartowski/Qwen2.5-7B-Instruct-GGUF', 'q4_k_m')
    """
    repo_id, _, wanted = bare_name(asked).partition(":")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        refuse("model", f"{shown(asked)!r} is not a Hugging Face repository: give "
               "owner/name[:QUANT], e.g. bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M")
    return repo_id, wanted


def plan_pull(asked: str, models_dir: Path) -> PullPlan:
    """Look the model up on the Hub (blocking: call it off the event loop). Raises the
    Hub's typed errors (RepoNotFound …) or `OutriderError` for a quant it does not have."""
    repo_id, wanted = split_name(asked)
    settings = SettingsStore().load()
    token = settings.hf_token.reveal() if settings.hf_token else None
    hub = Hub(token=token, endpoint=settings.hub.endpoint, cache_dir=user_dirs().cache)
    details = hub.repo_details(repo_id)
    if wanted:
        named = entry_by_name(details, wanted)  # with its projector, for a vision model
        if named is not None:
            return PullPlan(hub, named, models_dir)
    listing = list_quants(hub, repo_id, preferred=settings.hub.preferred_quant, details=details)
    if wanted:
        try:
            return PullPlan(hub, listing.entry(wanted), models_dir)
        except OutriderError as exc:  # no such quant: as unknown as an unknown repository
            raise ModelNotFound(str(exc)) from None
    if listing.recommended is None:
        raise OutriderError(f"{repo_id}: {listing.recommended_reason}; name a quant "
                            "(owner/name:Q4_K_M) to pull one anyway")
    return PullPlan(hub, listing.recommended, models_dir)


def _digest_line(sha256: str | None, filename: str, total: int | None,
                 completed: int) -> dict[str, Any]:
    digest = sha256 or filename
    return {"status": f"pulling {digest[:12]}", "digest": f"sha256:{digest}",
            "total": total or 0, "completed": completed}


async def pull_lines(plan: PullPlan) -> AsyncIterator[dict[str, Any]]:
    """The progress lines of one pull (module doc); the last is success or an error."""
    yield {"status": "pulling manifest"}
    entry = plan.entry
    files = plan.missing  # a vision model's projector too
    if not files:
        for f in entry.download_files:
            yield _digest_line(f.sha256, f.name, f.size, f.size or 0)
        yield {"status": "success"}
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the client is gone
            loop.call_soon_threadsafe(queue.put_nowait, item)

    manager = DownloadManager(plan.hub, models_dir=plan.models_dir, max_concurrent=2,
                              on_event=put)
    # The parts of a split model come from one commit: pin them to the listed one.
    revision = entry.revision if len(entry.files) > 1 else "main"

    def run() -> None:
        try:
            jobs = [manager.enqueue(entry.repo_id, f.name, revision, size=f.size,
                                    sha256=f.sha256, group=f"{entry.repo_id}:{entry.quant}")
                    for f in files]
            put(("queued", {job.id: (f.sha256, f.name, f.size)
                            for job, f in zip(jobs, files, strict=True)}))
            manager.start(only=[job.id for job in jobs])
            put(("finished", manager.wait([job.id for job in jobs])))
        except Exception as exc:  # the queue file could not be written or locked, …
            put(("failed", str(exc)))

    threading.Thread(target=run, name="outrider-pull", daemon=True).start()
    sha: dict[str, tuple[str | None, str, int | None]] = {}
    try:
        while True:
            item = await queue.get()
            if isinstance(item, tuple) and item[0] == "queued":
                sha = item[1]
            elif isinstance(item, DownloadProgress) and item.job_id in sha:
                digest, name, size = sha[item.job_id]
                yield _digest_line(digest, name, item.total or size, item.received)
            elif isinstance(item, DownloadStateChanged) and item.job.id in sha \
                    and item.job.state == "done":
                digest, name, size = sha[item.job.id]
                yield _digest_line(digest, name, size, size or 0)
            elif isinstance(item, tuple) and item[0] == "failed":
                yield {"error": f"the download could not start: {item[1]}"}
                return
            elif isinstance(item, tuple) and item[0] == "finished":
                failed = [job for job in item[1] if job.state != "done"]
                if failed:
                    job = failed[0]
                    yield {"error": job.error or f"{job.filename} did not finish ({job.state}); "
                           "pull again to resume it"}
                    return
                yield {"status": "verifying sha256 digest"}
                yield {"status": "writing manifest"}
                yield {"status": "success"}
                return
    finally:
        # The client left or the pull ended: stop the workers (a partial file resumes later),
        # even when this generator is being cancelled.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: manager.shutdown(timeout=10))
