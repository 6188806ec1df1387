"""A reasoning model's thinking in the chat: folded above the answer as "Thought for 4.2 s",
unfolded by a click, streamed live, kept in the store (and exported), never sent back, and
counted apart in the footer. The fake server's `[[think]]` reply streams its thinking as
`delta.reasoning_content`, one token whose text the server held back (`</think>`), then
the answer."""

from __future__ import annotations

import doctest
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

from app.chat import generation
from app.chat.conversation import Message
from app.chat.store import MIGRATIONS, SCHEMA_VERSION, ChatStore
from app.chat.thinking import ThinkingBlock
from app.qt import Qt
from app.window import MainWindow
from tests.gui.conftest import ENGINE_TIMEOUT_MS, WindowFactory, fake_command, load
from tests.gui.fake_server import THINK_TEXT, pieces_of, reply_tokens

THOUGHT = re.compile(r"^Thought for \d+\.\d s$")
ANSWER = "".join(reply_tokens("[[think]] hello"))
THINKING_TOKENS = len(pieces_of(THINK_TEXT)) + 1  # and the held-back </think>
ANSWER_TOKENS = len(reply_tokens("[[think]] hello"))


def send(qtbot, window: MainWindow, text: str) -> Message:
    window.chat.composer.set_text(text)
    with qtbot.waitSignal(window.controller.reply_finished, timeout=ENGINE_TIMEOUT_MS) as done:
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    return done.args[0]


def record_requests(window: MainWindow) -> list[dict[str, Any]]:
    """The bodies of the chat requests the window sends from now on."""
    bodies: list[dict[str, Any]] = []
    client = window.client
    original = client.chat

    def chat(body: dict[str, Any]) -> Any:
        bodies.append(json.loads(json.dumps(body)))
        return original(body)

    client.chat = chat  # type: ignore[method-assign]
    return bodies


def thinking_of(window: MainWindow, message: Message) -> ThinkingBlock:
    window.chat.transcript.flush()
    card = window.chat.transcript.card(message.id)
    assert card is not None and card.thinking is not None
    return card.thinking


def test_docstring_examples() -> None:
    """The token counting rule (app.chat.generation); wire and export run in test_app_parts."""
    result = doctest.testmod(generation)
    assert result.attempted and not result.failed


