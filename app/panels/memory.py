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

Another machine's device (a worker's, `outrider worker`; `remote` in the snapshot) stands
first, beside this machine's, with its planned stack and no "used" bar: it serves this engine
alone while the model is loaded, so its memory is as it said at the load ("free as of load",
under the chart), and no curve. Under the chart too, the network the split costs per
generated token, from the loaded model's plan (`set_plan`).
"""

from __future__ import annotations

from typing import Any

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
from app.qt import Qt, QtWidgets
from app.services.memory_terms import (
    AS_OF_LOAD,
    AS_OF_LOAD_TIP,
    ENGINE_RAM,
    ENGINE_RAM_TIP,
    PLANNED_TIP,
    network_text,
)
from app.theme import Palette
from runtime.units import MIB, fmt_bytes

BAR = 0.32
MIN_TOP_MIB = 100.0  # both plots show at least 0 … 100 MiB (before the first snapshot)


def used_bytes(device: DeviceMemory, snapshot: MetricsSnapshot) -> int:
    """The "used" bar: the engine's RSS on this CPU, a GPU's used memory, nothing for a
    worker's device (not measured while it serves)."""
    if device.remote:
        return 0
    return snapshot.engine_rss_bytes if device.kind == "cpu" else device.used_bytes


def remote_text(devices: tuple[DeviceMemory, ...] | list[DeviceMemory]) -> str:
    """What the panel says of the workers' devices, one line each.

        >>> remote_text([DeviceMemory("rpc:10.0.0.2:50052", "worker 10.0.0.2:50052", "rpc",
        ...                           8 << 30, 6 << 30, remote=True, as_of="load")])
        'worker 10.0.0.2:50052: 6.00 GiB free as of load'
    """
    return "\n".join(f"{d.name}: {fmt_bytes(d.free_bytes)} {AS_OF_LOAD}"
                     for d in devices if d.remote)


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
        # The workers' devices and the network the split costs (hidden without workers).
        self.remote_note = legend_label()
        self.remote_note.setTextFormat(Qt.TextFormat.PlainText)
        self.remote_note.setToolTip(AS_OF_LOAD_TIP)
        self.remote_note.hide()
        self._layout.addWidget(self.remote_note)
        self._network = ""
        self._remote = ""
        self.plot.setLabel("left", "MiB")
        self.add_curve("rss", "engine RAM", 2)
        self.finish_layout()
        self._gpu_keys: list[str] = []
        # What each figure counts, on its name (the value's own tooltip is its whole text).
        for key, tip in (("planned", PLANNED_TIP), ("used", ENGINE_RAM_TIP)):
            self._name_of(key).setToolTip(tip)

    def plots(self) -> list[pg.PlotWidget]:
        return [self.chart, self.plot]

    def set_plan(self, plan: dict[str, Any] | None) -> None:
        """The loaded model's plan (`ServedModel.plan`; None: none loaded): its links."""
        links = (plan or {}).get("links")
        self._network = network_text(links if isinstance(links, list) else [])
        self._show_remote()

    def _show_remote(self) -> None:
        text = "\n".join(t for t in (self._network, self._remote) if t)
        self.remote_note.setText(text)
        self.remote_note.setVisible(bool(text))

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
        self.chart.getAxis("bottom").setTicks([[(x, _tick(d)) for x, d in zip(xs, devices, strict=True)]])
        # The whole device names (the axis shortens them), with what each bar shows.
        self.chart.getPlotItem().setToolTip("\n".join(
            f"{d.name}: planned {fmt_bytes(d.planned_bytes)}, "
            + (f"{fmt_bytes(d.free_bytes)} {AS_OF_LOAD}" if d.remote
               else f"used {fmt_bytes(used_bytes(d, snapshot))}")
            for d in devices))
        self.chart.setXRange(-0.6, max(0.6, len(xs) - 0.4), padding=0)
        planned_mib = [d.planned_bytes / MIB for d in devices]
        pin_y_range(self.chart, max(used_mib + planned_mib, default=0.0), MIN_TOP_MIB)

        planned = sum(d.planned_bytes for d in devices)
        self.set_value("planned", fmt_bytes(planned) if planned else "no model")
        self.set_value("used", fmt_bytes(snapshot.engine_rss_bytes))  # the status bar's figure
        self.set_value("free", " · ".join(
            f"{d.id} {fmt_bytes(d.free_bytes)}" + (" at load" if d.remote else "")
            for d in devices) or "–")
        self._remote = remote_text(devices)
        self._show_remote()
        cells = f"{snapshot.kv_cells_used:,} / {snapshot.kv_cells_total:,}" \
            if snapshot.kv_cells_total else "–"
        self.set_value("kv_cells", cells)

        self.record("rss", snapshot.time, snapshot.engine_rss_bytes / MIB)
        for device in devices:
            if device.kind == "cpu" or device.remote:  # a worker's is not measured live
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


def _tick(device: DeviceMemory) -> str:
    """A bar's name on the axis: a worker's by its address ("10.0.0.2:50052"), which its
    name "worker 10.0.0.2:50052" would lose to the shortening."""
    return _short(device.name.removeprefix("worker ") if device.remote else device.name)


def _short(name: str) -> str:
    return name if len(name) <= 18 else name[:17] + "…"
