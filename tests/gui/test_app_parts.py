"""The app's parts one by one: wire parsing, the chat store, the message tree, Markdown,
export, the crash reporter, the throttle, the background runner, and their doctests."""

from __future__ import annotations

import doctest
import importlib
import json
import os
import sqlite3
from pathlib import Path

import pytest

from app.chat.conversation import Message, MessageTree
from app.chat.markdown import DRAFT_END, DRAFT_START, MarkdownRenderer, mark_drafts
from app.chat.store import SCHEMA_VERSION, ChatStore, ChatStoreError
from app.crash import CrashReporter
from app.engine.wire import (
    ReplyFinished,
    SseEvent,
    SseParser,
    TextDelta,
    WireError,
    parse_chat_chunk,
    parse_error_body,
    parse_metrics,
    parse_ready_line,
)
from app.theme import DARK, LIGHT
from app.widgets import cell, page_column, read_only_table
from runtime.events import SamplingParams, StepStats

PURE_MODULES = ["app.engine.wire", "app.chat.conversation", "app.chat.markdown", "app.chat.export",
                "app.engine.process", "app.panels.history", "app.panels.base",
                "tests.gui.fake_server", "app.settings.kv_notes", "app.services.download_advice"]


@pytest.mark.parametrize("name", PURE_MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


# -- wire -----------------------------------------------------------------------------------

def test_sse_parser_handles_any_cut_of_the_stream() -> None:
    stream = (b"event: plan\r\ndata: {\"a\": 1}\r\n\r\n: comment\n\ndata: x\ndata: y\n\n"
              b"event: loaded\rdata: {}\r\n\r\n")
    expected = [SseEvent("plan", '{"a": 1}'), SseEvent("message", "x\ny"), SseEvent("loaded", "{}")]
    for size in (1, 2, 3, 7, len(stream)):
        parser = SseParser()
        events = []
        for i in range(0, len(stream), size):
            events += parser.feed(stream[i:i + size])
        assert events == expected, size


def test_chat_chunks_become_typed_items() -> None:
    step = {"drafted": 4, "accepted": 3, "k": 4, "acceptance_rate": 0.75,
            "mean_accepted_length": 2.5, "predicted_speedup": 1.6, "measured_speedup": 1.4,
            "drafting_off_reason": None}
    items = parse_chat_chunk({"id": "c", "choices": [{"index": 0, "delta": {"content": "ab"}}],
                              "outrider": {"token_ids": [1, 2], "from_draft": [True, True],
                                           "step": step}})
    assert items[0] == TextDelta("ab", (1, 2), (True, True)) and items[0].drafted
    assert isinstance(items[1], StepStats) and items[1].accepted == 3 and items[1].k == 4
    final = parse_chat_chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                              "outrider": {"timings": {"ttft_s": 0.5, "prefill_tokens_per_s": 100,
                                                       "decode_tokens_per_s": 20, "total_s": 2},
                                           "usage": {"prompt_tokens": 5, "completion_tokens": 9,
                                                     "prompt_tokens_details": {"cached_tokens": 2}},
                                           "speculative": None}})
    assert len(final) == 1 and isinstance(final[0], ReplyFinished)
    assert final[0].reason == "length" and final[0].usage.cached_tokens == 2
    assert final[0].timings.decode_tokens_per_s == 20.0 and final[0].speculative is None
    assert parse_chat_chunk({"choices": [], "usage": {"prompt_tokens": 1}}) == []
    with pytest.raises(WireError):
        parse_chat_chunk({"error": {"message": "x"}})


def test_mixed_draft_chunks_are_not_highlighted() -> None:
    assert not TextDelta("ab", (1, 2), (True, False)).drafted
    assert not TextDelta("a", (1,), ()).drafted


