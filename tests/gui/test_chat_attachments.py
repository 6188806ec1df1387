"""Attachments in the chat window, over the fake engine (tests/gui/fake_media_server.py): attach
by the button, by dropping files and by pasting an image; thumbnails before sending and in the
transcript; bad files refused in one line with the text kept; images refused by a text-only
model; a document that fits goes in whole, a long one is sent as the passages its embeddings
pick, and the reply says which. A document is read off the GUI thread ("reading…" until it
is) and counted by the served model's tokenizer (`/tokenize`; "≈" while estimated, and when
the count cannot be had); a vision model's images take their tokens from the budget that
decides whether a document goes in whole."""

from __future__ import annotations

import base64
import doctest
import importlib
import json
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

import app.chat.attachments
from app.chat.attachments import Attachment, PendingImage, ReadingDocument
from app.chat.composer import Composer
from app.chat.store import MIGRATIONS, ChatStore
from app.engine.process import EngineCommand
from app.qt import Qt, QtCore, QtGui, QtWidgets
from app.services.background import BackgroundRunner
from app.window import MainWindow
from tests.gui.conftest import ROOT, WindowFactory, load
from tests.gui.fake_media_server import IMAGE_TOKENS
from tests.media import corpus

TEXT_ONLY_NOTICE = ("fake-model cannot read images: load a vision model (one with a "
                    "projector, e.g. Gemma 3 or Qwen2.5-VL)")


@pytest.mark.parametrize("name", ["app.chat.attachments", "app.chat.media_files",
                                  "app.chat.message_content", "tests.gui.fake_media_server"])
def test_docstring_examples(name: str) -> None:
    assert doctest.testmod(importlib.import_module(name)).failed == 0


def media_command(record: Path, gate_file: Path | None = None) -> EngineCommand:
    gate = ("--gate-file", str(gate_file)) if gate_file else ()
    return EngineCommand(sys.executable, ("-m", "tests.gui.fake_media_server",
                                          "--record-file", str(record), *gate),
                         {"PYTHONPATH": str(ROOT)})


@pytest.fixture
def record(tmp_path: Path) -> Path:
    return tmp_path / "requests.jsonl"


def open_window(make_window: WindowFactory, qtbot, tmp_path: Path, record: Path,
                model_name: str, gate_file: Path | None = None) -> MainWindow:
    window = make_window(media_command(record, gate_file))
    model = tmp_path / model_name
    model.write_bytes(b"GGUF")
    load(qtbot, window, model)
    window.resize(1024, 700)
    return window


@pytest.fixture
def vision_window(make_window: WindowFactory, qtbot, tmp_path: Path, record: Path) -> MainWindow:
    return open_window(make_window, qtbot, tmp_path, record, "vision-model.gguf")


@pytest.fixture
def text_window(make_window: WindowFactory, qtbot, tmp_path: Path, record: Path) -> MainWindow:
    return open_window(make_window, qtbot, tmp_path, record, "fake-model.gguf")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return corpus.write_corpus(tmp_path / "corpus")


def attach(qtbot, composer: Composer, paths: list[Path]) -> None:
    """Attach files and wait until each document is read and its count is settled (the
    tokenizer's, or the estimate when it cannot be had)."""
    composer.add_files(paths)
    qtbot.waitUntil(lambda: not composer.pending.reading and not composer.pending.counting,
                    timeout=10_000)


def chips(composer: Composer) -> list[str]:
    return [item.label.text() for item in composer.strip.items if item.thumb is None]


def requests(record: Path) -> list[dict]:
    if not record.is_file():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def send(qtbot, window: MainWindow, text: str):
    window.chat.composer.set_text(text)
    with qtbot.waitSignal(window.controller.reply_finished, timeout=20_000) as finished:
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    return finished.args[0]


def drop(widget: QtWidgets.QWidget, mime: QtCore.QMimeData) -> None:
    """What a drag from the file manager ends in: enter, then drop, on `widget`."""
    point = widget.rect().center()
    actions = Qt.DropAction.CopyAction
    enter = QtGui.QDragEnterEvent(point, actions, mime, Qt.MouseButton.LeftButton,
                                  Qt.KeyboardModifier.NoModifier)
    QtWidgets.QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    dropped = QtGui.QDropEvent(QtCore.QPointF(point), actions, mime, Qt.MouseButton.LeftButton,
                               Qt.KeyboardModifier.NoModifier)
    QtWidgets.QApplication.sendEvent(widget, dropped)


