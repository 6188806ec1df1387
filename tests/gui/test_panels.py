"""The live panels.

Their y axes: from 0 up to a fixed minimum while there is no data or every value is 0 (never
pyqtgraph's ±0.4 around zero), up to a round number above the data otherwise, and with room
above the top tick for its label. Their values: whole, on one line, at the dock's default
width, with the full text as tooltip."""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest

from app.engine.wire import DeviceMemory, MetricsSnapshot, ServedModel
from app.panels import base as base_module
from app.panels import speculative as speculative_module
from app.panels import speed as speed_module
from app.panels.base import Panel
from app.panels.dock import LivePanels
from app.panels.memory import MIN_TOP_MIB, MemoryPanel
from app.panels.speculative import SpeculativePanel
from app.panels.speed import MIN_TOP, SpeedPanel
from app.qt import QtCore, QtGui, QtWidgets
from app.theme import DARK, LIGHT, style_sheet
from runtime.events import StepStats

MIB = 1 << 20
T0 = 1_000.0


def y_range(plot) -> list[float]:
    """The y range as drawn: grabbing paints the plot, which is when pyqtgraph applies any
    pending auto-range."""
    plot.grab()
    return plot.getViewBox().viewRange()[1]


def axis_labels(plot, side: str = "left") -> list[tuple[str, QtCore.QRect]]:
    """The tick labels pyqtgraph draws on one axis (it leaves out those that would not fit),
    each with its rectangle in the plot widget's pixels."""
    plot.grab()
    axis = plot.getAxis(side)
    picture = QtGui.QPicture()
    painter = QtGui.QPainter(picture)  # as AxisItem.paint does: the same font, so the same rects
    try:
        _line, _ticks, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(text, plot.mapFromScene(axis.mapRectToScene(rect)).boundingRect())
            for rect, _flags, text in texts]


def y_axis(plot) -> tuple[float, float]:
    """(bottom of the view, value of the highest tick label drawn)."""
    top_label, _rect = min(axis_labels(plot), key=lambda label: label[1].top())
    return y_range(plot)[0], float(top_label.replace(",", ""))


def idle(t: float, **values: object) -> MetricsSnapshot:
    """A snapshot of an engine with nothing loaded: every rate and byte count 0."""
    cpu = DeviceMemory("cpu", "CPU", "cpu", total_bytes=0, free_bytes=0)
    return MetricsSnapshot(time=t, devices=(cpu,), **values)  # type: ignore[arg-type]


@pytest.fixture
def panels(qtbot) -> dict[str, Panel]:
    made = {"speed": SpeedPanel(LIGHT), "memory": MemoryPanel(LIGHT),
            "speculative": SpeculativePanel(LIGHT)}
    for panel in made.values():
        qtbot.addWidget(panel)
        panel.show()
    return made


def test_without_samples_every_axis_starts_at_zero(panels: dict[str, Panel]) -> None:
    assert y_axis(panels["speed"].plot) == (0, MIN_TOP)
    assert y_axis(panels["memory"].plot) == (0, MIN_TOP_MIB)
    assert y_axis(panels["memory"].chart) == (0, MIN_TOP_MIB)
    assert y_axis(panels["speculative"].plot) == (0, 100)


def test_all_zero_samples_keep_the_fixed_range(panels: dict[str, Panel]) -> None:
    for i in range(5):
        snapshot = idle(T0 + i, acceptance_rate=0.0)
        for panel in panels.values():
            panel.update_metrics(snapshot)  # type: ignore[attr-defined]
    assert panels["speed"].curves["decode"].getData()[1].tolist() == [0.0] * 5
    assert y_axis(panels["speed"].plot) == (0, MIN_TOP)
    assert y_axis(panels["memory"].plot) == (0, MIN_TOP_MIB)
    assert y_axis(panels["memory"].chart) == (0, MIN_TOP_MIB)
    assert y_axis(panels["speculative"].plot) == (0, 100)


