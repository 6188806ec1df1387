"""Issue 19, items 6, 7 and 10: the chat's details and the figures beside it — one name per
memory figure, a short Drafting line, advice with a slow speedup, the acceptance chart in
sight; Send after Unload; TTFT of the first reply, an early Stop, line breaks, titles, the
last conversation at start-up, one set of sampling defaults, Tab, the remembered Draft
tokens toggle."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.chat import model_picker
from app.chat.conversation import DEFAULT_SAMPLING, Message
from app.chat.markdown import MarkdownRenderer
from app.chat.transcript import STOPPED_EARLY, MessageCard
from app.engine.client import EngineState
from app.engine.wire import DeviceMemory, MetricsSnapshot, ServedModel
from app.panels.dock import LivePanels
from app.qt import Qt
from app.theme import LIGHT
from app.window import MainWindow
from runtime.events import SamplingParams, StepStats
from tests.gui.conftest import ENGINE_TIMEOUT_MS, WindowFactory, fake_command, load
from tests.gui.test_chat import send

MIB = 1 << 20
NGRAM = ServedModel("model", path="/models/model.gguf", draft="ngram")


def snapshot(rss: int = 263 * MIB) -> MetricsSnapshot:
    cpu = DeviceMemory("cpu", "CPU", "cpu", total_bytes=8 << 30, free_bytes=4 << 30,
                       planned_weights=200 * MIB, planned_kv=40 * MIB)
    return MetricsSnapshot(time=1_000.0, devices=(cpu,), engine_rss_bytes=rss)


# -- item 6: numbers that agree ---------------------------------------------------------------

def test_status_bar_and_memory_panel_show_one_figure_under_one_name(
        qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    window.ensure_panels()
    assert window.panels is not None
    window.client.metrics_received.emit(snapshot())
    memory = window.panels.memory
    row_name = memory._grid.itemAtPosition(0, 2).widget().text()
    assert row_name == "Engine RAM"  # not "Used" beside the status bar's "Engine RAM"
    assert memory.values["used"].text() == "263 MiB"
    assert window.memory_label.text().startswith("Engine RAM 263 MiB")
    name = memory._grid.itemAtPosition(0, 2).widget()
    for tip in (name.toolTip(), window.memory_label.toolTip()):
        assert "resident memory" in tip  # says what it counts


def test_the_header_calls_llama_cpps_buffers_buffers() -> None:
    model = ServedModel("m", path="/m.gguf", plan={"total": 270 * MIB},
                        measured={"weights": 200 * MIB, "kv": 39 * MIB})
    assert model_picker.planned_vs_measured(model) == "planned 270 MiB · buffers 239 MiB"


def test_drafting_off_is_a_short_line_with_the_reason_as_tooltip(qtbot) -> None:
    live = LivePanels(LIGHT)
    qtbot.addWidget(live)
    live.on_model(NGRAM)
    reason = ("speculation off: at α 0.62 per draft position and a draft step costing 0.00× "
              "a target step, no draft length beats plain decoding; trying again in 64 steps")
    live.on_metrics(replace(snapshot(), acceptance_rate=0.77, active_sequences=1,
                            drafting_off_reason=reason))
    state = live.speculative.values["state"]
    assert state.text() == "Off: drafting would be slower than plain decoding here"
    assert state.toolTip() == reason


def test_a_measured_slowdown_comes_with_advice(qtbot) -> None:
    live = LivePanels(LIGHT)
    qtbot.addWidget(live)
    live.on_model(NGRAM)
    live.on_busy(True)
    live.on_step(StepStats("r", 0, drafted=4, accepted=1, reply_drafted=4, reply_accepted=1,
                           k=4, acceptance_rate=0.25, mean_accepted_length=1.0,
                           predicted_speedup=1.1, measured_speedup=0.7))
    live.on_busy(False)
    text = live.speculative.values["speedup"].text()
    assert "measured 0.70×" in text
    assert "turn it off or pick a smaller draft" in text


# -- item 7: after Unload ---------------------------------------------------------------------

def test_after_unload_send_is_disabled_with_a_reason_and_the_picker_forgets(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    composer, picker = window.chat.composer, window.picker
    assert composer.send_button.isEnabled()
    qtbot.mouseClick(picker.unload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.client.state == EngineState.NO_MODEL)

    assert not composer.send_button.isEnabled()
    assert "No model is loaded" in composer.send_button.toolTip()
    assert "No model is loaded" in composer.input.placeholderText()
    assert picker.selected() is None and picker.combo.currentIndex() == -1
    assert picker.status.text() == model_picker.UNLOADED  # not the old plan
    assert not picker.load_button.isEnabled()  # nothing chosen yet

    composer.set_text("hello?")
    with qtbot.waitSignal(composer.send_refused, timeout=1_000):
        qtbot.keyClick(composer.input, Qt.Key.Key_Return)
    assert composer.text == "hello?"  # kept for when a model is loaded
    assert window.controller.path() == [] or window.controller.path()[-1].role != "user"


# -- item 10: chat details --------------------------------------------------------------------

def test_the_first_replys_ttft_shows_while_it_is_written(qtbot, make_window: WindowFactory,
                                                         tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    window = make_window(fake_command(gate_file=gate))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    load(qtbot, window, model)
    window.ensure_panels()
    assert window.panels is not None
    ttft = window.panels.speed.values["ttft"]
    assert ttft.text() == "–"
    window.chat.composer.set_text("[[gate]] hello")
    with qtbot.waitSignal(window.controller.first_token, timeout=ENGINE_TIMEOUT_MS):
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    assert window.controller.busy  # still being written (held at the gate)
    assert ttft.text().endswith("ms") or ttft.text().endswith(" s")
    with qtbot.waitSignal(window.controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        gate.touch()


def test_a_reply_stopped_before_its_first_token_says_so(qtbot) -> None:
    message = Message(2, 1, 1, "assistant", "", 0.0, status="stopped", stats={"tokens": 0})
    card = MessageCard(message, MarkdownRenderer(LIGHT))
    qtbot.addWidget(card)
    card.refresh(busy=False)
    assert card.footer.text() == STOPPED_EARLY  # not "Stopped · 0 tokens"


def test_shift_enter_line_breaks_stay_in_the_shown_message(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.controller.new_conversation()
    window.chat.composer.input.setFocus()
    qtbot.keyClicks(window.chat.composer.input, "line one")
    qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.chat.composer.input, "line two")
    with qtbot.waitSignal(window.controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Return)
    user = window.controller.path()[0]
    assert user.content == "line one\nline two"
    window.chat.transcript.flush()
    shown = window.chat.transcript.card(user.id).plain_text()
    assert shown.strip().splitlines() == ["line one", "line two"]


def test_the_title_is_cut_at_a_word_and_follows_an_edit(qtbot, fake_window: MainWindow) -> None:
    window, controller = fake_window, fake_window.controller
    controller.new_conversation()
    send(qtbot, window, "How do I reverse a list in Python without copying it?\nThanks")
    assert controller.conversation.title == "How do I reverse a list in Python…"
    assert window.chat.title.text() == "How do I reverse a list in Python…"
    user = controller.path()[0]
    with qtbot.waitSignal(controller.reply_finished, timeout=ENGINE_TIMEOUT_MS):
        controller.edit_and_resend(user.id, "Sort a dict by value")
    assert controller.conversation.title == "Sort a dict by value"
    assert controller.store.conversation(controller.conversation.id).title == "Sort a dict by value"


def test_the_app_opens_on_the_last_conversation(qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    store = window.controller.store
    store.create_conversation(title="older")
    latest = store.create_conversation(title="latest")
    window.close()
    again = make_window(fake_command())
    assert again.controller.conversation is not None
    assert again.controller.conversation.id == latest.id
    assert again.chat.title.text() == "latest"


def test_one_source_of_sampling_defaults(qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    assert SamplingParams() == DEFAULT_SAMPLING  # the runtime's, as Settings → Model shows
    window.controller.new_conversation()
    drawer = window.chat.settings
    assert drawer.temperature.value() == SamplingParams().temperature
    assert drawer.max_tokens.value() == SamplingParams().max_tokens


def test_tab_moves_the_focus_out_of_the_composer(qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    box = window.chat.composer.input
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    qtbot.keyClicks(box, "hi")
    qtbot.keyClick(box, Qt.Key.Key_Tab)
    assert box.toPlainText() == "hi"
    assert not box.hasFocus()
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
    assert box.toPlainText() == "hi\t"  # Ctrl+Tab types one


def test_the_draft_tokens_toggle_is_remembered(qtbot, make_window: WindowFactory) -> None:
    window = make_window(fake_command())
    assert not window.chat.drafts_button.isChecked()
    window.chat.drafts_button.click()
    assert window.settings.settings.highlight_drafts
    window.close()  # writes the settings
    again = make_window(fake_command())
    assert again.chat.drafts_button.isChecked()
    assert again.chat.transcript.highlight_drafts