def open_dialogs() -> list[QtWidgets.QDialog]:
    return [w for w in QtWidgets.QApplication.topLevelWidgets()
            if isinstance(w, QtWidgets.QDialog) and w.isVisible()]


def test_attach_by_button_shows_a_thumbnail_and_sends_an_image_url_part(
        qtbot, vision_window: MainWindow, files, record: Path, monkeypatch) -> None:
    window, composer = vision_window, vision_window.chat.composer
    monkeypatch.setattr(QtWidgets.QFileDialog, "getOpenFileNames",
                        staticmethod(lambda *a, **k: ([str(files["good.png"])], "")))
    qtbot.mouseClick(composer.attach_button, Qt.MouseButton.LeftButton)
    assert [t.name for t in composer.strip.thumbnails()] == ["good.png"]
    assert composer.strip.isVisible() and not composer.problem_label.isVisible()

    reply = send(qtbot, window, "What is in this picture?")
    assert reply.status == "done", reply.error
    assert composer.attachments == [] and not composer.strip.isVisible()

    user = requests(record)[-1]["messages"][-1]
    assert user["role"] == "user"
    text_part, image_part = user["content"]
    assert text_part == {"type": "text", "text": "What is in this picture?"}
    url = image_part["image_url"]["url"]
    assert image_part["type"] == "image_url" and url.startswith("data:image/png;base64,")
    sent = base64.b64decode(url.split(",", 1)[1])
    assert sent == files["good.png"].read_bytes()

    question = window.controller.tree.get(reply.parent_id)
    [attachment] = question.attachments
    stored = window.controller.store.media.path(attachment.sha256, attachment.mime)
    assert stored.read_bytes() == sent and stored.stem == attachment.sha256  # content-addressed
    assert stored.parent.parent == window.controller.store.path.parent  # beside the store

    card = window.chat.transcript.card(question.id)
    [thumb] = card.attachment_strip.thumbnails()
    assert not thumb.pixmap().isNull() and thumb.isVisible()
    qtbot.mouseClick(thumb, Qt.MouseButton.LeftButton)
    [viewer] = open_dialogs()
    assert viewer.windowTitle() == "good.png"
    viewer.close()


def test_files_dropped_on_the_composer_are_attached(
        qtbot, vision_window: MainWindow, files, tmp_path: Path) -> None:
    composer = vision_window.chat.composer
    notes = tmp_path / "notes.md"
    notes.write_text("# Shopping\n\nMilk, bread and eggs.\n")
    mime = QtCore.QMimeData()
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(files["good.png"])),
                  QtCore.QUrl.fromLocalFile(str(notes))])
    drop(composer, mime)
    assert [a.name for a in composer.attachments] == ["good.png", "notes.md"]
    assert len(composer.strip.thumbnails()) == 1
    assert chips(composer) == ["notes.md · reading…"]  # read off the GUI thread
    # Read, then counted by the served model's tokenizer (the fake's: one token a word;
    # the estimate was ≈9).
    qtbot.waitUntil(lambda: chips(composer) == ["notes.md · 6 tokens · goes in whole"])

    other = QtCore.QMimeData()  # dropped on the transcript: the chat page takes it too
    other.setUrls([QtCore.QUrl.fromLocalFile(str(files["cmyk.jpg"]))])
    drop(vision_window.chat, other)
    assert [a.name for a in composer.attachments][-1] == "cmyk.jpg"
    assert composer.attachments[-1].mime == "image/jpeg"  # CMYK accepted, normalised to RGB


