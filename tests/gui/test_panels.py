"""The live panels' y axes: from 0 up to a fixed minimum while there is no data or every value is
0 (never pyqtgraph's ±0.4 around zero), and up to a round number above the data otherwise."""

from __future__ import annotations

import pytest

from app.panels.base import Panel
from app.panels.memory import MIN_TOP_MIB, MemoryPanel
from app.panels.speculative import SpeculativePanel
from app.panels.speed import MIN_TOP, SpeedPanel
from app.theme import LIGHT
from app.wire import DeviceMemory, MetricsSnapshot

MIB = 1 << 20
T0 = 1_000.0


def y_range(plot) -> list[float]:
    """The y range as drawn: grabbing paints the plot, which is when pyqtgraph applies any
    pending auto-range."""
    plot.grab()
    return plot.getViewBox().viewRange()[1]


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
    assert y_range(panels["speed"].plot) == [0, MIN_TOP]
    assert y_range(panels["memory"].plot) == [0, MIN_TOP_MIB]
    assert y_range(panels["memory"].chart) == [0, MIN_TOP_MIB]
    assert y_range(panels["speculative"].plot) == [0, 100]


def test_all_zero_samples_keep_the_fixed_range(panels: dict[str, Panel]) -> None:
    for i in range(5):
        snapshot = idle(T0 + i, acceptance_rate=0.0)
        for panel in panels.values():
            panel.update_metrics(snapshot)  # type: ignore[attr-defined]
    assert panels["speed"].curves["decode"].getData()[1].tolist() == [0.0] * 5
    assert y_range(panels["speed"].plot) == [0, MIN_TOP]
    assert y_range(panels["memory"].plot) == [0, MIN_TOP_MIB]
    assert y_range(panels["memory"].chart) == [0, MIN_TOP_MIB]
    assert y_range(panels["speculative"].plot) == [0, 100]


def test_the_axis_grows_to_a_round_number_above_the_data(panels: dict[str, Panel]) -> None:
    speed, memory = panels["speed"], panels["memory"]
    speed.update_metrics(idle(T0, decode_tokens_per_s=37.2, prefill_tokens_per_s=3.0))
    assert y_range(speed.plot) == [0, 40]
    gpu = DeviceMemory("cuda:0", "GPU", "cuda", total_bytes=8000 * MIB, free_bytes=7000 * MIB,
                       planned_weights=300 * MIB, planned_kv=100 * MIB)
    memory.update_metrics(MetricsSnapshot(time=T0, devices=(gpu,), engine_rss_bytes=450 * MIB))
    assert y_range(memory.plot) == [0, 1200]  # the GPU's 1,000 MiB used
    assert y_range(memory.chart) == [0, 1200]
    panels["speculative"].update_metrics(idle(T0, acceptance_rate=1.0))
    assert y_range(panels["speculative"].plot) == [0, 100]


def test_a_peak_that_scrolled_out_of_view_no_longer_sets_the_scale(
        panels: dict[str, Panel]) -> None:
    speed = panels["speed"]
    speed.update_metrics(idle(T0, decode_tokens_per_s=900.0))
    assert y_range(speed.plot) == [0, 1000]
    for t in range(1, 200):  # idle for longer than the plot's two minutes
        speed.update_metrics(idle(T0 + t))
    assert y_range(speed.plot) == [0, MIN_TOP]