def test_thinking_is_folded_above_the_answer_and_unfolds_on_click(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.controller.new_conversation()
    reply = send(qtbot, window, "[[think]] hello")

    assert reply.status == "done"
    assert reply.reasoning == THINK_TEXT
    assert reply.content == ANSWER  # the thinking never lands in the answer
    block = thinking_of(window, reply)
    card = window.chat.transcript.card(reply.id)
    assert block.isVisible() and THOUGHT.match(block.toggle.text()), block.toggle.text()
    assert not block.body.isVisible()
    assert block.geometry().bottom() < card._segments[0].body.geometry().top()  # above it
    assert THINK_TEXT not in card.plain_text()

    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    assert block.body.isVisible()
    assert block.body.toPlainText() == THINK_TEXT
    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    assert not block.body.isVisible()

    assert card.footer.text().startswith(
        f"{THINKING_TOKENS} thinking + {ANSWER_TOKENS} answer tokens · ")
    assert reply.stats["thinking_tokens"] + reply.stats["answer_tokens"] == reply.stats["tokens"]


def test_a_reply_without_thinking_has_no_block_and_one_count(
        qtbot, fake_window: MainWindow) -> None:
    reply = send(qtbot, fake_window, "hello")
    fake_window.chat.transcript.flush()
    card = fake_window.chat.transcript.card(reply.id)
    assert card.thinking is None
    assert card.footer.text().startswith(f"{len(reply_tokens('hello'))} tokens · ")


def test_thinking_streams_live_titled_thinking(qtbot, make_window: WindowFactory,
                                               tmp_path: Path) -> None:
    """The engine holds the reply after three thinking tokens (until the gate file exists):
    the block says "Thinking…" and, unfolded, shows those three; the rest follows."""
    gate = tmp_path / "gate"
    window = make_window(fake_command(gate_file=gate))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    load(qtbot, window, model)
    controller = window.controller
    controller.new_conversation()
    window.chat.composer.set_text("[[think]] [[gate]] hello")
    qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    reply_id = controller.path()[-1].id
    first_three = "".join(pieces_of(THINK_TEXT)[:3])

    def block() -> ThinkingBlock | None:
        window.chat.transcript.flush()
        card = window.chat.transcript.card(reply_id)
        return card.thinking if card is not None else None

    qtbot.waitUntil(lambda: controller.tree.get(reply_id).reasoning == first_three,
                    timeout=ENGINE_TIMEOUT_MS)
    live = block()
    assert live is not None and live.toggle.text() == ThinkingBlock.THINKING
    qtbot.mouseClick(live.toggle, Qt.MouseButton.LeftButton)
    assert live.body.toPlainText() == first_three

    def saved() -> str:
        return next(m.reasoning for m in controller.store.messages(controller.conversation.id)
                    if m.id == reply_id)

    qtbot.waitUntil(lambda: saved() == first_three, timeout=5_000)  # saved as it streams
    assert controller.busy

    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        gate.touch()
    done = block()
    assert done is live and THOUGHT.match(done.toggle.text())
    assert done.body.toPlainText() == THINK_TEXT  # still unfolded, the rest appended


def test_thinking_is_kept_after_reload_and_never_sent_back(
        qtbot, make_window: WindowFactory, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    window = make_window(fake_command())
    load(qtbot, window, model)
    bodies = record_requests(window)
    controller = window.controller
    controller.new_conversation()
    first = send(qtbot, window, "[[think]] hello")
    send(qtbot, window, "and again")

    history = bodies[1]["messages"]
    assert history[:2] == [{"role": "user", "content": "[[think]] hello"},
                           {"role": "assistant", "content": ANSWER}]
    assert THINK_TEXT not in json.dumps(bodies[1])
    conversation_id = controller.conversation.id
    footer = window.chat.transcript.card(first.id).footer.text()
    window.close()

    again = make_window(fake_command())
    again.controller.open(conversation_id)
    reloaded = again.controller.path()[1]
    assert reloaded.reasoning == THINK_TEXT and reloaded.content == ANSWER
    block = thinking_of(again, reloaded)
    assert THOUGHT.match(block.toggle.text())
    assert again.chat.transcript.card(reloaded.id).footer.text() == footer
    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    assert block.body.toPlainText() == THINK_TEXT


def test_export_keeps_the_thinking(qtbot, fake_window: MainWindow, tmp_path: Path) -> None:
    window = fake_window
    window.controller.new_conversation()
    reply = send(qtbot, window, "[[think]] hello")
    window.chat.export_to(tmp_path / "chat.md")
    window.chat.export_to(tmp_path / "chat.json")

    markdown = (tmp_path / "chat.md").read_text()
    title = thinking_of(window, reply).toggle.text()
    assert f"## Assistant\n\n<details>\n<summary>{title}</summary>\n\n{THINK_TEXT}\n\n" \
           f"</details>\n\n{ANSWER}" in markdown
    data = json.loads((tmp_path / "chat.json").read_text())
    assert data["messages"][1]["reasoning"] == THINK_TEXT
    assert data["messages"][1]["content"] == ANSWER
    assert data["messages"][0]["reasoning"] == ""


def test_an_older_chats_database_gains_the_new_columns(tmp_path: Path) -> None:
    """A schema-1 database (before thinking and structured output) opens, keeps its rows,
    and reads them as no thinking and no schema."""
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(f"BEGIN; {MIGRATIONS[0]}; PRAGMA user_version=1; COMMIT;")
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) "
               "VALUES (1, 'user', 'hi', 1)")
    db.commit()
    db.close()

    store = ChatStore(path)
    try:
        assert store.conversation(1).response_schema == ""
        (message,) = store.messages(1)
        assert (message.content, message.reasoning) == ("hi", "")
        message.reasoning = "pondering"
        store.save_message(message)
        assert store.messages(1)[0].reasoning == "pondering"
    finally:
        store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    check.close()