def test_an_image_pasted_from_the_clipboard_is_attached(
        qtbot, vision_window: MainWindow) -> None:
    composer = vision_window.chat.composer
    image = QtGui.QImage(120, 80, QtGui.QImage.Format.Format_RGB32)
    image.fill(QtGui.QColor("purple"))
    QtGui.QGuiApplication.clipboard().setImage(image)
    composer.input.setFocus()
    composer.set_text("look:")
    qtbot.keyClick(composer.input, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert composer.text == "look:"  # the image went to the attachments, not into the text
    [pasted] = composer.attachments
    assert (pasted.name, pasted.width, pasted.height) == ("pasted image 1.png", 120, 80)
    assert len(composer.strip.thumbnails()) == 1


@pytest.mark.parametrize(("name", "words"), [
    ("truncated.png", "truncated.png: the image is damaged or cut short"),
    ("huge.png", "huge.png: the image has more than"),
    ("notes.jpg", "notes.jpg: not an image Outrider can read"),
    ("animated.gif", "animated.gif: animated images are not supported; attach a still frame"),
    ("encrypted.pdf", "encrypted.pdf is password-protected"),
    ("truncated.pdf", "truncated.pdf is damaged or cut short"),
    ("scan.pdf", "scan.pdf has no text layer"),
])
def test_a_bad_file_is_one_line_under_the_box_and_nothing_is_lost(
        qtbot, vision_window: MainWindow, files, record: Path, name: str, words: str) -> None:
    window, composer = vision_window, vision_window.chat.composer
    composer.set_text("Please summarise the attachment")
    composer.add_files([files[name]])
    qtbot.waitUntil(composer.problem_label.isVisible)  # a PDF once the runner has read it
    assert words in composer.problem_label.text() and "\n" not in composer.problem_label.text()
    assert composer.attachments == [] and not composer.strip.isVisible()
    assert composer.text == "Please summarise the attachment"
    assert window.controller.path() == [] and requests(record) == []


def test_a_text_only_model_refuses_images_and_says_what_to_load(
        qtbot, text_window: MainWindow, files, record: Path) -> None:
    window, composer = text_window, text_window.chat.composer
    composer.add_files([files["good.png"]])
    assert composer.problem_label.text() == TEXT_ONLY_NOTICE  # said at once
    composer.set_text("What is this?")
    qtbot.keyClick(composer.input, Qt.Key.Key_Return)

    assert composer.problem_label.isVisible() and composer.problem_label.text() == TEXT_ONLY_NOTICE
    assert composer.text == "What is this?" and len(composer.attachments) == 1  # nothing lost
    assert window.controller.path() == [] and requests(record) == []  # nothing sent

    composer.remove_attachment(0)  # without the image the question goes
    reply = send(qtbot, window, "What is this?")
    assert reply.status == "done" and not composer.problem_label.isVisible()
    assert requests(record)[-1]["messages"][-1]["content"] == "What is this?"


def test_a_document_that_fits_goes_in_whole_with_its_name(
        qtbot, text_window: MainWindow, tmp_path: Path, record: Path) -> None:
    window, composer = text_window, text_window.chat.composer
    path = tmp_path / "recipe.md"
    path.write_text("# Pancakes\n\nFlour, milk, two eggs. Whisk and fry.\n")
    attach(qtbot, composer, [path])
    assert chips(composer) == ["recipe.md · 9 tokens · goes in whole"]  # counted, not ≈13

    reply = send(qtbot, window, "How many eggs?")
    assert reply.status == "done", reply.error
    content = requests(record)[-1]["messages"][-1]["content"]
    assert content == ("--- recipe.md ---\n# Pancakes\n\nFlour, milk, two eggs. Whisk and fry."
                       "\n--- end of recipe.md ---\n\nHow many eggs?")
    card = window.chat.transcript.card(reply.id)
    assert not card.passages.isVisible()  # nothing was retrieved
    question = window.chat.transcript.card(reply.parent_id)
    assert question.attachment_strip.items[0].label.text() == "recipe.md · 9 tokens"


def long_pdf() -> bytes:
    filler = ("The annual report covers budgets, hiring, offices and travel in detail. " * 16)
    pages = [filler] * 12
    pages[6] = ("Zebras eat grass, leaves and bark; zebras graze for most of the day. "
                + filler)
    return corpus.text_pdf(pages)


def test_a_long_document_is_sent_as_the_passages_that_answer_and_the_reply_says_which(
        qtbot, text_window: MainWindow, tmp_path: Path, record: Path) -> None:
    window, composer = text_window, text_window.chat.composer
    path = tmp_path / "animals.pdf"
    path.write_bytes(long_pdf())
    attach(qtbot, composer, [path])
    [chip] = chips(composer)
    assert chip.startswith("animals.pdf · 12 pages · ") and "≈" not in chip
    assert "too long for the context: the most relevant passages go in" in chip

    reply = send(qtbot, window, "What do zebras eat?")
    assert reply.status == "done", reply.error
    content = requests(record)[-1]["messages"][-1]["content"]
    assert content.startswith("--- animals.pdf (the passages most relevant to the question) ---")
    assert "[p.7]\nZebras eat grass" in content and content.endswith("What do zebras eat?")
    assert len(content) / 4 <= 2048 - 512  # the passages fit beside the reply's max_tokens
    assert len(content) < len("".join(window.controller.store.document(
        window.controller.tree.get(reply.parent_id).attachments[0].sha256).text))

    window.chat.transcript.flush()
    line = window.chat.transcript.card(reply.id).passages
    assert line.isVisible() and line.button.text().startswith("Used passages: animals.pdf p.")
    assert "p.7" in line.button.text()
    assert not line.text.isVisible()
    qtbot.mouseClick(line.button, Qt.MouseButton.LeftButton)
    assert line.text.isVisible() and "animals.pdf p.7: Zebras eat grass" in line.text.text()

    [attachment] = window.controller.tree.get(reply.parent_id).attachments
    saved = window.controller.store.messages(reply.conversation_id)[0].attachments[0]
    assert saved.passages == attachment.passages and saved.mode == "passages"
    index = window.controller.store.passage_vectors(attachment.sha256, "fake-model", 300)
    assert len(index) >= 2  # the chunks' vectors are kept in the chat store


def test_when_passages_cannot_be_picked_the_reply_says_why_in_one_line(
        qtbot, text_window: MainWindow, tmp_path: Path, record: Path) -> None:
    window = text_window
    path = tmp_path / "animals.pdf"
    path.write_bytes(long_pdf())
    attach(qtbot, window.chat.composer, [path])
    reply = send(qtbot, window, "[[noembed]] What do zebras eat?")
    assert reply.status == "error" and requests(record) == []  # no request without them
    assert reply.error == ("animals.pdf is too long for the context, and picking its passages "
                           "failed: fake-model cannot make embeddings")
    card = window.chat.transcript.card(reply.id)
    assert card.error_label.isVisible() and not card.passages.isVisible()


def test_an_exported_chat_carries_its_images(
        qtbot, vision_window: MainWindow, files, tmp_path: Path) -> None:
    window = vision_window
    window.chat.composer.add_files([files["good.png"]])
    reply = send(qtbot, window, "Describe it")
    [image] = window.controller.tree.get(reply.parent_id).attachments
    out = tmp_path / "export" / "chat.md"
    out.parent.mkdir()
    window.chat.export_to(out)
    copied = out.parent / "chat_files" / f"{image.sha256}.png"
    assert copied.read_bytes() == files["good.png"].read_bytes()
    assert f"![good.png](chat_files/{image.sha256}.png)" in out.read_text()
    window.chat.export_to(out.with_suffix(".json"))
    exported = json.loads(out.with_suffix(".json").read_text())
    assert exported["messages"][0]["attachments"][0]["file"] == f"chat_files/{image.sha256}.png"


def test_the_composer_alone_takes_a_drop_and_sends_what_it_holds(qtbot, files) -> None:
    runner = BackgroundRunner()
    try:
        composer = Composer(runner)
        qtbot.addWidget(composer)
        mime = QtCore.QMimeData()
        mime.setUrls([QtCore.QUrl.fromLocalFile(str(files["good.png"]))])
        drop(composer.input, mime)  # dropped on the text box itself
        assert composer.text == "" and len(composer.attachments) == 1
        with qtbot.waitSignal(composer.submitted) as sent:
            composer.submit()  # no text: an image alone may be sent
        assert sent.args[0] == "" and [p.name for p in sent.args[1]] == ["good.png"]
    finally:
        assert runner.shutdown()


def test_an_older_chats_database_gains_attachments(tmp_path: Path) -> None:
    """A schema-2 database opens, keeps its rows, and reads them as having no attachments."""
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(f"BEGIN; {MIGRATIONS[0]}; {MIGRATIONS[1]}; PRAGMA user_version=2; COMMIT;")
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) "
               "VALUES (1, 'user', 'hi', 1)")
    db.commit()
    db.close()
    store = ChatStore(path)
    try:
        (message,) = store.messages(1)
        assert (message.content, message.attachments) == ("hi", [])
        message.attachments = [Attachment("image", "a.png", "ab" * 32, mime="image/png")]
        store.save_message(message)
        assert store.messages(1)[0].attachments == message.attachments
        store.delete_conversation(1)  # its image file (none on disk here) goes with it
    finally:
        store.close()


