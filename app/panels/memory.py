"""Memory panel: per device, planned weights / KV cache / compute / other stacked beside what
is used, and a time plot of used memory. "Other" is what the planner adds outside llama.cpp's
buffers (vocabulary tables, the CUDA runtime), so the stack adds up to the plan's total — the
figure the model picker shows.

The bars' "used" is the engine process's resident memory on the CPU (the part of RAM that is
ours) and the device's used memory on a GPU (NVML cannot attribute it to a process
everywhere). On Apple silicon the GPU shares RAM, so the CPU bar holds both. The value rows
name the process's figure as the whole window does (`app.services.memory_terms`): "Engine
RAM", the status bar's figure, the same number (a GPU's used memory is in its bar and the
chart's tooltip).
"""

from __future__ import annotations

import pyqtgraph as pg

from app.engine.wire import DeviceMemory, MetricsSnapshot
from app.panels.base import (
    PLOT_HEIGHT,
    Panel,
    legend_html,
    legend_label,
    pin_y_range,
    style_axes,
)
from app.qt import QtWidgets
from app.services.memory_terms import ENGINE_RAM, ENGINE_RAM_TIP, PLANNED_TIP
from app.theme import Palette
from runtime.units import MIB, fmt_bytes

BAR = 0.32
MIN_TOP_MIB = 100.0  # both plots show at least 0 … 100 MiB (before the first snapshot)


def used_bytes(device: DeviceMemory, snapshot: MetricsSnapshot) -> int:
    return snapshot.engine_rss_bytes if device.kind == "cpu" else device.used_bytes


class MemoryPanel(Panel):
    """Attributes:
        bars: pyqtgraph BarGraphItems: "weights", "kv", "compute", "other" (planned) and
        "used".
    """

    def __init__(self, palette: Palette, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Memory", palette, MIN_TOP_MIB, parent)
        self.add_value("planned", "Planned")
        self.add_value("used", ENGINE_RAM)
        self.add_value("kv_cells", "KV cells", wide=True)  # "131,072 / 131,072" needs the row
        self.add_value("free", "Free", wide=True)
        self.chart = pg.PlotWidget(background=palette.surface)
        self.chart.setFixedHeight(PLOT_HEIGHT)
        self.chart.setMenuEnabled(False)
        self.chart.setMouseEnabled(x=False, y=False)
        self.chart.hideButtons()
        self.chart.setLabel("left", "MiB")
        self.chart.getAxis("bottom").setTicks([[]])  # device names, once a snapshot lists them
        self.chart.setXRange(-0.6, 0.6, padding=0)
        pin_y_range(self.chart, 0.0, MIN_TOP_MIB)
        style_axes(self.chart, palette)
        colors = {"weights": palette.plot[0], "kv": palette.plot[1], "compute": palette.plot[3],
                  "other": palette.muted, "used": palette.plot[2]}
        names = {"weights": "weights", "kv": "KV", "compute": "compute", "other": "other",
                 "used": "used"}
        self.bars: dict[str, pg.BarGraphItem] = {}
        for key, color in colors.items():
            item = pg.BarGraphItem(x=[], height=[], width=BAR, brush=color, pen=None)
            self.chart.addItem(item)
            self.bars[key] = item
        # Above the chart, as the time plot's: pyqtgraph's legend would cover the bars.
        self.bar_legend = legend_label(legend_html(
            ((colors[key], names[key]) for key in colors), mark="■"))
        self._layout.addWidget(self.bar_legend)
        self._layout.addWidget(self.chart)
        self.plot.setLabel("left", "MiB")
        self.add_curve("rss", "engine RAM", 2)
        self.finish_layout()
        self._gpu_keys: list[str] = []
        # What each figure counts, on its name (the value's own tooltip is its whole text).
        for key, tip in (("planned", PLANNED_TIP), ("used", ENGINE_RAM_TIP)):
            self._name_of(key).setToolTip(tip)

    def plots(self) -> list[pg.PlotWidget]:
        return [self.chart, self.plot]

    def update_metrics(self, snapshot: MetricsSnapshot) -> None:
        devices = snapshot.devices
        xs = list(range(len(devices)))
        planned_x = [x - BAR / 2 - 0.02 for x in xs]
        weights = [d.planned_weights / MIB for d in devices]
        kv = [d.planned_kv / MIB for d in devices]
        compute = [d.planned_compute / MIB for d in devices]
        other = [d.planned_other / MIB for d in devices]
        used_mib = [used_bytes(d, snapshot) / MIB for d in devices]
        self.bars["weights"].setOpts(x=planned_x, height=weights, y0=[0] * len(xs))
        self.bars["kv"].setOpts(x=planned_x, height=kv, y0=weights)
        below_compute = [w + k for w, k in zip(weights, kv, strict=True)]
        self.bars["compute"].setOpts(x=planned_x, height=compute, y0=below_compute)
        self.bars["other"].setOpts(x=planned_x, height=other,
                                   y0=[b + c for b, c in zip(below_compute, compute, strict=True)])
        self.bars["used"].setOpts(x=[x + BAR / 2 + 0.02 for x in xs], height=used_mib,
                                  y0=[0] * len(xs))
        self.chart.getAxis("bottom").setTicks([[(x, _short(d.name)) for x, d in zip(xs, devices, strict=True)]])
        # The whole device names (the axis shortens them), with what each bar shows.
        self.chart.getPlotItem().setToolTip("\n".join(
            f"{d.name}: planned {fmt_bytes(d.planned_bytes)}, used {fmt_bytes(used_bytes(d, snapshot))}"
            for d in devices))
        self.chart.setXRange(-0.6, max(0.6, len(xs) - 0.4), padding=0)
        planned_mib = [d.planned_bytes / MIB for d in devices]
        pin_y_range(self.chart, max(used_mib + planned_mib, default=0.0), MIN_TOP_MIB)

        planned = sum(d.planned_bytes for d in devices)
        self.set_value("planned", fmt_bytes(planned) if planned else "no model")
        self.set_value("used", fmt_bytes(snapshot.engine_rss_bytes))  # the status bar's figure
        self.set_value("free", " · ".join(f"{d.id} {fmt_bytes(d.free_bytes)}" for d in devices) or "–")
        cells = f"{snapshot.kv_cells_used:,} / {snapshot.kv_cells_total:,}" \
            if snapshot.kv_cells_total else "–"
        self.set_value("kv_cells", cells)

        self.record("rss", snapshot.time, snapshot.engine_rss_bytes / MIB)
        for device in devices:
            if device.kind == "cpu":
                continue
            key = f"gpu:{device.id}"
            if key not in self.curves:
                self.add_curve(key, device.name, 1 + len(self._gpu_keys))
                self._gpu_keys.append(key)
            self.record(key, snapshot.time, device.used_bytes / MIB)
        self.redraw(snapshot.time)


    def _name_of(self, key: str) -> QtWidgets.QWidget:
        """The name label left of a value."""
        position: tuple[int, int, int, int] = self._grid.getItemPosition(  # type: ignore[assignment]
            self._grid.indexOf(self.values[key]))
        item = self._grid.itemAtPosition(position[0], position[1] - 1)
        widget = item.widget() if item is not None else None
        if widget is None:
            raise LookupError(f"no name beside {key}")
        return widget


def _short(name: str) -> str:
    return name if len(name) <= 18 else name[:17] + "…"
