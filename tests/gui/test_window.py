"""The main window around the chat: live panels, conversation list, shortcuts, remembered
state, the first-run page, loading with a plan, the Server page."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.chat import model_picker
from app.engine.client import EngineState
from app.qt import Qt, QtWidgets
from app.window import CHAT, FIRST_RUN, SERVER, MainWindow
from runtime.paths import user_dirs
from tests.gui.conftest import WindowFactory, fake_command
from tests.gui.test_chat import send


def curve_ys(curve: object) -> list[float]:
    data = curve.getData()[1]  # type: ignore[attr-defined]
    return [] if data is None else list(data)


def test_panels_receive_metrics_and_plot_them(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.ensure_panels()
    panels = window.panels
    assert panels is not None and panels.isVisible()
    qtbot.waitUntil(lambda: len(curve_ys(panels.speculative.curves["acceptance"])) >= 3,
                    timeout=10_000)

    xs, ys = panels.speed.curves["decode"].getData()
    assert len(xs) >= 3 and len(ys) == len(xs)
    assert xs[-1] == 0.0 and all(x <= 0 for x in xs)  # seconds before the newest sample
    _rss_x, rss_y = panels.memory.curves["rss"].getData()
    assert len(rss_y) >= 3 and rss_y[-1] == pytest.approx(300.0)  # fake RSS: 300 MiB
    weights = panels.memory.bars["weights"].opts["height"]
    assert list(weights) == [pytest.approx(4 / (1 << 20))]  # the 4-byte fake model file
    assert panels.memory.bars["kv"].opts["height"][0] == pytest.approx(4.0)
    acceptance = panels.speculative.curves["acceptance"].getData()[1]
    assert len(acceptance) >= 3 and acceptance[-1] == pytest.approx(50.0)

    send(qtbot, window, "one two three")
    qtbot.waitUntil(lambda: curve_ys(panels.speed.curves["decode"])[-1] > 0, timeout=5_000)
    assert panels.speculative.values["counts"].text() == "12 / 24 drafted"  # 6 steps of 2 / 4
    assert "predicted 1.40×" in panels.speculative.values["speedup"].text()
    assert panels.speed.values["ttft"].text().endswith("ms")

    window.panels_button.click()
    assert not panels.isVisible()


def test_conversation_list_new_rename_delete_search(qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    controller, model = window.controller, window.chat.list_model
    first = controller.new_conversation()
    controller.rename(first.id, "  Apples   and pears ")
    second = controller.new_conversation()
    assert model.rowCount() == 2
    assert model.data(model.index(1)) == "Apples and pears"
    assert model.setData(model.index(0), "Bananas")
    assert model.data(model.index(0)) == "Bananas"

    qtbot.keyClick(window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert window.focusWidget() is window.chat.pane.search
    qtbot.keyClicks(window.chat.pane.search, "apple")
    qtbot.waitUntil(lambda: model.rowCount() == 1)
    assert model.data(model.index(0)) == "Apples and pears"
    window.chat.pane.search.clear()
    qtbot.waitUntil(lambda: model.rowCount() == 2)

    controller.delete(second.id)
    assert model.rowCount() == 1 and controller.conversation is None
    with pytest.raises(Exception, match="no conversation"):
        controller.store.conversation(second.id)


def test_new_chat_shortcut_and_paging(qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    for i in range(120):  # more than one page of the lazily loaded list
        window.controller.store.create_conversation(f"chat {i}")
    window.chat.list_model.reload()
    model = window.chat.list_model
    assert model.rowCount() == 100 and model.canFetchMore()
    model.fetchMore()
    assert model.rowCount() == 120 and not model.canFetchMore()

    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.controller.conversation is not None
    assert model.data(model.index(0)) == "New chat"  # the newest first
    assert window.focusWidget() is window.chat.composer.input


def test_window_state_is_remembered(qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    window.resize(window.width(), 520)
    window.show_page(SERVER)
    window.close()
    again = make_window(fake_command())
    # (the offscreen screen is 800 px wide, so only the height can show a restored size)
    assert again.height() == 520
    assert again.pages.currentIndex() == SERVER


def test_first_run_page_is_offered_with_an_empty_library(qtbot, make_window: WindowFactory,
                                                         tmp_path: Path) -> None:
    model = tmp_path / "default.gguf"
    model.write_bytes(b"GGUF")
    window = make_window(fake_command())
    window.first_run._default_path = model
    window.first_run._update_default_button()
    assert window.offer_first_run()
    assert window.pages.currentIndex() == FIRST_RUN
    qtbot.waitUntil(lambda: "Recommended for this machine (" in
                    window.first_run.recommended_title.text(), timeout=10_000)
    assert window.first_run.default_button.text() == "Use this model"
    window.first_run.default_button.click()
    assert window.pages.currentIndex() == CHAT
    qtbot.waitUntil(lambda: window.client.state == EngineState.READY, timeout=30_000)
    assert window.client.model.path == str(model)

    library = user_dirs().models / "owner" / "repo"
    library.mkdir(parents=True)
    (library / "x.gguf").write_bytes(b"GGUF")
    assert not window.offer_first_run()


def test_load_asks_first_when_the_plan_says_wont_fit(qtbot, make_window: WindowFactory,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    library = user_dirs().models / "owner" / "repo"
    library.mkdir(parents=True)
    big = library / "huge.gguf"
    big.write_bytes(b"GGUF")
    monkeypatch.setattr(model_picker, "plan_model", lambda settings: {
        "verdict": "wont_fit", "total": 90 << 30, "summary": "Won't fit: 90.0 GiB"})
    window = make_window(fake_command())
    picker = window.picker
    picker.add_model(big)  # a 4-byte file is no library model: the library leaves it out
    picker.load_button.click()
    qtbot.waitUntil(lambda: picker._confirm is not None and picker._confirm.isVisible())
    assert picker.status.text() == "Won't fit: 90.0 GiB"
    assert window.client.state == EngineState.STOPPED  # nothing started before the answer
    picker._confirm.reject()
    assert window.client.state == EngineState.STOPPED
    assert picker.status.text().startswith("Not loaded")

    picker.load_button.click()
    qtbot.waitUntil(lambda: picker._confirm is not None and picker._confirm.isVisible())
    yes = picker._confirm.button(QtWidgets.QMessageBox.StandardButton.Yes)
    yes.click()
    qtbot.waitUntil(lambda: window.client.state == EngineState.READY, timeout=30_000)
    assert "planned" in picker.status.text() and "buffers" in picker.status.text()


def test_load_with_a_plan_that_fits_goes_straight_on(qtbot, make_window: WindowFactory,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    library = user_dirs().models / "owner" / "repo"
    library.mkdir(parents=True)
    (library / "small.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(model_picker, "plan_model", lambda settings: {
        "verdict": "cpu_only", "total": 10 << 20, "summary": "CPU only: 10 MiB"})
    window = make_window(fake_command())
    window.picker.add_model(library / "small.gguf")
    window.picker.load_button.click()
    qtbot.waitUntil(lambda: window.client.state == EngineState.READY, timeout=30_000)
    assert window.picker._confirm is None


def test_a_file_the_planner_refuses_is_not_loaded(qtbot, make_window: WindowFactory) -> None:
    library = user_dirs().models / "owner" / "repo"
    library.mkdir(parents=True)
    (library / "broken.gguf").write_bytes(b"GGUF")
    window = make_window(fake_command())
    window.picker.add_model(library / "broken.gguf")
    window.picker.load_button.click()  # the real planner: a 4-byte file is no model
    qtbot.waitUntil(window.picker.load_button.isEnabled, timeout=10_000)
    assert window.client.state == EngineState.STOPPED
    assert window.picker.status.text() not in ("", "Planning memory…")


def test_server_page_shows_the_engine_and_its_log(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.show_page(SERVER)
    page = window.server
    assert page.state_label.text() == "Ready"
    assert page.url_label.text().startswith("http://127.0.0.1:")
    assert page.key_label.text() == "none needed on this computer"  # loopback: no key
    assert not page.show_key.isEnabled()
    assert "OUTRIDER_SERVER_READY" in page.log_view.toPlainText()
    with qtbot.waitSignal(window.client.engine_exited, timeout=10_000):
        window.client.process.kill()
    assert page.crash_label.isVisible()
    assert window.client.state == EngineState.CRASHED
    assert page.start_button.isEnabled()
    with qtbot.waitSignal(window.client.state_changed, timeout=10_000,
                          check_params_cb=lambda s: s == EngineState.READY):
        page.start_button.click()
    assert window.client.model is not None  # the wanted model came back with the engine
