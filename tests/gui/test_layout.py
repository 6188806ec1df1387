"""The window's layout at the sizes people use, 1024×700 to 1920×1080: every page fits without
clipping or overlap, nothing widens the window or squeezes the chat list, bubbles keep a reading
width, combo boxes draw their arrow and check boxes their outline, and the scroll wheel scrolls
Settings rather than editing the field under the pointer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.chat.conversation import Message
from app.engine.wire import DeviceMemory, MetricsSnapshot, ServedModel
from app.models.models_page import DISCOVER, DOWNLOADS, LIBRARY, REPOSITORY
from app.panels.dock import LivePanels
from app.qt import Qt, QtCore, QtGui, QtWidgets
from app.settings.settings_page import APP, MODEL
from app.theme import DARK, LIGHT, Palette, apply_theme
from app.widgets import ElidedLabel
from app.window import CHAT, FIRST_RUN, MODELS, SERVER, SETTINGS, MainWindow
from runtime.downloads.manager import DownloadProgress, DownloadStateChanged
from runtime.downloads.queue import DownloadJob
from runtime.events import StepStats
from tests.gui.conftest import WindowFactory, fake_command

SMALL = (1024, 700)
CHECKED = (QtWidgets.QLabel, QtWidgets.QAbstractButton, QtWidgets.QComboBox)


def layout_problems(window: QtWidgets.QWidget) -> list[str]:
    """What a person would see cut off on the visible page: a label, button or combo box
    narrower than its minimum (a wrapped label: shorter than its text needs; an eliding one
    has its own rule), a scroll area that scrolls sideways, widgets of one layout on top of
    each other."""
    found = []
    for widget in window.findChildren(QtWidgets.QWidget):
        if not widget.isVisible() or widget.window() is not window:
            continue
        name = f"{type(widget).__name__} {widget.objectName()!r} {_text(widget)!r}"
        if isinstance(widget, QtWidgets.QLabel) and widget.wordWrap():
            if widget.height() < widget.heightForWidth(widget.width()):
                found.append(f"{name}: {widget.height()} px high, its text needs "
                             f"{widget.heightForWidth(widget.width())}")
        elif isinstance(widget, CHECKED) and not isinstance(widget, ElidedLabel) \
                and widget.width() < widget.minimumSizeHint().width():
            found.append(f"{name}: {widget.width()} px wide, needs "
                         f"{widget.minimumSizeHint().width()}")
        if isinstance(widget, QtWidgets.QAbstractScrollArea) \
                and widget.horizontalScrollBar().isVisible():
            found.append(f"{name}: scrolls sideways")
        layout = widget.layout()
        if layout is not None:
            found += _overlaps(layout, name)
    return found


def _overlaps(layout: QtWidgets.QLayout, owner: str) -> list[str]:
    items = [layout.itemAt(i) for i in range(layout.count())]
    shown = [item.widget() for item in items if item.widget() is not None
             and item.widget().isVisible()]
    found = []
    for i, first in enumerate(shown):
        for second in shown[i + 1:]:
            if first.geometry().intersects(second.geometry()):
                found.append(f"{owner}: {_text(first)!r} overlaps {_text(second)!r}")
    return found


def _text(widget: QtWidgets.QWidget) -> str:
    text = getattr(widget, "text", None)
    return str(text())[:40] if callable(text) else ""


def settle(qtbot, window: MainWindow) -> None:
    """Let the layouts run (posted LayoutRequest events) before measuring."""
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.LayoutRequest)
    qtbot.wait(50)  # one more pass for layouts that a resize started


def visits(window: MainWindow) -> Iterator[str]:
    """Every page and tab a newcomer reaches, shown one after the other."""
    for page, name in ((CHAT, "chat"), (SERVER, "server"), (FIRST_RUN, "first run")):
        window.show_page(page)
        yield name
    window.chat.settings_button.setChecked(True)
    window.show_page(CHAT)
    yield "chat settings"
    window.chat.settings_button.setChecked(False)
    for tab, name in ((DISCOVER, "discover"), (REPOSITORY, "repository"),
                      (DOWNLOADS, "downloads"), (LIBRARY, "library")):
        window.show_page(MODELS)
        window.models_page.setCurrentIndex(tab)
        yield f"models: {name}"
    for tab, name in ((APP, "app"), (MODEL, "model")):
        window.show_page(SETTINGS)
        window.settings_page.setCurrentIndex(tab)
        yield f"settings: {name}"


def add_download(window: MainWindow) -> DownloadJob:
    job = DownloadJob(id="j1", repo_id="bartowski/Qwen2.5-Coder-7B-Instruct-GGUF",
                      filename="Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf", state="running",
                      size=4_683_073_536, received=1_234_567_890)
    downloads = window.models_page.downloads
    downloads.on_event(DownloadStateChanged(job))
    downloads.on_event(DownloadProgress(job.id, job.filename, job.received, job.size,
                                        12_500_000.0, 275.0))
    return job


@pytest.fixture
def small_window(qtbot, qapp, themed, make_window: WindowFactory) -> MainWindow:
    """A window at 1024×700 styled as the app styles itself (`apply_theme` on the whole
    application, as `app.main` does): without the style sheet's padding every button measured
    ~20 px narrower, and the pages "fitted" here while the real app came out 1054 px wide."""
    apply_theme(qapp, LIGHT)
    window = make_window(fake_command())
    window.ensure_panels()
    window.resize(*SMALL)
    settle(qtbot, window)
    return window


def test_every_page_fits_a_1024x700_window(qtbot, small_window: MainWindow) -> None:
    window = small_window
    add_download(window)
    assert window.panels is not None and not window.panels.isVisible()  # folded away
    assert not window.panels_button.isChecked()  # to its toggle
    for name in visits(window):
        settle(qtbot, window)
        assert window.minimumSizeHint().width() <= SMALL[0], name
        assert window.size() == QtCore.QSize(*SMALL), name
        assert layout_problems(window) == [], name


def test_the_live_dock_shrinks_to_leave_the_chat_whole(qtbot, small_window: MainWindow) -> None:
    window = small_window
    window.show_page(CHAT)
    window.panels_button.click()  # the user opens it all the same
    settle(qtbot, window)
    assert window.panels is not None and window.panels.isVisible()
    assert window.panels.width() < 380  # it gave way
    assert window.size() == QtCore.QSize(*SMALL)
    for name in visits(window):
        if name.startswith("chat"):
            settle(qtbot, window)
            assert window.minimumSizeHint().width() <= SMALL[0], name
            assert layout_problems(window) == [], name
    window.show_page(CHAT)
    settle(qtbot, window)
    picker = window.chat.picker
    combo, load = picker.combo.geometry(), picker.load_button.geometry()
    assert combo.right() < load.left()  # the model box never covers Load
    assert window.chat.title.width() >= 100  # the chat's title shows

    window.resize(1320, 840)
    settle(qtbot, window)
    assert window.panels.isVisible()  # the user's choice stands
    window.resize(*SMALL)
    settle(qtbot, window)
    assert not window.panels.isVisible()  # narrow again: folded
    window.resize(1320, 840)
    settle(qtbot, window)
    assert window.panels.isVisible() and window.panels_button.isChecked()  # and back


def test_a_wide_window_with_the_dock_open_shrinks_to_1024_at_once(
        qtbot, small_window: MainWindow) -> None:
    """As `make screenshots` does it: from a wide window with the dock open straight to
    1024×700. Qt bounds the new size by the window's minimum *with* the dock before the resize
    folds it, so every page, beside an open dock, must fit 1024 px (it was 1054: the Models
    page's Library buttons and the chat header with the conversation list)."""
    window = small_window
    add_download(window)
    window.resize(1320, 840)
    settle(qtbot, window)
    assert window.panels is not None and window.panels.isVisible()
    for name in visits(window):
        settle(qtbot, window)
        window.panels.show()
        settle(qtbot, window)
        assert window.minimumSizeHint().width() <= SMALL[0], name
    window.show_page(MODELS)
    window.models_page.setCurrentIndex(LIBRARY)
    window.resize(1320, 840)
    settle(qtbot, window)
    window.resize(*SMALL)
    settle(qtbot, window)
    assert window.size() == QtCore.QSize(*SMALL)
    assert not window.panels.isVisible()  # folded, after the resize that it did not block


def test_the_acceptance_chart_shows_without_scrolling_the_dock(qtbot,
                                                               small_window: MainWindow) -> None:
    window = small_window
    window.panels_button.click()  # open at 1024×700, as a user may
    settle(qtbot, window)
    dock = window.panels
    assert dock is not None and dock.isVisible() and window.size() == QtCore.QSize(*SMALL)
    show_a_speculative_reply(dock)
    settle(qtbot, window)
    scroll = dock.widget()
    assert isinstance(scroll, QtWidgets.QScrollArea)
    assert scroll.verticalScrollBar().value() == 0
    chart = dock.speculative.plot
    viewport = scroll.viewport()
    where = QtCore.QRect(chart.mapTo(viewport, QtCore.QPoint(0, 0)), chart.size())
    assert viewport.rect().contains(where), f"chart at {where}, viewport {viewport.rect()}"

    window.panels_button.click()
    window.resize(1920, 1080)
    settle(qtbot, window)
    if not dock.isVisible():
        window.panels_button.click()
        settle(qtbot, window)
    where = QtCore.QRect(chart.mapTo(viewport, QtCore.QPoint(0, 0)), chart.size())
    assert viewport.rect().contains(where), f"chart at {where}, viewport {viewport.rect()}"


def show_a_speculative_reply(dock: LivePanels) -> None:
    """N-gram drafting loaded, a reply of three rounds, its footer and a metrics snapshot with
    long values (a long CPU name, a full 128K context), as the panels show them after it."""
    dock.on_model(ServedModel("SmolLM2-135M-Instruct.Q4_1", path="/m/SmolLM2.gguf",
                              draft="ngram"))
    cpu = DeviceMemory("cpu", "Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz", "cpu",
                       total_bytes=64 << 30, free_bytes=40 << 30, planned_weights=92 << 20,
                       planned_kv=40 << 20, planned_compute=104 << 20, planned_other=17 << 20)
    dock.on_metrics(MetricsSnapshot(time=1_000.0, devices=(cpu,), engine_rss_bytes=263 << 20,
                                    decode_tokens_per_s=48.2, prefill_tokens_per_s=912.0,
                                    acceptance_rate=0.53, mean_accepted_length=2.1, draft_k=4,
                                    kv_cells_used=412, kv_cells_total=2048,
                                    active_sequences=0))
    dock.on_busy(True)
    for i in range(3):
        dock.on_step(StepStats("r", i, drafted=4, accepted=2, reply_drafted=4 * (i + 1),
                               reply_accepted=2 * (i + 1), k=4, acceptance_rate=0.5,
                               mean_accepted_length=2.0, predicted_speedup=1.4,
                               measured_speedup=0.7))
    dock.on_busy(False)
    dock.speed.update_reply({"ttft_s": 0.21})


def test_downloads_show_the_file_name_and_the_whole_progress_text(
        qtbot, small_window: MainWindow) -> None:
    window = small_window
    add_download(window)
    window.show_page(MODELS)
    window.models_page.setCurrentIndex(DOWNLOADS)
    settle(qtbot, window)
    table = window.models_page.downloads.table
    assert not table.horizontalScrollBar().isVisible()
    assert table.columnWidth(0) >= 100  # "Qwen2.5…Q4_K_M.gguf", not "s…"
    bar = table.cellWidget(0, 2)
    assert isinstance(bar, QtWidgets.QProgressBar)
    assert bar.height() >= bar.fontMetrics().height()  # its text is not cut in half
    assert bar.width() >= bar.fontMetrics().horizontalAdvance(bar.text())


def test_settings_keep_the_kv_explanation_whole(qtbot, small_window: MainWindow) -> None:
    window = small_window
    window.show_page(SETTINGS)
    window.settings_page.setCurrentIndex(MODEL)
    form = window.settings_page.model.form
    form.type_k.setCurrentIndex(form.type_k.findData("q4_0"))
    form.type_v.setCurrentIndex(form.type_v.findData("q4_0"))
    settle(qtbot, window)
    note = form.kv_note
    assert note.text()
    assert note.height() >= note.heightForWidth(note.width())


def test_edit_and_chat_settings_keep_the_window_and_the_list_as_they_were(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.resize(1320, 840)
    settle(qtbot, window)
    pane = window.chat.pane.width()
    window.chat.composer.start_edit(1, "an earlier question")
    settle(qtbot, window)
    assert window.width() == 1320
    assert window.minimumSizeHint().width() <= 1320
    window.chat.composer.cancel_edit()

    window.chat.settings_button.setChecked(True)
    settle(qtbot, window)
    assert window.chat.pane.width() == pane  # 240, not squeezed to 170
    drawer = window.chat.settings
    transcript = window.chat.transcript
    below = drawer.mapTo(window, QtCore.QPoint(0, drawer.height())).y()
    assert below <= transcript.mapTo(window, QtCore.QPoint(0, 0)).y()  # never on the messages
    assert layout_problems(window) == []


def test_bubbles_keep_a_reading_width_centred(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.resize(1920, 1080)
    window.panels_button.setChecked(False)
    path = [Message(1, 1, None, "user", "A question " * 60, 0.0),
            Message(2, 1, 1, "assistant", "An answer " * 80, 0.0)]
    transcript = window.chat.transcript
    transcript.set_path(path, window.controller.tree, False)
    settle(qtbot, window)
    viewport = transcript.viewport().width()
    assert viewport > 1200
    for card in transcript.cards():
        assert 700 <= card.width() <= 760
        left = card.x()
        assert abs(left - (viewport - card.width() - left)) <= 2  # centred
    window.resize(*SMALL)
    settle(qtbot, window)
    for card in transcript.cards():  # narrower than the cap: as wide as the room
        assert card.width() == transcript.viewport().width() - 48


def test_a_cut_off_label_tells_its_whole_text(qtbot) -> None:
    label = ElidedLabel("Q4_1 · planned 134 MiB · measured 131 MiB")
    qtbot.addWidget(label)
    label.resize(90, 20)
    label.show()
    qtbot.waitExposed(label)
    shown = QtWidgets.QLabel.text(label)
    assert shown.endswith("…") and shown != label.text()
    assert label.toolTip() == "Q4_1 · planned 134 MiB · measured 131 MiB"


@pytest.fixture
def themed(qapp: QtWidgets.QApplication) -> Iterator[None]:
    palette, sheet, style = QtGui.QPalette(qapp.palette()), qapp.styleSheet(), qapp.style().name()
    yield
    qapp.setStyleSheet(sheet)
    qapp.setPalette(palette)
    qapp.setStyle(style)


def _grab(qtbot, widget: QtWidgets.QWidget) -> QtGui.QImage:
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget.grab().toImage()


def _near(color: QtGui.QColor, hex_color: str, tolerance: int = 40) -> bool:
    want = QtGui.QColor(hex_color)
    return max(abs(color.red() - want.red()), abs(color.green() - want.green()),
               abs(color.blue() - want.blue())) <= tolerance


@pytest.mark.parametrize("palette", [LIGHT, DARK], ids=["light", "dark"])
def test_combo_boxes_draw_their_arrow(qtbot, qapp, themed, palette: Palette) -> None:
    apply_theme(qapp, palette)
    combo = QtWidgets.QComboBox()
    combo.addItems(["system", "light", "dark"])
    combo.resize(160, 30)
    image = _grab(qtbot, combo)
    rows = [sum(_near(image.pixelColor(x, y), palette.muted)
                for x in range(image.width() - 20, image.width()))
            for y in range(image.height())]
    drawn = [n for n in rows if n]
    assert sum(drawn) >= 12, rows  # an arrow, not a speck
    # A triangle pointing down: wide at the top, narrow at the tip (a bar is as wide throughout).
    assert len(drawn) >= 3 and drawn[0] > drawn[-1], rows


def test_dark_check_boxes_are_outlined_and_filled_when_checked(qtbot, qapp, themed) -> None:
    apply_theme(qapp, DARK)
    box = QtWidgets.QCheckBox("Allow other computers")
    image = _grab(qtbot, box)
    rect = box.style().subElementRect(QtWidgets.QStyle.SubElement.SE_CheckBoxIndicator,
                                      _option(box), box)
    edge = [image.pixelColor(rect.left(), y) for y in range(rect.top() + 3, rect.bottom() - 2)]
    assert edge and all(_near(c, DARK.muted) for c in edge)  # not the window's near-black
    box.setChecked(True)
    image = box.grab().toImage()
    assert _near(image.pixelColor(rect.center()), DARK.accent)


def _option(box: QtWidgets.QCheckBox) -> QtWidgets.QStyleOptionButton:
    option = QtWidgets.QStyleOptionButton()
    option.initFrom(box)
    return option


def wheel(widget: QtWidgets.QWidget, steps: int = -1) -> None:
    """One notch of the wheel (down, by default) over the middle of `widget`."""
    local = QtCore.QPointF(widget.rect().center())
    event = QtGui.QWheelEvent(local, QtCore.QPointF(widget.mapToGlobal(local.toPoint())),
                              QtCore.QPoint(0, 0), QtCore.QPoint(0, 120 * steps),
                              Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                              Qt.ScrollPhase.NoScrollPhase, False)
    QtWidgets.QApplication.sendEvent(widget, event)


def test_the_wheel_scrolls_settings_past_an_unfocused_field(qtbot,
                                                           make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    window.resize(1024, 500)  # the App tab is taller than that: it scrolls
    window.show_page(SETTINGS)
    window.settings_page.setCurrentIndex(APP)
    settle(qtbot, window)
    page = window.settings_page.app
    scroll = window.settings_page.currentWidget()
    assert isinstance(scroll, QtWidgets.QScrollArea)
    bar = scroll.verticalScrollBar()
    assert bar.maximum() > 0
    for field in (page.parallel, page.preferred):
        assert field.focusPolicy() == Qt.FocusPolicy.StrongFocus  # the wheel never focuses it
    spin, combo = page.parallel, page.preferred
    spin.setValue(3)
    window.nav.setFocus()
    value, index = spin.value(), combo.currentIndex()

    wheel(spin)
    assert spin.value() == value and bar.value() > 0  # the page scrolled instead
    scrolled = bar.value()
    wheel(combo, +1)
    assert combo.currentIndex() == index and bar.value() < scrolled

    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus)
    at = bar.value()
    wheel(spin)  # focused: the wheel steps the value, the page stays
    assert spin.value() == value - 1 and bar.value() == at