def test_the_axis_grows_to_a_round_number_above_the_data(panels: dict[str, Panel]) -> None:
    speed, memory = panels["speed"], panels["memory"]
    speed.update_metrics(idle(T0, decode_tokens_per_s=37.2, prefill_tokens_per_s=3.0))
    assert y_axis(speed.plot) == (0, 40)
    gpu = DeviceMemory("cuda:0", "GPU", "cuda", total_bytes=8000 * MIB, free_bytes=7000 * MIB,
                       planned_weights=300 * MIB, planned_kv=100 * MIB)
    memory.update_metrics(MetricsSnapshot(time=T0, devices=(gpu,), engine_rss_bytes=450 * MIB))
    assert y_axis(memory.plot) == (0, 1200)  # the GPU's 1,000 MiB used
    assert y_axis(memory.chart) == (0, 1200)
    panels["speculative"].update_metrics(idle(T0, acceptance_rate=1.0))
    assert y_axis(panels["speculative"].plot) == (0, 100)


def test_a_peak_that_scrolled_out_of_view_no_longer_sets_the_scale(
        panels: dict[str, Panel]) -> None:
    speed = panels["speed"]
    speed.update_metrics(idle(T0, decode_tokens_per_s=900.0))
    assert y_axis(speed.plot) == (0, 1000)
    for t in range(1, 200):  # idle for longer than the plot's two minutes
        speed.update_metrics(idle(T0 + t))
    assert y_axis(speed.plot) == (0, MIN_TOP)


# -- readable at the dock's default width ----------------------------------------------------

DOCK_WIDTH = 380  # what MainWindow.ensure_panels gives the dock
WRAPPING = {"free", "state"}  # a list of devices, a sentence: these may take two lines
XEON = "Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz"


def busy_snapshot(t: float) -> MetricsSnapshot:
    """Long values: five-digit prefill rates, a full 128K context, a long CPU name."""
    cpu = DeviceMemory("cpu", XEON, "cpu", total_bytes=64 << 30, free_bytes=40 << 30,
                       planned_weights=7000 * MIB, planned_kv=2000 * MIB,
                       planned_compute=999 * MIB)
    return MetricsSnapshot(time=t, devices=(cpu,), engine_rss_bytes=9876 * MIB,
                           decode_tokens_per_s=1234.5, prefill_tokens_per_s=12345.6,
                           acceptance_rate=0.87, mean_accepted_length=3.42, draft_k=16,
                           kv_cells_used=131_072, kv_cells_total=131_072,
                           active_sequences=12, waiting_sequences=34)


@pytest.fixture
def dock(qtbot) -> LivePanels:
    """The live panels at the dock's default width, styled as in the app, and short enough
    that the scroll bar takes its share of the width; every value set, long."""
    made = LivePanels(LIGHT)
    made.setStyleSheet(style_sheet(LIGHT))
    qtbot.addWidget(made)
    made.resize(DOCK_WIDTH, 500)
    made.show()
    qtbot.waitExposed(made)
    made.on_model(ServedModel("model", draft="ngram"))
    made.on_metrics(busy_snapshot(T0))
    made.on_busy(True)
    for i in range(3):
        made.on_step(StepStats("r", i, drafted=11_728, accepted=6_172,
                               reply_drafted=11_728 * (i + 1), reply_accepted=6_172 * (i + 1), k=16,
                               acceptance_rate=0.53, mean_accepted_length=3.42,
                               predicted_speedup=2.85, measured_speedup=2.41))
    made.on_busy(False)  # shows the last round now
    made.speed.update_reply({"ttft_s": 12.34})
    return made


def test_every_value_is_shown_whole_with_its_tooltip(dock: LivePanels) -> None:
    assert dock.widget().verticalScrollBar().isVisible()
    for panel in (dock.memory, dock.speed, dock.speculative):
        for key, label in panel.values.items():
            full = label.text()
            assert full != "–", f"{key} was never set"
            assert QtWidgets.QLabel.text(label) == full, f"{key} elided: {full!r}"
            if key not in WRAPPING:
                assert label.fontMetrics().horizontalAdvance(full) <= label.width(), \
                    f"{key} needs {label.fontMetrics().horizontalAdvance(full)} px, " \
                    f"has {label.width()}: {full!r}"
            assert label.toolTip() == full, key
    assert dock.speculative.values["counts"].text() == "18,516 / 35,184 drafted"
    assert dock.speculative.values["speedup"].text() == "predicted 2.85× · measured 2.41×"
    assert dock.speed.values["prefill"].text() == "12,346 tok/s"
    assert dock.memory.values["kv_cells"].text() == "131,072 / 131,072"


