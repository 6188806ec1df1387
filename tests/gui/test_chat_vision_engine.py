"""The chat window on the real engine with a vision model (the tiny model and its tiny Gemma 3
projector, 64 tokens per image): an image attached in the composer is answered about, and a
second question about it reuses the image's cells; a text-only model refuses the image in
the composer, naming what to load instead, and nothing is lost."""

from __future__ import annotations

from pathlib import Path

from app.engine.client import EngineState
from app.qt import Qt
from app.window import MainWindow
from runtime.settings.load import LoadSettings
from tests.gui.conftest import ENGINE_TIMEOUT_MS, WindowFactory, load
from tests.media.corpus import png

IMAGE_TOKENS = 64


def send(qtbot, window: MainWindow, text: str):  # type: ignore[no-untyped-def]
    window.chat.composer.set_text(text)
    with qtbot.waitSignal(window.controller.reply_finished, timeout=60_000) as finished:
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    return finished.args[0]


def test_the_chat_answers_about_an_image_and_reuses_its_cells(
        qtbot, make_window: WindowFactory, tiny_target: Path, tiny_mmproj: Path,
        tmp_path: Path) -> None:
    window = make_window(None)  # the real engine process
    window.load_model(LoadSettings(model_path=tiny_target, n_ctx=2048, mmproj_path=tiny_mmproj))
    qtbot.waitUntil(lambda: window.client.state == EngineState.READY, timeout=ENGINE_TIMEOUT_MS)
    assert "vision" in window.client.model.capabilities
    image = tmp_path / "orange.png"
    image.write_bytes(png(64, 64, "orange"))
    window.chat.composer.add_files([image])
    first = send(qtbot, window, "What is in the picture?")
    assert first.status == "done", first.error
    assert first.stats["prompt_tokens"] > IMAGE_TOKENS
    again = send(qtbot, window, "And what colour is it?")  # the same chat: the image again
    assert again.status == "done", again.error
    assert again.stats["cached_tokens"] >= IMAGE_TOKENS


def test_a_text_only_model_refuses_an_image_in_the_composer(
        qtbot, make_window: WindowFactory, tiny_target: Path, tmp_path: Path) -> None:
    window = make_window(None)
    load(qtbot, window, tiny_target)
    image = tmp_path / "cat.png"
    image.write_bytes(png())
    composer = window.chat.composer
    composer.set_text("What is this?")
    composer.add_files([image])
    qtbot.keyClick(composer.input, Qt.Key.Key_Return)
    assert composer.problem_label.isVisible() and "vision model" in composer.problem_label.text()
    assert composer.text == "What is this?" and len(composer.attachments) == 1  # nothing lost
    assert window.controller.path() == []  # nothing sent