# -- reading and counting documents -------------------------------------------------------


def test_a_document_is_read_off_the_gui_thread_and_cannot_be_sent_while_it_is(
        qtbot, text_window: MainWindow, tmp_path: Path, record: Path, monkeypatch) -> None:
    """The chip says "reading…" while pypdf works on the runner; Send waits for it (said in
    one line, nothing lost); the text arrives and is counted."""
    window, composer = text_window, text_window.chat.composer
    threads: list[threading.Thread] = []
    release = threading.Event()
    extract = app.chat.attachments.extract_text

    def slow_extract(*args, **kwargs):
        threads.append(threading.current_thread())
        release.wait(10)  # a large PDF: held until the test has looked
        return extract(*args, **kwargs)

    monkeypatch.setattr(app.chat.attachments, "extract_text", slow_extract)
    path = tmp_path / "animals.pdf"
    path.write_bytes(corpus.text_pdf(["Zebras eat grass.", "Lions eat zebras."]))
    try:
        composer.add_files([path])
        assert isinstance(composer.attachments[0], ReadingDocument)
        assert chips(composer) == ["animals.pdf · reading…"]
        composer.set_text("Who eats what?")
        qtbot.keyClick(composer.input, Qt.Key.Key_Return)
        assert composer.problem_label.text() == ("animals.pdf is still being read: send once "
                                                 "its chip shows its tokens")
        assert composer.text == "Who eats what?" and window.controller.path() == []
    finally:
        release.set()
    qtbot.waitUntil(lambda: not composer.pending.reading and not composer.pending.counting)
    assert threads and threads[0] is not threading.main_thread()
    assert chips(composer) == ["animals.pdf · 2 pages · 6 tokens · goes in whole"]
    assert not composer.problem_label.isVisible()  # the "still being read" line went with it

    with qtbot.waitSignal(window.controller.reply_finished, timeout=20_000) as finished:
        qtbot.keyClick(composer.input, Qt.Key.Key_Return)
    assert finished.args[0].status == "done"
    content = requests(record)[-1]["messages"][-1]["content"]
    assert "Zebras eat grass." in content and content.endswith("Who eats what?")


