"""Chat settings → "Structured output": a JSON schema typed by hand, checked as it is typed,
sent as `response_format` json_schema (strict) when valid, blocking Send (and saying why)
when not, kept with the chat; a reply that is JSON shows as a JSON code block."""

from __future__ import annotations

import doctest
import json
from typing import Any

from app.chat import schema
from app.chat.settings_panel import SCHEMA_OFF, SCHEMA_ON
from app.qt import Qt
from app.window import MainWindow
from tests.gui.conftest import ENGINE_TIMEOUT_MS
from tests.gui.fake_server import JSON_REPLY

PERSON = {"title": "Person", "type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name"]}


def record_requests(window: MainWindow) -> list[dict[str, Any]]:
    """The bodies of the chat requests the window sends from now on."""
    bodies: list[dict[str, Any]] = []
    original = window.client.chat

    def chat(body: dict[str, Any]) -> Any:
        bodies.append(json.loads(json.dumps(body)))
        return original(body)

    window.client.chat = chat  # type: ignore[method-assign]
    return bodies


def type_schema(qtbot, window: MainWindow, text: str) -> None:
    """Open the settings drawer and type `text` into the field, key by key."""
    window.chat.settings_button.setChecked(True)
    field = window.chat.settings.response_schema
    field.clear()
    field.setFocus()
    qtbot.keyClicks(field, text)


def press_enter(qtbot, window: MainWindow, text: str) -> None:
    window.chat.composer.set_text(text)
    qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)


def test_docstring_examples() -> None:
    result = doctest.testmod(schema)
    assert result.attempted and not result.failed


def test_invalid_json_says_why_in_red_and_nothing_is_sent(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    bodies = record_requests(window)
    window.controller.new_conversation()
    status = window.chat.settings.schema_status
    assert status.text() == SCHEMA_OFF and status.objectName() == "muted"

    type_schema(qtbot, window, '{"type": object}')
    assert status.isVisible()
    assert status.text() == "Not valid JSON (line 1, column 10): Expecting value"
    assert status.objectName() == "errorText"  # the theme's red
    composer = window.chat.composer
    assert not composer.send_button.isEnabled()
    assert "Not valid JSON" in composer.send_button.toolTip()

    press_enter(qtbot, window, "who is she?")  # a request would be made on Enter, at once
    assert bodies == [] and not window.controller.busy
    assert window.controller.path() == []  # no message was added either
    assert composer.text == "who is she?"  # what was typed stays
    assert window.chat.settings.response_schema.hasFocus()  # the user is taken to the field
    # Another Send path (Regenerate, the controller's own) refuses the same way.
    assert window.controller.send("who is she?") is None


def test_a_schema_that_is_not_json_schema_is_refused(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.controller.new_conversation()
    type_schema(qtbot, window, '{"type": "strin"}')
    status = window.chat.settings.schema_status
    assert status.text().startswith("Not a valid JSON Schema at $.type: ")
    assert status.objectName() == "errorText"
    assert not window.chat.composer.send_button.isEnabled()


def test_a_valid_schema_is_sent_strict_and_kept_with_the_chat(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    bodies = record_requests(window)
    controller = window.controller
    controller.new_conversation()
    text = json.dumps(PERSON)
    type_schema(qtbot, window, text)
    status = window.chat.settings.schema_status
    assert status.text() == SCHEMA_ON and status.objectName() == "muted"
    assert window.chat.composer.send_button.isEnabled()

    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        press_enter(qtbot, window, "[[json]] a person")
    assert bodies[-1]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Person", "schema": PERSON, "strict": True}}

    # Kept with the chat: in the store, and back in the field when the chat is opened again.
    conversation_id = controller.conversation.id
    assert controller.store.conversation(conversation_id).response_schema == text
    controller.new_conversation()  # a new chat starts without one
    assert window.chat.settings.response_schema.toPlainText() == ""
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        press_enter(qtbot, window, "free text")
    assert "response_format" not in bodies[-1]
    controller.open(conversation_id)
    assert window.chat.settings.response_schema.toPlainText() == text

    # Emptied: off again.
    type_schema(qtbot, window, "")
    assert status.text() == SCHEMA_OFF
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        press_enter(qtbot, window, "now free")
    assert "response_format" not in bodies[-1]


def test_an_invalid_schema_in_another_chat_blocks_only_that_chat(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    controller = window.controller
    controller.new_conversation()
    type_schema(qtbot, window, "[1]")
    assert window.chat.settings.schema_status.text().startswith("A JSON schema is an object")
    broken = controller.conversation.id
    controller.new_conversation()
    assert window.chat.composer.send_button.isEnabled()
    controller.open(broken)
    assert not window.chat.composer.send_button.isEnabled()
    assert window.chat.settings.schema_status.objectName() == "errorText"


def test_a_json_reply_renders_as_a_json_code_block(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    controller = window.controller
    controller.new_conversation()
    window.chat.composer.set_text("[[json]] a person")
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as done:
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    reply = done.args[0]
    assert reply.content == JSON_REPLY  # stored as the model wrote it
    window.chat.transcript.flush()
    card = window.chat.transcript.card(reply.id)
    pretty = json.dumps(json.loads(JSON_REPLY), indent=2)
    assert card.code_blocks() == [pretty + "\n"]
    html = card.html()
    assert "copy:0" in html and ">json<" in html  # the code block's header names the language
    assert card.plain_text().strip().endswith(pretty.splitlines()[-1])


def test_a_plain_reply_is_not_a_code_block(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.chat.composer.set_text("hello")
    with qtbot.waitSignal(window.controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as done:
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    window.chat.transcript.flush()
    assert window.chat.transcript.card(done.args[0].id).code_blocks() == []


def test_a_schema_typed_with_no_chat_open_starts_one_under_it(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    bodies = record_requests(window)
    controller = window.controller
    controller.close_conversation()
    text = json.dumps(PERSON)
    type_schema(qtbot, window, text)
    assert window.chat.settings.response_schema.toPlainText() == text  # nothing lost on the way
    assert controller.conversation is not None
    assert controller.conversation.response_schema == text
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        press_enter(qtbot, window, "[[json]] a person")
    assert bodies[-1]["response_format"]["json_schema"]["schema"] == PERSON


def test_regenerate_under_an_invalid_schema_says_why_and_sends_nothing(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    controller = window.controller
    controller.new_conversation()
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as done:
        press_enter(qtbot, window, "hello")
    bodies = record_requests(window)
    type_schema(qtbot, window, '{"type": "strin"}')
    window.chat.settings_button.setChecked(False)
    window.chat.transcript.flush()
    card = window.chat.transcript.card(done.args[0].id)
    with qtbot.waitSignal(window.chat.message) as said:
        qtbot.mouseClick(card.regenerate_button, Qt.MouseButton.LeftButton)
    assert said.args[0].startswith("Structured output: Not a valid JSON Schema")
    assert bodies == [] and not controller.busy
    assert window.chat.settings_button.isChecked()  # the drawer opens on the field
