"""queue.json shared by processes: the app and `outrider pull` add jobs at the same time and
none is lost; a hung lock holder ends in a typed error, a dead one blocks nothing; the
file's stamp changes with every write (what a running app compares to notice new jobs)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.downloads.manager import DownloadManager
from runtime.downloads.queue import DownloadJob, QueueFile
from runtime.errors import DownloadError
from runtime.hub.client import Hub

ROOT = Path(__file__).resolve().parents[3]

# One process adding `n` jobs to the shared queue once told to go (a line on stdin), so two of
# them write at the same time. enqueue without start() touches no network.
ADDER = """
import sys
from pathlib import Path
from runtime.downloads.manager import DownloadManager
from runtime.hub.client import Hub
folder, tag, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
manager = DownloadManager(Hub(), models_dir=folder / "models", downloads_dir=folder / "downloads")
print("ready", flush=True)
sys.stdin.readline()
for i in range(n):
    manager.enqueue("owner/repo", f"{tag}-{i}.gguf")
manager.shutdown()
"""

# Holds the queue's lock until its stdin closes or it is killed.
HOLDER = """
import sys
import filelock
lock = filelock.FileLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()
"""


def child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def queued_names(downloads: Path) -> list[str]:
    data = json.loads((downloads / "queue.json").read_text())
    return sorted(job["filename"] for job in data["jobs"])


def test_two_processes_adding_at_once_lose_no_job(tmp_path: Path) -> None:
    n = 40
    adders = [child(ADDER, str(tmp_path), tag, str(n)) for tag in ("app", "pull")]
    try:
        for proc in adders:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in adders:  # both go together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
        assert [proc.wait(120) for proc in adders] == [0, 0]
    finally:
        for proc in adders:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    expected = sorted(f"{tag}-{i}.gguf" for tag in ("app", "pull") for i in range(n))
    assert queued_names(tmp_path / "downloads") == expected


def test_changes_keep_jobs_another_process_added(tmp_path: Path) -> None:
    """A manager's own changes (a removal here) rewrite only its jobs, never the whole list."""
    downloads = tmp_path / "downloads"
    mine = DownloadManager(Hub(), models_dir=tmp_path / "models", downloads_dir=downloads)
    job = mine.enqueue("owner/repo", "mine.gguf")
    other = DownloadManager(Hub(), models_dir=tmp_path / "models", downloads_dir=downloads)
    other.enqueue("owner/repo", "theirs.gguf")  # `mine` never saw this one
    mine.cancel(job.id)
    assert queued_names(downloads) == ["mine.gguf", "theirs.gguf"]
    mine.remove(job.id)
    assert queued_names(downloads) == ["theirs.gguf"]
    for m in (mine, other):
        m.shutdown()


def test_enqueue_joins_the_job_another_process_queued_meanwhile(tmp_path: Path) -> None:
    """The app read the queue before `outrider pull` queued a file; the app's Download of the
    same file is then pull's job, not a second download of it."""
    downloads = tmp_path / "downloads"
    app = DownloadManager(Hub(), models_dir=tmp_path / "models", downloads_dir=downloads)
    pull = DownloadManager(Hub(), models_dir=tmp_path / "models", downloads_dir=downloads)
    theirs = pull.enqueue("owner/repo", "a.gguf")
    mine = app.enqueue("owner/repo", "a.gguf")
    assert (mine.id, mine.state) == (theirs.id, "queued")
    assert [j.id for j in app.jobs()] == [theirs.id]
    assert queued_names(downloads) == ["a.gguf"]
    other = app.enqueue("owner/repo", "a.gguf", revision="v2")  # another file: its own job
    assert other.id != theirs.id
    for m in (app, pull):
        m.shutdown()


def test_a_held_lock_is_a_typed_error_and_a_dead_holder_blocks_nothing(tmp_path: Path) -> None:
    downloads = tmp_path / "downloads"
    manager = DownloadManager(Hub(), models_dir=tmp_path / "models", downloads_dir=downloads,
                              queue_lock_timeout=0.2)
    holder = child(HOLDER, str(downloads / "queue.json.lock"))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(DownloadError, match="another Outrider process has held the download queue"):
            manager.enqueue("owner/repo", "a.gguf")
        assert manager.jobs() == []  # nothing half-added
    finally:
        holder.kill()  # dies holding the lock: the OS releases it
        holder.wait()
    job = manager.enqueue("owner/repo", "a.gguf")
    assert [j.id for j in manager.jobs()] == [job.id]
    assert queued_names(downloads) == ["a.gguf"]
    manager.shutdown()


def test_the_stamp_changes_with_every_write(tmp_path: Path) -> None:
    """What the app's watcher compares to notice other processes' jobs without reading the file."""
    queue = QueueFile(tmp_path / "queue.json")
    assert queue.stamp() is None  # no file yet
    job = queue.add(DownloadJob(id="a1", repo_id="owner/repo", filename="a.gguf"), lambda j: False)
    stamps = [queue.stamp()]
    for state in ("running", "running", "done"):  # the same bytes twice still count as a write
        queue.update([dataclasses.replace(job, state=state)])
        stamps.append(queue.stamp())
    assert None not in stamps
    assert all(before != after for before, after in itertools.pairwise(stamps))
    queue.load()  # reading changes nothing
    assert queue.stamp() == stamps[-1]
