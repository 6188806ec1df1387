"""A worker that fails the chat's model: a load refused with `worker_unavailable`, or a reply
ended by `worker_lost`, shows its one-line message and "Reload without host:port", which
loads the model again with the same settings less that worker and, once loaded, drops it
from the model's saved settings. The message being answered and the reply so far stay. A
fake engine that reports workers failing as the real one does
(tests/gui/fake_worker_engine.py); offscreen."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.engine.client import EngineState
from app.engine.process import EngineCommand
from app.qt import Qt
from app.window import MainWindow
from runtime.settings.load import LoadSettings
from runtime.settings.user import ModelPrefs
from tests.gui.conftest import ENGINE_TIMEOUT_MS, WindowFactory
from tests.gui.fake_worker_engine import lost, unavailable

ROOT = Path(__file__).resolve().parents[2]
UP, DOWN = "127.0.0.1:50052", "127.0.0.1:50053"


def engine(record: Path) -> EngineCommand:
    return EngineCommand(sys.executable, ("-m", "tests.gui.fake_worker_engine", "--down", DOWN,
                                          "--record", str(record)), {"PYTHONPATH": str(ROOT)})


def loads(record: Path) -> list[dict]:
    """The load settings the app sent, in order."""
    return [json.loads(line) for line in record.read_text().splitlines()]


def remember(window: MainWindow, path: Path, workers: tuple[str, ...]) -> None:
    window.settings.update_model(path, ModelPrefs(LoadSettings(model_path=path, n_ctx=2048,
                                                               workers=workers)))


def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "split-model.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_a_load_refused_for_a_worker_offers_to_reload_without_it(
        qtbot, make_window: WindowFactory, tmp_path: Path) -> None:
    record = tmp_path / "loads.jsonl"
    window = make_window(engine(record))
    path = model_file(tmp_path)
    remember(window, path, (UP, DOWN))
    banner = window.chat.lost_worker
    problems: list[tuple[str, str]] = []
    window.controller.worker_problem.connect(lambda w, m: problems.append((w, m)))

    window.load_model_file(path)
    qtbot.waitUntil(lambda: banner.isVisible(), timeout=ENGINE_TIMEOUT_MS)
    assert problems == [(DOWN, unavailable(DOWN))]
    assert banner.text.text() == unavailable(DOWN)  # the server's one line, as it is
    assert banner.reload_button.text() == f"Reload without {DOWN}"
    assert window.client.state == EngineState.NO_MODEL
    assert loads(record)[-1]["workers"] == [UP, DOWN]

    qtbot.mouseClick(banner.reload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.client.state == EngineState.READY, timeout=ENGINE_TIMEOUT_MS)
    again = loads(record)[-1]
    assert again["workers"] == [UP] and again["n_ctx"] == 2048  # the same settings, less one
    qtbot.waitUntil(lambda: not banner.isVisible(), timeout=ENGINE_TIMEOUT_MS)
    assert window.settings.settings.model_prefs(path).load.workers == (UP,)
    assert window.statusBar().currentMessage().startswith(f"Loaded without {DOWN}, and removed")


def test_a_worker_lost_mid_reply_keeps_the_chat_and_reloads_without_it(
        qtbot, make_window: WindowFactory, tmp_path: Path) -> None:
    record = tmp_path / "loads.jsonl"
    window = make_window(engine(record))
    path = model_file(tmp_path)
    remember(window, path, (UP,))
    window.load_model_file(path)
    qtbot.waitUntil(lambda: window.client.state == EngineState.READY, timeout=ENGINE_TIMEOUT_MS)
    banner = window.chat.lost_worker
    assert not banner.isVisible()

    window.chat.composer.set_text("Tell me more [[lose]]")
    with qtbot.waitSignal(window.controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as done:
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    reply = done.args[0]
    message = lost(UP, path.stem)
    assert reply.status == "error" and reply.error == message
    assert reply.content == "Partly written before "  # the text so far stays
    window.chat.transcript.flush()
    card = window.chat.transcript.card(reply.id)
    assert message in card.error_label.text()
    assert banner.isVisible() and banner.text.text() == message
    assert banner.reload_button.text() == f"Reload without {UP}"
    # The message being answered is kept, in the transcript and on disk.
    conversation = window.controller.conversation
    stored = window.controller.store.messages(conversation.id)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "Tell me more [[lose]]"), ("assistant", "Partly written before ")]

    qtbot.mouseClick(banner.reload_button, Qt.MouseButton.LeftButton)
    assert banner.text.text() == f"Reloading the model without {UP}…"
    assert not banner.reload_button.isEnabled()
    qtbot.waitUntil(lambda: len(loads(record)) == 2 and window.client.state == EngineState.READY,
                    timeout=ENGINE_TIMEOUT_MS)
    assert loads(record)[-1]["workers"] == []
    qtbot.waitUntil(lambda: window.settings.settings.model_prefs(path).load.workers == (),
                    timeout=ENGINE_TIMEOUT_MS)
    assert not banner.isVisible()
    # Regenerate answers the same message on this machine alone.
    with qtbot.waitSignal(window.controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as again:
        window.controller.regenerate(reply.id)
    assert again.args[0].status == "done" and again.args[0].parent_id == stored[0].id