def test_the_bar_chart_names_its_devices_in_full_on_hover(dock: LivePanels) -> None:
    chart = dock.memory.chart
    [(shown, _rect)] = axis_labels(chart, "bottom")
    assert shown.endswith("…") and XEON.startswith(shown[:-1])
    assert chart.getPlotItem().toolTip() == f"{XEON}: planned 9.76 GiB, used 9.64 GiB"


def test_the_planned_stack_adds_up_to_the_plans_total(panels: dict[str, Panel]) -> None:
    """Weights, KV, compute and the planner's "other" (vocabulary tables here) stack to the
    total the model picker shows as "planned"."""
    memory = panels["memory"]
    cpu = DeviceMemory("cpu", "CPU", "cpu", total_bytes=8 << 30, free_bytes=6 << 30,
                       planned_weights=92 * MIB, planned_kv=40 * MIB, planned_compute=104 * MIB,
                       planned_other=17 * MIB)
    memory.update_metrics(MetricsSnapshot(time=T0, devices=(cpu,), engine_rss_bytes=254 * MIB))
    assert memory.values["planned"].text() == "253 MiB"
    other = memory.bars["other"].opts
    assert (list(other["y0"]), list(other["height"])) == ([236.0], [17.0])  # on top of compute
    assert "other" in memory.bar_legend.text()


def test_the_top_tick_label_is_drawn_inside_every_plot(dock: LivePanels) -> None:
    plots = {"memory chart": dock.memory.chart, "memory": dock.memory.plot,
             "speed": dock.speed.plot, "speculative": dock.speculative.plot}
    tops = {"memory chart": 12_000, "memory": 12_000, "speed": 15_000, "speculative": 100}
    for name, plot in plots.items():
        bottom, top = y_axis(plot)
        assert (bottom, top) == (0, tops[name]), name
        assert y_range(plot)[1] > top, name  # headroom above the highest tick …
        [rect] = [r for text, r in axis_labels(plot) if float(text.replace(",", "")) == top]
        assert plot.rect().contains(rect), f"{name}: {rect} outside {plot.rect()}"  # … its label


def test_docstring_examples() -> None:
    for module in (base_module, speed_module, speculative_module):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_axis_titles_are_in_the_muted_text_colour_in_either_theme(dock: LivePanels) -> None:
    for palette in (LIGHT, DARK):
        dock.set_palette(palette)
        for panel in (dock.memory, dock.speed, dock.speculative):
            for plot in panel.plots():
                for side in ("left", "bottom"):
                    title = plot.getAxis(side).labelString()
                    assert f"color: {palette.muted}" in title, (panel, side, title)
    assert dock.speed.plot.getAxis("left").labelText == "tok/s"  # the titles themselves stay


# -- legends: above their plots, never over the curves ---------------------------------------

def test_every_legend_sits_above_its_plot(dock: LivePanels) -> None:
    memory, speed, speculative = dock.memory, dock.speed, dock.speculative
    legends = [(memory.bar_legend, memory.chart, ["weights", "KV", "compute", "other", "used"]),
               (memory.legend, memory.plot, ["engine RAM"]),
               (speed.legend, speed.plot, ["decode", "prefill"]),
               (speculative.legend, speculative.plot, ["acceptance"])]
    for legend, plot, names in legends:
        assert plot.getPlotItem().legend is None  # nothing drawn inside the view box …
        assert legend.isVisible() and legend.parent() is plot.parent()
        assert legend.geometry().bottom() < plot.geometry().top()  # … the names sit above it
        assert all(name in legend.text() for name in names), legend.text()
    for panel in (memory, speed, speculative):  # each curve's mark in the curve's colour
        for curve in panel.curves.values():
            mark = f"color:{curve.opts['pen'].color().name()};'>━━</span>&nbsp;{curve.name()}"
            assert mark in panel.legend.text()


def test_a_gpu_curve_joins_the_legend(panels: dict[str, Panel]) -> None:
    memory = panels["memory"]
    gpu = DeviceMemory("cuda:0", "NVIDIA H200", "cuda", total_bytes=140 << 30,
                       free_bytes=100 << 30)
    memory.update_metrics(MetricsSnapshot(time=T0, devices=(gpu,)))
    assert "engine RAM" in memory.legend.text() and "NVIDIA H200" in memory.legend.text()


