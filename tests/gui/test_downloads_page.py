"""The Downloads page when the disk and the server misbehave: what a failed download left in
the downloads folder is offered for deletion, and a queue file that cannot be saved (a full
disk) is said above the table until a later save catches up."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

import runtime.atomic_file
from app.models.downloads_page import DownloadsPage
from app.services.models import ModelServices
from tests.hubserver import TINY_REPO, FakeHub, Fault

FILE = "tiny-F32.gguf"
pytest_plugins = ["tests.gui.model_fixtures"]  # its fixtures: hub, services, settings_ctl ...
WAIT = 20_000


@pytest.fixture
def page(qtbot: Any, services: ModelServices) -> DownloadsPage:
    p = DownloadsPage(services, ask_token=lambda _parent, _repo: None)
    qtbot.addWidget(p)
    return p


def failed_job(qtbot: Any, page: DownloadsPage) -> str:
    qtbot.waitUntil(lambda: any(j.state == "failed" for j in page.jobs.values()), timeout=WAIT)
    return next(i for i, j in page.jobs.items() if j.state == "failed")


def test_delete_files_frees_what_a_failed_download_left(
        qtbot: Any, page: DownloadsPage, services: ModelServices, hub: FakeHub) -> None:
    hub.set_fault(TINY_REPO, FILE, Fault(corrupt=True))  # fails its check: a copy kept aside
    services.on_disk(services.downloads.enqueue, TINY_REPO, FILE)
    job_id = failed_job(qtbot, page)
    downloads = services.downloads.downloads_dir
    [bad] = downloads.glob("*.bad")
    button = page.button(job_id, "delete")
    assert button is not None and button.text() == "Delete files"
    assert "Retry fetches the file from the start" in button.toolTip()

    button.click()
    qtbot.waitUntil(lambda: page.button(job_id, "delete") is None, timeout=WAIT)
    assert not bad.exists()
    qtbot.waitUntil(lambda: page.details.text().startswith("Deleted "), timeout=WAIT)
    assert page.state_of(job_id) == "failed"  # the job stays, for a retry
    assert page.button(job_id, "retry") is not None


def test_a_full_disk_under_the_queue_is_said_once_and_cleared(
        qtbot: Any, page: DownloadsPage, services: ModelServices, hub: FakeHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def full(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode and ".queue-" in Path(file).name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return open(file, mode, *args, **kwargs)

    # Held at byte 1,000,000 until the disk is full; then it fails its check.
    hub.set_fault(TINY_REPO, FILE, Fault(corrupt=True, stall_at=1_000_000, stall_seconds=60))
    services.on_disk(services.downloads.enqueue, TINY_REPO, FILE)
    qtbot.waitUntil(lambda: bool(page.jobs) and page.progress_of(next(iter(page.jobs)))[0] > 0,
                    timeout=WAIT)
    with monkeypatch.context() as patched:
        patched.setattr(runtime.atomic_file, "open", full, raising=False)
        hub.release_stalls()
        job_id = failed_job(qtbot, page)  # failed in memory, the file unsaved
        qtbot.waitUntil(lambda: not page.queue_problem.isHidden(), timeout=WAIT)
    assert page.queue_problem.text().startswith(
        "The download queue is not saved: disk full: the download queue could not be saved")

    page.act("remove", job_id)  # room again: this change is saved, and all before it
    qtbot.waitUntil(lambda: page.queue_problem.isHidden(), timeout=WAIT)
    qtbot.waitUntil(lambda: not page.jobs, timeout=WAIT)
    assert list(services.downloads.downloads_dir.glob("*.bad")) == []  # removed with the job