def test_ready_line_errors_and_metrics() -> None:
    assert parse_ready_line("INFO: started", "k") is None
    with pytest.raises(WireError):
        parse_ready_line("OUTRIDER_SERVER_READY {nope", "k")
    error = parse_error_body(b'{"error": {"message": "No model", "type": "invalid_request_error"}}', 400)
    assert (error.kind, error.message) == ("invalid_request_error", "No model")
    assert parse_error_body(b"<html>", 502).kind == "HTTP 502"
    snap = parse_metrics({"time": 1.0, "devices": [{"id": "cuda:0", "name": "GPU", "kind": "cuda",
                                                    "total_bytes": 100, "free_bytes": 40,
                                                    "planned": {"weights": 10, "kv": 5,
                                                                "overhead": 3}}],
                          "acceptance_rate": None, "draft_k": 3})
    device = snap.devices[0]
    assert device.used_bytes == 60 and device.planned_bytes == 18  # overhead counts
    assert snap.acceptance_rate is None and snap.draft_k == 3


# -- store ----------------------------------------------------------------------------------

def test_store_round_trip_with_branches(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    conv = store.create_conversation("T", system_prompt="sys",
                                     sampling=SamplingParams(temperature=0.1, seed=5))
    user = store.add_message(conv.id, None, "user", "q")
    reply = store.add_message(conv.id, user.id, "assistant", "", status="streaming")
    reply.add_text("part", True)
    reply.stats = {"tokens": 1}
    store.save_message(reply)
    conv.current_leaf = reply.id
    store.save_conversation(conv)
    store.close()

    again = ChatStore(tmp_path / "chats.sqlite3")
    loaded = again.conversation(conv.id)
    assert loaded.sampling == SamplingParams(temperature=0.1, seed=5)
    assert loaded.system_prompt == "sys" and loaded.current_leaf == reply.id
    messages = again.messages(conv.id)
    assert [(m.role, m.content, m.status) for m in messages] == [
        ("user", "q", "done"), ("assistant", "part", "streaming")]
    assert messages[1].draft_spans == [[0, 4]] and messages[1].stats == {"tokens": 1}
    again.delete_conversation(conv.id)
    assert again.messages(conv.id) == []  # cascades
    again.close()


def test_store_uses_wal_and_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    ChatStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(ChatStoreError, match="newer Outrider"):
        ChatStore(path)


def test_store_search_and_pages(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "c.sqlite3")
    for i in range(5):
        conv = store.create_conversation(f"chat {i}")
        store.add_message(conv.id, None, "user", "needle" if i == 2 else "hay")
    assert [c.title for c in store.list_conversations(0, 2)] == ["chat 4", "chat 3"]
    assert [c.title for c in store.list_conversations(4, 2)] == ["chat 0"]
    assert [c.title for c in store.list_conversations(query="NEEDLE")] == ["chat 2"]
    assert [c.title for c in store.list_conversations(query="chat 1")] == ["chat 1"]
    store.close()


# -- tree, Markdown, crash reports ------------------------------------------------------------

def test_tree_paths_and_branches() -> None:
    m = [Message(1, 1, None, "user", "q", 0), Message(2, 1, 1, "assistant", "a", 0),
         Message(3, 1, None, "user", "q2", 0), Message(4, 1, 3, "assistant", "b", 0),
         Message(5, 1, 4, "user", "more", 0)]
    tree = MessageTree(m)
    assert [x.id for x in tree.path(None)] == [3, 4, 5]  # the newest branch
    assert [x.id for x in tree.path(2)] == [1, 2]
    assert tree.branch_position(1) == (1, 2) and tree.branch_position(3) == (2, 2)
    assert tree.switch(3, -1) == 2 and tree.switch(1, +1) == 5 and tree.switch(1, -1) is None


def test_markdown_escapes_html_and_marks_drafts() -> None:
    renderer = MarkdownRenderer(DARK)
    html = renderer.render("<script>alert(1)</script> **bold**").html
    assert "<script>" not in html and "&lt;script&gt;" in html and "<strong>bold</strong>" in html
    marked = mark_drafts("- item\n## Head", [[0, 15]])
    assert marked == f"- {DRAFT_START}item{DRAFT_END}\n## {DRAFT_START}Head{DRAFT_END}"
    drafted = MarkdownRenderer(LIGHT).render("- item\n## Head", [[0, 15]]).html
    assert "<li><span" in drafted and "<h2><span" in drafted
    code = MarkdownRenderer(LIGHT).render("```\nx = 1\n```", [[4, 9]])
    assert code.code_blocks == ["x = 1\n"] and LIGHT.draft_bg in code.html


def test_crash_reports_are_kept_and_shown_once(tmp_path: Path) -> None:
    dead = tmp_path / "session-999999999.log"
    dead.write_text("Fatal Python error: Segmentation fault\n")
    (tmp_path / "session-999999998.log").write_text("")
    reporter = CrashReporter(tmp_path)
    found = reporter.install()
    try:
        assert len(found) == 1 and "Segmentation fault" in found[0].read_text()
        assert (tmp_path / f"session-{os.getpid()}.log").is_file()
        assert not (tmp_path / "session-999999998.log").exists()
    finally:
        reporter.uninstall()
    assert not (tmp_path / f"session-{os.getpid()}.log").exists()
    assert CrashReporter(tmp_path)._collect_previous() == []


def test_background_runner_returns_results_and_errors(qtbot) -> None:
    from app.services.background import BackgroundRunner

    runner = BackgroundRunner()
    try:
        ok = runner.submit(lambda a, b: a + b, 2, 3)
        with qtbot.waitSignal(ok.done) as done:
            pass
        assert done.args == [5]
        bad = runner.submit(lambda: json.loads("{"))
        with qtbot.waitSignal(bad.failed) as failed:
            pass
        assert isinstance(failed.args[0], ValueError)
    finally:
        runner.shutdown()


def test_throttle_coalesces_calls(qtbot) -> None:
    from app.throttle import Throttle

    calls: list[int] = []
    throttle = Throttle(lambda: calls.append(1), 50)
    for _ in range(100):
        throttle()
    assert calls == []  # never inside the caller
    qtbot.waitUntil(lambda: len(calls) == 1)
    throttle()
    throttle.flush()  # a pending run happens now
    assert len(calls) == 2
    throttle.flush()  # nothing pending: nothing runs
    assert len(calls) == 2


# -- shared widgets -------------------------------------------------------------------------

def test_read_only_table_tips_one_stretched_column_and_cells(qtbot) -> None:
    from app.qt import QtWidgets

    table = read_only_table(("Model", "Repository", "Size"), stretch=1,
                            tips={"Size": "On disk"})
    qtbot.addWidget(table)
    header = table.horizontalHeader()
    modes = [header.sectionResizeMode(i) for i in range(3)]
    assert modes == [QtWidgets.QHeaderView.ResizeMode.ResizeToContents,
                     QtWidgets.QHeaderView.ResizeMode.Stretch,
                     QtWidgets.QHeaderView.ResizeMode.ResizeToContents]
    assert [table.horizontalHeaderItem(i).text() for i in range(3)] == ["Model", "Repository",
                                                                        "Size"]
    assert table.horizontalHeaderItem(2).toolTip() == "On disk"
    assert table.horizontalHeaderItem(0).toolTip() == ""
    assert table.selectionMode() == QtWidgets.QAbstractItemView.SelectionMode.SingleSelection
    table.setRowCount(1)
    table.setItem(0, 0, QtWidgets.QTableWidgetItem("m.gguf"))
    assert cell(table, 0, 0).text() == "m.gguf"
    with pytest.raises(LookupError, match=r"\(0, 1\) is empty"):
        cell(table, 0, 1)


def test_page_column_opens_with_title_and_muted_intro(qtbot) -> None:
    from app.qt import QtWidgets

    page = QtWidgets.QWidget()
    qtbot.addWidget(page)
    column = page_column(page, "Engine server", "Models run apart.", margins=(1, 2, 3, 4),
                         spacing=5)
    title, intro = (column.itemAt(i).widget() for i in range(2))
    assert isinstance(title, QtWidgets.QLabel) and isinstance(intro, QtWidgets.QLabel)
    assert (title.text(), title.objectName()) == ("Engine server", "pageTitle")
    assert (intro.text(), intro.objectName(), intro.wordWrap()) == ("Models run apart.", "muted",
                                                                    True)
    margins = column.contentsMargins()
    assert (margins.left(), margins.top(), margins.right(), margins.bottom()) == (1, 2, 3, 4)
    assert column.spacing() == 5 and page.layout() is column
