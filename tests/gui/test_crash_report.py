"""A hard crash of the app writes a report, and the next start shows it (as qutebrowser does).

The crash is real: `OUTRIDER_DEBUG_CRASH=segfault` makes the app die of SIGSEGV once its
window is up (app.crash.crash_if_asked). The next start is the app's own start-up path
(`app.main._run`), in this process, with the message box read before the loop quits.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app import main as app_main
from app.qt import QtCore, QtWidgets
from runtime.paths import UserDirs

ROOT = Path(__file__).resolve().parents[2]


def _dirs(home: Path) -> UserDirs:
    return UserDirs(home / "data", home / "config", home / "cache", home / "state")


def _crash_the_app(home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OUTRIDER_HOME=str(home), OUTRIDER_DEBUG_CRASH="segfault",
               QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "app.main", "--no-model"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def crashed_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    run = _crash_the_app(home)
    assert run.returncode == -signal.SIGSEGV, run.stderr[-3000:]
    return home


def test_a_segfault_leaves_a_report_in_the_state_folder(crashed_home: Path) -> None:
    reports = list((crashed_home / "state" / "crash").glob("session-*.log"))
    assert len(reports) == 1
    text = reports[0].read_text()
    assert "Fatal Python error: Segmentation fault" in text
    assert "crash_if_asked" in text  # the stack of the thread that crashed, as a person sees it


def test_the_next_start_says_so_with_the_details(qtbot, crashed_home: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTRIDER_HOME", str(crashed_home))
    monkeypatch.delenv("OUTRIDER_DEBUG_CRASH", raising=False)
    shown: list[tuple[str, str, str]] = []

    def read_the_box_then_quit() -> None:
        for box in QtWidgets.QApplication.topLevelWidgets():
            for found in [box, *box.findChildren(QtWidgets.QMessageBox)]:
                if isinstance(found, QtWidgets.QMessageBox) and found.isVisible():
                    shown.append((found.windowTitle(), found.text(), found.detailedText()))
                    found.close()
        QtWidgets.QApplication.quit()

    QtCore.QTimer.singleShot(500, read_the_box_then_quit)
    args = argparse.Namespace(model=None, no_model=True, self_test=False, fixtures=None)
    assert app_main._run(args, _dirs(crashed_home)) == 0

    assert len(shown) == 1
    title, text, details = shown[0]
    assert title == "Outrider closed unexpectedly"
    assert "crashed the last time it ran" in text
    assert "Segmentation fault" in details and "crash_if_asked" in details
    kept = list((crashed_home / "state" / "crash").glob("crash-*.txt"))
    assert len(kept) == 1, "the report is kept, renamed, for the user to send"
    assert not list((crashed_home / "state" / "crash").glob("session-*.log"))  # shown once