def test_legends_are_in_the_muted_text_colour_in_either_theme(dock: LivePanels) -> None:
    for palette in (LIGHT, DARK):
        dock.setStyleSheet(style_sheet(palette))
        dock.set_palette(palette)
        for legend in (dock.memory.bar_legend, dock.memory.legend, dock.speed.legend,
                       dock.speculative.legend):
            legend.ensurePolished()
            assert legend.palette().color(legend.foregroundRole()).name() == palette.muted


# -- the Drafting line: what is true of drafting now -----------------------------------------

NGRAM = ServedModel("model", path="/models/model.gguf", draft="ngram")
OFF = "speculation off: 9.0 tok/s with drafting is below 10.0 tok/s plain"


def a_round(i: int, **changes: object) -> StepStats:
    """Round i of a reply whose rounds each keep 2 of 4 drafts."""
    step = StepStats("r", i, drafted=4, accepted=2, reply_drafted=4 * (i + 1),
                     reply_accepted=2 * (i + 1), k=4, acceptance_rate=0.5,
                     mean_accepted_length=2.0, predicted_speedup=1.4, measured_speedup=1.2)
    return replace(step, **changes)  # type: ignore[arg-type]


@pytest.fixture
def live(qtbot) -> LivePanels:
    """The live panels just after n-gram drafting was loaded."""
    made = LivePanels(LIGHT)
    qtbot.addWidget(made)
    made.on_model(NGRAM)
    return made


def drafting(live: LivePanels) -> str:
    return live.speculative.values["state"].text()


def reply(live: LivePanels, *steps: StepStats) -> None:
    """A chat reply with these rounds, from start to end."""
    live.on_busy(True)
    for step in steps:
        live.on_step(step)
    live.on_busy(False)


def test_drafting_waits_for_the_first_round_of_a_load(live: LivePanels) -> None:
    waiting = "ngram: waiting for the first speculative round"
    assert drafting(live) == waiting
    live.on_metrics(idle(T0))  # no rounds in the engine's rolling window
    assert drafting(live) == waiting
    live.on_busy(True)  # writing, but no n-gram matched yet
    live.on_metrics(idle(T0 + 1, active_sequences=1))
    assert drafting(live) == waiting


def test_after_rounds_an_idle_engine_keeps_the_last_replys_numbers(live: LivePanels) -> None:
    reply(live, a_round(0), a_round(1))
    live.on_metrics(idle(T0, acceptance_rate=0.5))  # the rounds, still in the rolling window
    assert drafting(live) == "on (ngram) · idle"
    live.on_metrics(idle(T0 + 60))  # … and after they left it
    assert drafting(live) == "on (ngram) · idle"
    live.on_model(replace(NGRAM, measured={"rss_bytes": 1}))  # the same load, described again
    assert drafting(live) == "on (ngram) · idle"
    values = live.speculative.values
    assert values["counts"].text() == "4 / 8 drafted" and values["acceptance"].text() == "50%"
    live.on_metrics(idle(T0 + 61, acceptance_rate=0.5, active_sequences=1))  # a server client
    assert drafting(live) == "on (ngram)"


def test_drafting_off_says_why_while_the_sequence_runs(qtbot, live: LivePanels) -> None:
    live.on_busy(True)
    live.on_step(a_round(0))
    live.on_step(a_round(1, drafted=0, accepted=0, k=0, drafting_off_reason=OFF))
    # a short plain line, the engine's whole reason its tooltip (drawn by the step throttle)
    qtbot.waitUntil(lambda: drafting(live) == "Off: drafting was slower than plain decoding")
    assert live.speculative.values["state"].toolTip() == OFF
    live.on_metrics(idle(T0, acceptance_rate=0.5, active_sequences=1, drafting_off_reason=OFF))
    assert drafting(live) == "Off: drafting was slower than plain decoding"
    live.on_busy(False)  # each sequence is judged afresh: the next reply drafts again
    live.on_metrics(idle(T0 + 1, acceptance_rate=0.5))
    assert drafting(live) == "on (ngram) · idle"


def test_a_new_load_starts_over(live: LivePanels) -> None:
    reply(live, a_round(0))
    live.on_model(None)
    assert drafting(live).startswith("off — no drafter loaded")
    assert live.speculative.values["counts"].text() == "–"
    live.on_model(NGRAM)
    assert drafting(live) == "ngram: waiting for the first speculative round"
    live.on_model(ServedModel("model", draft_refused="the vocabularies differ"))
    assert drafting(live) == "off — draft refused: the vocabularies differ"
