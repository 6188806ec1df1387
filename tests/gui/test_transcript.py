"""The transcript view on its own: which messages get cards, and when "Show earlier messages"
is offered (only when older messages of the path really are left out)."""

from __future__ import annotations

from app.chat.conversation import Message, MessageTree
from app.chat.transcript import PAGE, TranscriptView
from app.theme import LIGHT
from app.window import MainWindow
from tests.gui.conftest import WindowFactory, fake_command


def chain(n: int) -> list[Message]:
    """A conversation of n messages, user and assistant in turn, each the child of the last."""
    return [Message(i, 1, i - 1 if i > 1 else None, "user" if i % 2 else "assistant",
                    f"message {i}", float(i)) for i in range(1, n + 1)]


def make_view(qtbot) -> TranscriptView:
    view = TranscriptView(LIGHT)
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    return view


def show(view: TranscriptView, messages: list[Message]) -> None:
    view.set_path(messages, MessageTree(messages), busy=False)


def test_no_earlier_messages_button_before_any_path(qtbot) -> None:
    view = make_view(qtbot)
    assert not view.more_button.isVisible()


def test_no_earlier_messages_button_for_an_empty_or_short_chat(qtbot) -> None:
    view = make_view(qtbot)
    show(view, [])
    assert not view.more_button.isVisible()
    show(view, chain(3))
    assert not view.more_button.isVisible()
    assert len(view.cards()) == 3
    show(view, chain(PAGE))  # exactly one page: everything has a card
    assert not view.more_button.isVisible()
    assert len(view.cards()) == PAGE


def test_earlier_messages_button_for_a_long_chat_until_all_are_shown(qtbot) -> None:
    view = make_view(qtbot)
    messages = chain(PAGE + 5)
    show(view, messages)
    assert view.more_button.isVisible()
    assert [c.message.id for c in view.cards()] == [m.id for m in messages[5:]]
    view.more_button.click()
    assert [c.message.id for c in view.cards()] == [m.id for m in messages]
    assert not view.more_button.isVisible()
    show(view, [])  # a new chat after a long one
    assert not view.more_button.isVisible()


def test_a_new_window_shows_no_earlier_messages_button(make_window: WindowFactory) -> None:
    window: MainWindow = make_window(fake_command())
    assert not window.chat.transcript.more_button.isVisible()
    window.chat.new_chat()
    assert not window.chat.transcript.more_button.isVisible()