def test_a_bad_pdf_read_in_the_background_is_still_one_line(
        qtbot, text_window: MainWindow, files) -> None:
    composer = text_window.chat.composer
    composer.add_files([files["encrypted.pdf"]])
    assert chips(composer) == ["encrypted.pdf · reading…"] and not composer.problem_label.isVisible()
    qtbot.waitUntil(composer.problem_label.isVisible)
    assert "encrypted.pdf is password-protected" in composer.problem_label.text()
    assert composer.attachments == [] and not composer.strip.isVisible()
    assert open_dialogs() == []


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "tokenize.gate"


def test_the_chip_shows_the_estimate_until_the_real_count_arrives(
        qtbot, make_window: WindowFactory, tmp_path: Path, record: Path, gate: Path) -> None:
    window = open_window(make_window, qtbot, tmp_path, record, "fake-model.gguf", gate)
    composer = window.chat.composer
    path = tmp_path / "held.md"
    path.write_text("[[gate]] Counting this takes the tokenizer a while.\n")  # 8 words, 52 chars
    composer.add_files([path])
    qtbot.waitUntil(lambda: not composer.pending.reading)
    assert composer.pending.counting  # asked, not yet answered: the estimate shows
    assert chips(composer) == ["held.md · ≈13 tokens · goes in whole"]
    gate.touch()
    with qtbot.waitSignal(composer.pending.counted, timeout=10_000):
        pass
    assert chips(composer) == ["held.md · 8 tokens · goes in whole"]
    [document] = composer.attachments
    assert (document.tokens, document.counted_by) == (8, "fake-model")


