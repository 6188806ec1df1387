"""The live panels.

Their y axes: from 0 up to a fixed minimum while there is no data or every value is 0 (never
pyqtgraph's ±0.4 around zero), up to a round number above the data otherwise, and with room
above the top tick for its label. Their values: whole, on one line, at the dock's default
width, with the full text as tooltip."""

from __future__ import annotations

import doctest

import pytest

from app.panels import speed as speed_module
from app.panels.base import Panel
from app.panels.dock import LivePanels
from app.panels.memory import MIN_TOP_MIB, MemoryPanel
from app.panels.speculative import SpeculativePanel
from app.panels.speed import MIN_TOP, SpeedPanel
from app.qt import QtCore, QtGui, QtWidgets
from app.theme import DARK, LIGHT, style_sheet
from app.wire import DeviceMemory, MetricsSnapshot, ModelInfo
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
    made.on_model(ModelInfo("model", draft="ngram"))
    made.on_metrics(busy_snapshot(T0))
    made.on_busy(True)
    for i in range(3):
        made.on_step(StepStats("r", i, drafted=11_728, accepted=6_172, k=16,
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
    assert chart.getPlotItem().toolTip() == f"{XEON}: planned 9,999 MiB, used 9,876 MiB"


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
    assert doctest.testmod(speed_module).failed == 0


def test_axis_titles_are_in_the_muted_text_colour_in_either_theme(dock: LivePanels) -> None:
    for palette in (LIGHT, DARK):
        dock.set_palette(palette)
        for panel in (dock.memory, dock.speed, dock.speculative):
            for plot in panel.plots():
                for side in ("left", "bottom"):
                    title = plot.getAxis(side).labelString()
                    assert f"color: {palette.muted}" in title, (panel, side, title)
    assert dock.speed.plot.getAxis("left").labelText == "tok/s"  # the titles themselves stay
