"""What the three live panels share: a titled card with a few value labels and a time plot.

Why pyqtgraph: it is made for live data in Qt — it draws with QPainter on a QGraphicsScene,
updating a curve is one `setData` call on numpy arrays (microseconds for a few hundred
points, no re-layout), it works with PySide6, and it is a pure-Python wheel. QtCharts would
also work but ships in PySide6's add-ons (a much larger wheel than the Essentials we depend
on) and re-lays out its scene on every series change, which costs more at 1 Hz × N series.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

import pyqtgraph as pg

from app.panels.history import Series
from app.qt import Qt, QtWidgets
from app.theme import Palette
from app.widgets import ElidedLabel

PLOT_HEIGHT = 118
WINDOW_S = 120  # the time plots show at most the last two minutes …
MIN_SPAN_S = 30  # … and at least half a minute
# A round axis top (times a power of ten) and the tick step that cuts it into two or three
# intervals: more labels would crowd a plot this short.
NICE_TOPS = ((1.0, 0.5), (1.2, 0.4), (1.5, 0.5), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0),
             (6.0, 2.0), (8.0, 4.0), (10.0, 5.0))
HEADROOM = 1.05  # the top tick sits at least 5 % above the data …
TOP_ROOM = 0.15  # … and the view reaches 15 % above the top tick, so that its label (drawn
#                  centred on the tick, half of it above) fits: ~10 px of a time plot's ~78,
#                  for half a label's ~7 (pyqtgraph drops a label that would stick out).


def legend_html(entries: Iterable[tuple[str, str]], mark: str = "━━") -> str:
    """A legend as rich text, for a label above a plot: each (colour, name) as a mark in the
    colour and the name in the label's own (muted) colour. Inside the plot, pyqtgraph's legend
    would sit over the curves: the top right holds the newest samples, and a flat line such
    as the engine's RAM runs the whole width near the top.

    >>> legend_html([("#3b6fd8", "decode"), ("#e07b39", "prefill")])
    "<span style='color:#3b6fd8;'>━━</span>&nbsp;decode&nbsp;&nbsp; <span style='color:#e07b39;'>━━</span>&nbsp;prefill"
    """
    return "&nbsp;&nbsp; ".join(f"<span style='color:{color};'>{mark}</span>&nbsp;{html.escape(name)}"
                                for color, name in entries)


def legend_label(text: str = "") -> QtWidgets.QLabel:
    """The label that holds a `legend_html` (muted, so readable in either theme; wrapping,
    should there be many GPUs)."""
    label = QtWidgets.QLabel(text)
    label.setObjectName("muted")
    label.setWordWrap(True)
    return label


def axis_ticks(peak: float, minimum: float) -> list[float]:
    """The ticks of a y axis that starts at 0; the last one is the axis top: `minimum` while
    the data stay within it (no data, all zeros), else a round number a little above the peak.
    pyqtgraph's own auto-range would centre all-zero data on 0 (an axis from −0.5 to 0.5:
    negative rates), follow every wobble, and could put a tick right at the plot's edge.

    >>> axis_ticks(0.0, 10), axis_ticks(9.5, 10), axis_ticks(37.2, 10)
    ([0.0, 5.0, 10.0], [0.0, 5.0, 10.0], [0.0, 20.0, 40.0])
    >>> axis_ticks(96.0, 10), axis_ticks(254.0, 100), axis_ticks(float("nan"), 100)
    ([0.0, 40.0, 80.0, 120.0], [0.0, 100.0, 200.0, 300.0], [0.0, 50.0, 100.0])
    """
    target = peak * HEADROOM if math.isfinite(peak) and peak > minimum else minimum
    scale = 10.0 ** math.floor(math.log10(target))
    top, step = next((t, s) for t, s in NICE_TOPS if t * scale >= target * (1 - 1e-9))
    return [round(i * step * scale, 9) for i in range(round(top / step) + 1)]


def pin_y_range(plot: pg.PlotWidget, peak: float, minimum: float) -> None:
    """Label `plot`'s y axis with `axis_ticks(peak, minimum)` and show 0 up to a little above
    the top tick (never below 0)."""
    ticks = axis_ticks(peak, minimum)
    plot.getAxis("left").setTicks([[(y, f"{y:,.0f}" if ticks[1] >= 1 else f"{y:g}")
                                    for y in ticks]])
    plot.setYRange(0, ticks[-1] * (1 + TOP_ROOM), padding=0)


def style_axes(plot: pg.PlotWidget, palette: Palette) -> None:
    """Axis lines in the border colour; tick labels and axis titles in the muted text colour.
    (pyqtgraph's `setPen` gives the titles the line colour, too faint to read; `setLabel`
    with a colour sets the style that later titles keep.)"""
    for side in ("left", "bottom"):
        axis = plot.getAxis(side)
        axis.setPen(palette.border)
        axis.setTextPen(palette.muted)
        axis.setLabel(axis.labelText, color=palette.muted)


class Panel(QtWidgets.QFrame):
    """A card: title, a grid of `label: value` pairs, and a time plot below, with its legend
    above it.

    Attributes:
        plot: the pyqtgraph PlotWidget (x: seconds before now; y: from 0 up to at least
            `y_minimum`, more when the visible data need it).
        legend: the label above the plot naming each curve in its colour.
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
        self._rows = 0  # grid rows used so far …
        self._open_row: int | None = None  # … and the one with a free right half
        self.plot = pg.PlotWidget(background=palette.surface)
        self.plot.setFixedHeight(PLOT_HEIGHT)
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.showGrid(x=False, y=True, alpha=0.15)
        self.plot.setLabel("bottom", "seconds ago")
        self.plot.setXRange(-MIN_SPAN_S, 0, padding=0.01)
        pin_y_range(self.plot, 0.0, y_minimum)
        self.legend = legend_label()
        style_axes(self.plot, palette)
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.series: dict[str, Series] = {}

    def add_value(self, key: str, label: str, wide: bool = False) -> QtWidgets.QLabel:
        """A `label: value` pair: two to a row, each value elided to half the leftover width
        (so keep those short), or, when wide, a row of its own whose value wraps."""
        name = QtWidgets.QLabel(label)
        name.setObjectName("muted")
        value: QtWidgets.QLabel
        if wide:
            value = QtWidgets.QLabel("–")
            value.setWordWrap(True)
            line = self._new_row()
            self._grid.addWidget(name, line, 0, Qt.AlignmentFlag.AlignTop)
            self._grid.addWidget(value, line, 1, 1, 3)
        elif self._open_row is not None:
            value = ElidedLabel("–")
            self._grid.addWidget(name, self._open_row, 2)
            self._grid.addWidget(value, self._open_row, 3)
            self._open_row = None
        else:
            value = ElidedLabel("–")
            line = self._open_row = self._new_row()
            self._grid.addWidget(name, line, 0)
            self._grid.addWidget(value, line, 1)
        self._grid.setColumnStretch(1, 1)
        self._grid.setColumnStretch(3, 1)
        self.values[key] = value
        return value

    def _new_row(self) -> int:
        self._open_row = None
        self._rows += 1
        return self._rows - 1

    def add_curve(self, key: str, name: str, color_index: int) -> None:
        color = self.palette_.plot[color_index % len(self.palette_.plot)]
        self.curves[key] = self.plot.plot([], [], name=name, pen=pg.mkPen(color, width=2))
        self.series[key] = Series()
        self.legend.setText(legend_html((curve.opts["pen"].color().name(), curve.name())
                                        for curve in self.curves.values()))

    def set_value(self, key: str, text: str) -> None:
        """Show `text`, which is also the tooltip (the whole of it, should it ever be elided)."""
        self.values[key].setText(text)
        self.values[key].setToolTip(text)

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
            style_axes(plot, palette)

    def plots(self) -> list[pg.PlotWidget]:
        return [self.plot]

    def finish_layout(self) -> None:
        self._layout.addWidget(self.legend)
        self._layout.addWidget(self.plot)
