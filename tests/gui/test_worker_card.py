"""The Server page's "Lend this machine" card: it runs the worker command with the host and
port typed, goes Starting → Serving on the worker's "listening on" line and shows what it
printed, Stop ends it (Stopped), a worker that cannot listen ends Failed with its one-line
error, a host beyond loopback shows the exposure warning, and quitting the app stops the
worker. A fake `outrider worker` (tests/gui/fake_worker_cli.py); offscreen."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from app.engine.process import EngineCommand
from app.qt import Qt
from app.server.worker_card import WorkerCard, WorkerState
from runtime.planner.workers import exposure_warning
from tests.gui.conftest import fake_command

ROOT = Path(__file__).resolve().parents[2]
WAIT = 20_000


def fake_worker(mode: str = "serve") -> EngineCommand:
    return EngineCommand(sys.executable, ("-m", "tests.gui.fake_worker_cli", "--mode", mode),
                         {"PYTHONPATH": str(ROOT)})


@pytest.fixture
def card(qtbot) -> Iterator[WorkerCard]:
    made = WorkerCard(fake_worker())
    qtbot.addWidget(made)
    yield made
    made.shutdown()


def test_start_serves_shows_its_lines_and_stop_stops_it(qtbot, card: WorkerCard) -> None:
    assert card.state == WorkerState.STOPPED and card.state_label.text() == "Stopped"
    assert card.host.text() == "127.0.0.1" and card.port.value() == 50052
    assert card.warning.isHidden()  # loopback: nothing to warn of
    card.port.setValue(50099)
    states: list[WorkerState] = []
    card.state_changed.connect(states.append)
    with qtbot.waitSignals([card.state_changed, card.state_changed], timeout=WAIT):
        qtbot.mouseClick(card.start_button, Qt.MouseButton.LeftButton)
    assert states == [WorkerState.STARTING, WorkerState.SERVING]
    assert card.state_label.text() == "Serving"
    assert card.output.toPlainText().splitlines() == [
        "Outrider worker: lending CPU (Fake CPU), 16.0 GiB total, 12.0 GiB free",
        "listening on 127.0.0.1:50099 (llama.cpp RPC 7.0.0): load with --worker 127.0.0.1:50099"]
    assert not card.start_button.isEnabled() and not card.host.isEnabled()
    (child,) = psutil.Process().children(recursive=True)
    assert child.cmdline()[-6:] == ["--host", "127.0.0.1", "--port", "50099", "--parent-pid",
                                    str(os.getpid())]

    with qtbot.waitSignal(card.state_changed, timeout=WAIT):
        qtbot.mouseClick(card.stop_button, Qt.MouseButton.LeftButton)
    assert states[-1] == WorkerState.STOPPED and not card.running
    assert card.error.isHidden() and card.start_button.isEnabled()
    assert not psutil.Process().children(recursive=True)


def test_a_port_in_use_fails_with_the_workers_own_line(qtbot, card: WorkerCard) -> None:
    card.command = fake_worker("port-in-use")
    states: list[WorkerState] = []
    card.state_changed.connect(states.append)
    with qtbot.waitSignals([card.state_changed, card.state_changed], timeout=WAIT):
        card.start()
    assert states == [WorkerState.STARTING, WorkerState.FAILED]
    assert card.state_label.text() == "Failed"
    assert card.error.text() == ("port 50052 on 127.0.0.1 is already in use: [Errno 98] Address "
                                 "already in use")
    assert not card.error.isHidden() and card.start_button.isEnabled()


def test_a_host_beyond_loopback_is_warned_of_and_a_bad_one_cannot_start(
        qtbot, card: WorkerCard) -> None:
    card.host.setText("192.168.1.20")
    assert not card.warning.isHidden()
    assert card.warning.text() == exposure_warning("192.168.1.20", 50052)
    assert "no authentication" in card.warning.text() and card.start_button.isEnabled()
    card.port.setValue(7000)  # the warning's tunnel names the port
    assert card.warning.text() == exposure_warning("192.168.1.20", 7000)
    card.host.setText("localhost")
    assert card.warning.isHidden()
    card.host.setText("bad host")
    assert not card.start_button.isEnabled()
    assert card.warning.text().startswith("a worker is host:port")


def test_quitting_the_app_stops_the_worker(qtbot, make_window) -> None:
    window = make_window(fake_command())
    card = window.server.worker_card
    card.command = fake_worker()
    card.start()
    qtbot.waitUntil(lambda: card.state == WorkerState.SERVING, timeout=WAIT)
    worker_pid = next(p.pid for p in psutil.Process().children(recursive=True)
                      if "tests.gui.fake_worker_cli" in p.cmdline())
    window.close()
    assert not card.running
    assert not psutil.pid_exists(worker_pid) or \
        psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE
