"""An engine stopped on purpose is logged and reported as stopped, never as a crash."""

from __future__ import annotations

from pathlib import Path

from app.engine.process import EngineExit, EngineProcess
from tests.gui.conftest import fake_command

WAIT = 60_000


def test_an_intended_stop_is_not_a_crash(qtbot, tmp_path: Path) -> None:
    process = EngineProcess(fake_command(), tmp_path)
    with qtbot.waitSignal(process.ready, timeout=WAIT):
        process.start()
    with qtbot.waitSignal(process.exited, timeout=WAIT) as exited:
        process.stop()
    info: EngineExit = exited.args[0]
    assert info.expected and not info.crashed
    assert info.describe() == "The engine stopped."
    assert info.log_path is not None
    last = info.log_path.read_text().strip().splitlines()[-1]
    assert last == "--- exit: stopped as asked"
    assert "crash" not in info.log_path.read_text()