def test_the_estimate_stays_when_the_tokenizer_fails(
        qtbot, text_window: MainWindow, tmp_path: Path, record: Path) -> None:
    window, composer = text_window, text_window.chat.composer
    path = tmp_path / "odd.md"
    path.write_text("[[notokenize]] This text breaks the fake tokenizer.\n")  # 52 chars
    attach(qtbot, composer, [path])
    assert chips(composer) == ["odd.md · ≈13 tokens · goes in whole"]
    assert not composer.problem_label.isVisible() and open_dialogs() == []
    composer.refresh_attachments()  # the model's state changes: no second try for this model
    assert not composer.pending.counting

    reply = send(qtbot, window, "Read it")
    assert reply.status == "done", reply.error  # sent whole, on the estimate
    question = window.chat.transcript.card(reply.parent_id)
    assert question.attachment_strip.items[0].label.text() == "odd.md · ≈13 tokens"


def test_with_no_engine_running_the_estimate_stays(
        qtbot, make_window: WindowFactory, tmp_path: Path, record: Path) -> None:
    window = make_window(media_command(record))  # nothing loaded: the engine is not started
    composer = window.chat.composer
    path = tmp_path / "recipe.md"
    path.write_text("# Pancakes\n\nFlour, milk, two eggs. Whisk and fry.\n")
    attach(qtbot, composer, [path])
    [chip] = chips(composer)
    assert chip.startswith("recipe.md · ≈13 tokens")
    assert not window.client.state.running and open_dialogs() == []


def test_a_vision_models_images_take_their_tokens_from_the_document_budget(
        qtbot, vision_window: MainWindow, files, tmp_path: Path, record: Path) -> None:
    window, composer = vision_window, vision_window.chat.composer
    controller = window.controller
    assert window.client.model.image_tokens == IMAGE_TOKENS
    assert window.client.model.projector == "mmproj-vision-model-f16.gguf"
    alone = controller.context_budget()
    # A document that fits alone (by its count: the fake's tokenizer makes a token of each
    # word, where the estimate, 1.5 a word, would not), but not beside one image.
    words = alone - IMAGE_TOKENS // 2
    path = tmp_path / "words.txt"
    path.write_text("grass " * words)
    attach(qtbot, composer, [path])
    assert chips(composer) == [f"words.txt · {words:,} tokens · goes in whole"]

    composer.add_files([files["good.png"]])
    [image] = [a for a in composer.attachments if isinstance(a, PendingImage)]
    assert controller.context_budget("", [image]) == alone - IMAGE_TOKENS
    assert chips(composer) == [f"words.txt · {words:,} tokens · too long for the context: "
                               "the most relevant passages go in"]

    reply = send(qtbot, window, "Which plant is it?")
    assert reply.status == "done", reply.error
    question = controller.tree.get(reply.parent_id)
    document = next(a for a in question.attachments if a.kind == "document")
    assert document.mode == "passages" and document.exact and document.passages


def test_the_whole_or_passages_decision_is_made_on_the_real_count(
        qtbot, text_window: MainWindow, tmp_path: Path, record: Path) -> None:
    window, composer = text_window, text_window.chat.composer
    alone = window.controller.context_budget("Sum it up")
    words = alone - 100  # estimated at 1.5 a word it would not fit; counted, it does
    path = tmp_path / "words.txt"
    path.write_text("grass " * words)
    attach(qtbot, composer, [path])
    assert chips(composer) == [f"words.txt · {words:,} tokens · goes in whole"]
    reply = send(qtbot, window, "Sum it up")
    assert reply.status == "done", reply.error
    [document] = window.controller.tree.get(reply.parent_id).attachments
    assert (document.mode, document.tokens, document.exact) == ("whole", words, True)
    content = requests(record)[-1]["messages"][-1]["content"]
    assert content.startswith("--- words.txt ---\ngrass grass") and content.count("grass") == words
