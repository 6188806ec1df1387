"""The chat in a real main window: streaming, Stop, Regenerate, Edit & resend, persistence,
an engine crash mid-reply, export. Streaming and the crash run against the real engine
process on the tiny model; the rest use the deterministic fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.chat.conversation import Message
from app.engine.client import EngineState
from app.qt import Qt, QtCore
from app.window import MainWindow
from runtime.events import SamplingParams
from tests.gui.conftest import ENGINE_TIMEOUT_MS, WindowFactory, fake_command, load
from tests.gui.fake_server import reply_tokens


def send(qtbot, window: MainWindow, text: str, timeout: int = ENGINE_TIMEOUT_MS) -> Message:
    """Type `text`, press Enter, wait for the reply to end; return the reply."""
    window.chat.composer.set_text(text)
    with qtbot.waitSignal(window.controller.reply_finished, timeout=timeout) as blocker:
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    return blocker.args[0]


def reply_card_text(window: MainWindow, message: Message) -> str:
    window.chat.transcript.flush()
    card = window.chat.transcript.card(message.id)
    assert card is not None
    return card.plain_text()


def test_a_reply_from_the_real_engine_lands_with_its_statistics(
        qtbot, real_window: MainWindow) -> None:
    window = real_window
    window.controller.new_conversation()
    window.controller.set_sampling(SamplingParams(temperature=0.0, max_tokens=24))
    reply = send(qtbot, window, "Hello there")

    assert reply.status == "done", reply.error
    assert reply.stats["tokens"] == 24  # greedy, max_tokens: the tiny model never stops early
    assert reply_card_text(window, reply).strip()
    card = window.chat.transcript.card(reply.id)
    assert "24 tokens" in card.footer.text()
    assert "tok/s" in card.footer.text() and "TTFT" in card.footer.text()


# Qt's own complaint when a killed peer fails one reply twice (closed, then a read error);
# seen once in ten runs. What the user sees is asserted below.
@pytest.mark.qt_log_ignore("QNetworkReplyImplPrivate::error: Internal problem, this method "
                           "must only be called once.")
def test_engine_killed_mid_reply_keeps_text_shows_error_and_recovers(
        qtbot, real_window: MainWindow) -> None:
    window = real_window
    controller = window.controller
    controller.new_conversation()
    controller.set_sampling(SamplingParams(temperature=1.0, seed=3, max_tokens=1500))
    first_pid = window.client.process.pid
    window.chat.composer.set_text("Tell me a long story")
    with qtbot.waitSignal(controller.message_changed, timeout=ENGINE_TIMEOUT_MS,
                          check_params_cb=lambda mid: bool(controller.tree.get(mid).content)):
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as finished:
        window.client.process.kill()
    reply: Message = finished.args[0]

    assert reply.status == "error"
    assert reply.content, "the partial reply must be kept"
    assert "engine stopped" in (reply.error or "")
    assert reply.error not in reply.content
    card = window.chat.transcript.card(reply.id)
    assert card.error_label.isVisible() and "engine stopped" in card.error_label.text()
    assert "engine stopped" not in card.plain_text()
    qtbot.waitUntil(lambda: window.client.state == EngineState.CRASHED)
    saved = controller.store.messages(reply.conversation_id)[-1]
    assert saved.content == reply.content and saved.status == "error"

    controller.set_sampling(SamplingParams(temperature=0.0, max_tokens=8))
    again = send(qtbot, window, "Are you back?")
    assert again.status == "done", again.error
    assert again.content
    assert window.client.process.pid != first_pid

    window.chat.transcript.open_log_requested.emit()
    assert window.pages.currentWidget() is window.server
    assert "OUTRIDER_SERVER_READY" in window.server.log_view.toPlainText()


def test_stop_mid_reply_keeps_the_partial_text(qtbot, fake_window: MainWindow) -> None:
    window, controller = fake_window, fake_window.controller
    window.chat.composer.set_text("[[slow]] " + "word " * 40)
    with qtbot.waitSignal(controller.message_changed, timeout=10_000,
                          check_params_cb=lambda mid: bool(controller.tree.get(mid).content)):
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    assert window.chat.composer.send_button.text() == "Stop"
    with qtbot.waitSignal(controller.reply_finished, timeout=10_000) as finished:
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    reply: Message = finished.args[0]
    full = "".join(reply_tokens("[[slow]] " + "word " * 40))
    assert reply.status == "stopped"
    assert reply.content and full.startswith(reply.content) and reply.content != full
    assert window.chat.transcript.card(reply.id).footer.text().startswith("Stopped")
    assert window.chat.composer.send_button.text() == "Send"


def test_regenerate_keeps_both_replies_as_branches(qtbot, fake_window: MainWindow) -> None:
    window, controller = fake_window, fake_window.controller
    first = send(qtbot, window, "hello")
    card = window.chat.transcript.card(first.id)
    with qtbot.waitSignal(controller.reply_finished, timeout=10_000) as finished:
        qtbot.mouseClick(card.regenerate_button, Qt.MouseButton.LeftButton)
    second: Message = finished.args[0]

    assert second.id != first.id and second.parent_id == first.parent_id
    assert [m.id for m in controller.path()][-1] == second.id
    new_card = window.chat.transcript.card(second.id)
    assert new_card.branch_label.text() == "2/2" and new_card.branch_label.isVisible()
    qtbot.mouseClick(new_card.prev_button, Qt.MouseButton.LeftButton)
    assert [m.id for m in controller.path()][-1] == first.id


def test_edit_and_resend_creates_a_branch_and_switching_back_works(
        qtbot, fake_window: MainWindow) -> None:
    window, controller = fake_window, fake_window.controller
    send(qtbot, window, "first question")
    user = controller.path()[0]
    qtbot.mouseClick(window.chat.transcript.card(user.id).edit_button, Qt.MouseButton.LeftButton)
    assert window.chat.composer.text == "first question"
    assert window.chat.composer.edit_banner.isVisible()
    reply = send(qtbot, window, "second question")

    path = controller.path()
    assert [m.content for m in path] == ["second question", reply.content]
    assert reply.content == "You said: second question. Fine."
    edited = window.chat.transcript.card(path[0].id)
    assert edited.branch_label.text() == "2/2"
    qtbot.mouseClick(edited.prev_button, Qt.MouseButton.LeftButton)
    path = controller.path()
    assert [m.content for m in path] == ["first question", "You said: first question. Fine."]
    assert window.chat.transcript.card(path[0].id).branch_label.text() == "1/2"


def test_the_reply_shows_while_it_streams(qtbot, make_window: WindowFactory,
                                         tmp_path: Path) -> None:
    """The engine holds the reply after three tokens (until the gate file exists): the
    transcript already shows them, and the rest joins them when the engine goes on."""
    gate = tmp_path / "gate"
    window = make_window(fake_command(gate_file=gate))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    load(qtbot, window, model)
    controller = window.controller
    controller.new_conversation()
    window.chat.composer.set_text("[[gate]] hello")
    qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    reply_id = controller.path()[-1].id

    def shown() -> str:
        window.chat.transcript.flush()
        card = window.chat.transcript.card(reply_id)
        return card.plain_text() if card is not None else ""

    first_three = "".join(reply_tokens("[[gate]] hello")[:3])
    qtbot.waitUntil(lambda: shown().strip() == first_three.strip(), timeout=ENGINE_TIMEOUT_MS)
    assert controller.tree.get(reply_id).status == "streaming"
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as done:
        gate.touch()
    assert done.args[0].status == "done"
    assert shown().strip() == "".join(reply_tokens("[[gate]] hello")).strip()


def test_conversations_persist_across_a_restart(qtbot, make_window: WindowFactory,
                                               tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    window = make_window(fake_command())
    load(qtbot, window, model)
    controller = window.controller
    controller.new_conversation()
    controller.set_system_prompt("Be brief.")
    reply = send(qtbot, window, "remember me")
    conversation_id = controller.conversation.id
    window.close()

    again = make_window(fake_command())
    model_ = again.chat.list_model
    assert model_.rowCount() == 1
    assert model_.data(model_.index(0)) == "remember me"
    again.controller.open(conversation_id)
    path = again.controller.path()
    assert [m.content for m in path] == ["remember me", reply.content]
    assert again.controller.conversation.system_prompt == "Be brief."
    assert again.chat.settings.system_prompt.toPlainText() == "Be brief."
    assert reply_card_text(again, path[1]).strip() == reply.content
    assert "tokens" in again.chat.transcript.card(path[1].id).footer.text()


def test_a_streaming_reply_is_saved_while_it_grows(qtbot, fake_window: MainWindow) -> None:
    window, controller = fake_window, fake_window.controller
    window.chat.composer.set_text("[[slow]] " + "word " * 60)
    qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    reply_id = controller.generating_id

    def saved_text() -> str:
        return next(m.content for m in controller.store.messages(controller.conversation.id)
                    if m.id == reply_id)

    qtbot.waitUntil(lambda: len(saved_text()) > 0, timeout=5_000)
    assert controller.busy, "saved before the reply ended"
    with qtbot.waitSignal(controller.reply_finished, timeout=10_000):
        controller.stop()


def test_export_writes_valid_markdown_and_json(qtbot, fake_window: MainWindow,
                                               tmp_path: Path) -> None:
    window = fake_window
    window.controller.new_conversation()
    window.controller.set_system_prompt("Answer in Markdown.")
    reply = send(qtbot, window, "[[md]] show me")
    window.chat.export_to(tmp_path / "chat.md")
    window.chat.export_to(tmp_path / "chat.json")

    markdown = (tmp_path / "chat.md").read_text()
    assert markdown.startswith("# [[md]] show me\n")
    assert "> **System:** Answer in Markdown." in markdown
    assert "## You\n\n[[md]] show me" in markdown
    assert "```python\ndef greet(name):" in markdown
    data = json.loads((tmp_path / "chat.json").read_text())
    assert data["format"] == "outrider-chat" and data["system_prompt"] == "Answer in Markdown."
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["content"] == reply.content
    assert data["current_path"] == [m["id"] for m in data["messages"]]


def test_markdown_reply_renders_code_with_a_copy_link(qtbot, fake_window: MainWindow) -> None:
    reply = send(qtbot, fake_window, "[[md]] code please")
    card = fake_window.chat.transcript.card(reply.id)
    html = card.html()
    assert "copy:0" in html
    assert card.code_block(0) == 'def greet(name):\n    return f"hi {name}"\n'
    card._on_link("copy:0")
    assert QtCore.QCoreApplication.instance().clipboard().text() == card.code_block(0)


def test_draft_tokens_can_be_highlighted(qtbot, fake_window: MainWindow) -> None:
    reply = send(qtbot, fake_window, "one two three four five")
    assert reply.draft_spans, "the fake server marks two of every three tokens as drafted"
    card = fake_window.chat.transcript.card(reply.id)
    assert "d6f5df" not in card.html().lower()
    fake_window.chat.drafts_button.click()
    assert "#d6f5df" in card.html().lower()
    assert card.plain_text().strip() == reply.content


def test_error_event_mid_stream_is_shown_beside_the_text(qtbot, fake_window: MainWindow) -> None:
    reply = send(qtbot, fake_window, "[[error]] a b c d e f")
    assert reply.status == "error"
    assert reply.error == "The fake engine failed on purpose."
    assert reply.content == "You said: a "
    card = fake_window.chat.transcript.card(reply.id)
    assert card.error_label.isVisible()
    assert "failed on purpose" not in card.plain_text()
