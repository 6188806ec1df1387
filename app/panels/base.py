"""What the three live panels share: a titled card with a few value labels and a time plot.

Why pyqtgraph: it is made for live data in Qt — it draws with QPainter on a QGraphicsScene,
updating a curve is one `setData` call on numpy arrays (microseconds for a few hundred
points, no re-layout), it works with PySide6, and it is a pure-Python wheel. QtCharts would
also work but ships in PySide6's add-ons (a much larger wheel than the Essentials we depend
on) and re-lays out its scene on every series change, which costs more at 1 Hz × N series.
"""

from __future__ import annotations

import math

import pyqtgraph as pg

from app.panels.history import Series
from app.qt import Qt, QtWidgets
from app.theme import Palette
from app.widgets import ElidedLabel

MIB = 1 << 20
PLOT_HEIGHT = 118
WINDOW_S = 120  # the time plots show at most the last two minutes …
MIN_SPAN_S = 30  # … and at least half a minute
NICE_TOPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
HEADROOM = 1.05


def fmt_bytes(n: float) -> str:
    """Human bytes: MiB below 10 GiB, GiB above.

    >>> fmt_bytes(98 * MIB), fmt_bytes(24 * 1024 * MIB)
    ('98 MiB', '24.0 GiB')
    """
    return f"{n / MIB:,.0f} MiB" if n < 10 * 1024 * MIB else f"{n / (1024 * MIB):,.1f} GiB"


def axis_top(peak: float, minimum: float) -> float:
    """The top of a y axis that starts at 0: `minimum` while the data stay within it (no data,
    all zeros), else a round number a little above the peak. pyqtgraph's own auto-range would
    centre all-zero data on 0 (an axis from −0.5 to 0.5: negative rates) and follow every
    wobble.

    >>> axis_top(0.0, 10), axis_top(9.5, 10), axis_top(37.2, 10), axis_top(96.0, 10)
    (10, 10, 40.0, 120.0)
    >>> axis_top(1234.0, 100), axis_top(float("nan"), 100)
    (1500.0, 100)
    """
    if not (math.isfinite(peak) and peak > minimum):
        return minimum
    target = peak * HEADROOM
    scale = 10.0 ** math.floor(math.log10(target))
    nice = next(n for n in NICE_TOPS if n * scale >= target)
    return round(nice * scale, 9)


def pin_y_range(plot: pg.PlotWidget, peak: float, minimum: float) -> None:
    """Show 0 … `axis_top(peak, minimum)` on `plot`'s y axis (never below 0)."""
    plot.setYRange(0, axis_top(peak, minimum), padding=0)


class Panel(QtWidgets.QFrame):
    """A card: title, a grid of `label: value` pairs, and a time plot below.

    Attributes:
        plot: the pyqtgraph PlotWidget (x: seconds before now; y: from 0 up to at least
            `y_minimum`, more when the visible data need it).
        curves: name → PlotDataItem, one per series.
    """

    def __init__(self, title: str, palette: Palette, y_minimum: float,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("panel")
        self.palette_ = palette
        self.y_minimum = y_minimum
        self._layout = QtWidgets.QVBoxLayout(self)
        self._layout.setContentsMargins(12, 10, 12, 10)
        self._layout.setSpacing(6)
        heading = QtWidgets.QLabel(title)
        heading.setObjectName("panelTitle")
        self._layout.addWidget(heading)
        self._grid = QtWidgets.QGridLayout()
        self._grid.setHorizontalSpacing(12)
        self._grid.setVerticalSpacing(2)
        self._layout.addLayout(self._grid)
        self.values: dict[str, QtWidgets.QLabel] = {}
        self.plot = pg.PlotWidget(background=palette.surface)
        self.plot.setFixedHeight(PLOT_HEIGHT)
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.showGrid(x=False, y=True, alpha=0.15)
        self.plot.setLabel("bottom", "seconds ago")
        self.plot.setXRange(-MIN_SPAN_S, 0, padding=0.01)
        pin_y_range(self.plot, 0.0, y_minimum)
        # Legend in the top right corner (negative offset), where the newest samples are.
        legend = self.plot.addLegend(offset=(-4, 2), labelTextColor=palette.muted,
                                     labelTextSize="8pt", verSpacing=-6)
        legend.setColumnCount(2)
        for axis in ("left", "bottom"):
            self.plot.getAxis(axis).setTextPen(palette.muted)
            self.plot.getAxis(axis).setPen(palette.border)
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.series: dict[str, Series] = {}

    def add_value(self, key: str, label: str, wide: bool = False) -> QtWidgets.QLabel:
        """A `label: value` pair; two pairs per row, or a whole row (wrapped) when wide."""
        row = len(self.values)
        name = QtWidgets.QLabel(label)
        name.setObjectName("muted")
        value: QtWidgets.QLabel
        if wide:
            value = QtWidgets.QLabel("–")
            value.setWordWrap(True)
            line = self._grid.rowCount()
            self._grid.addWidget(name, line, 0, Qt.AlignmentFlag.AlignTop)
            self._grid.addWidget(value, line, 1, 1, 3)
        else:
            value = ElidedLabel("–")
            self._grid.addWidget(name, row // 2, (row % 2) * 2)
            self._grid.addWidget(value, row // 2, (row % 2) * 2 + 1)
        self._grid.setColumnStretch(1, 1)
        self._grid.setColumnStretch(3, 1)
        self.values[key] = value
        return value

    def add_curve(self, key: str, name: str, color_index: int) -> None:
        color = self.palette_.plot[color_index % len(self.palette_.plot)]
        self.curves[key] = self.plot.plot([], [], name=name, pen=pg.mkPen(color, width=2))
        self.series[key] = Series()

    def set_value(self, key: str, text: str) -> None:
        self.values[key].setText(text)

    def record(self, key: str, t: float, value: float) -> None:
        self.series[key].append(t, value)

    def redraw(self, now: float) -> None:
        oldest = now
        points: list[tuple[float, float]] = []
        for key, curve in self.curves.items():
            series = self.series[key]
            xs, ys = series.xs(now), series.ys()
            curve.setData(xs, ys)
            points += zip(xs, ys, strict=True)
            if xs:
                oldest = min(oldest, now + xs[0])
        span = min(WINDOW_S, max(MIN_SPAN_S, now - oldest))
        self.plot.setXRange(-span, 0, padding=0.01)
        pin_y_range(self.plot, max((y for x, y in points if x >= -span), default=0.0),
                    self.y_minimum)

    def set_palette(self, palette: Palette) -> None:
        """Re-colour for another theme (curves keep their series colours)."""
        self.palette_ = palette
        for plot in self.plots():
            plot.setBackground(palette.surface)
            for axis in ("left", "bottom"):
                plot.getAxis(axis).setTextPen(palette.muted)
                plot.getAxis(axis).setPen(palette.border)

    def plots(self) -> list[pg.PlotWidget]:
        return [self.plot]

    def finish_layout(self) -> None:
        self._layout.addWidget(self.plot)
