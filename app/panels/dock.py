"""The dock of live panels (Memory, Speed, Speculative), fed by the engine client and the
chat controller. Built after the window's first paint: pyqtgraph takes ~0.5 s to import, and
the window should appear before that."""

from __future__ import annotations

from typing import Any, Protocol

from app.engine.wire import MetricsSnapshot, ServedModel
from app.panels.memory import MemoryPanel
from app.panels.speculative import SpeculativePanel
from app.panels.speed import SpeedPanel
from app.qt import Qt, QtWidgets
from app.theme import Palette
from runtime.events import StepStats

DOCK_MIN_WIDTH = 200


class FinishedReply(Protocol):
    """What the dock reads of a finished reply (the chat's `Message`): its footer statistics.
    A protocol, not the chat's class: the panels import no other page (pages import
    services, never each other)."""

    stats: dict[str, Any]


class LivePanels(QtWidgets.QDockWidget):
    """Memory on top; Speculative before Speed while drafting is on (see `_order`).

    Attributes:
        memory, speed, speculative: the three panels.
        snapshots: how many metrics snapshots arrived (for tests and the status bar).
    """

    def __init__(self, palette: Palette, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Live", parent)
        self.setObjectName("livePanels")
        self.setAllowedAreas(Qt.DockWidgetArea.RightDockWidgetArea
                             | Qt.DockWidgetArea.LeftDockWidgetArea
                             | Qt.DockWidgetArea.BottomDockWidgetArea)
        self.memory = MemoryPanel(palette)
        self.speed = SpeedPanel(palette)
        self.speculative = SpeculativePanel(palette)
        inner = QtWidgets.QWidget()
        self._stack = QtWidgets.QVBoxLayout(inner)
        self._stack.setContentsMargins(8, 4, 8, 8)
        self._stack.setSpacing(8)
        for panel in (self.memory, self.speed, self.speculative):
            self._stack.addWidget(panel)
        self._stack.addStretch(1)
        scroll = QtWidgets.QScrollArea()
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        scroll.setWidget(inner)
        self.setWidget(scroll)
        # The window opens it at 380 px; it shrinks to 200 (the panels' own minimum is ~190)
        # so that a 1024 px window keeps the widest page beside it whole: 150 px of navigation
        # + 658 of the Models page (its Library buttons, as the app styles them) + the dock
        # and its separator. At 240 that window came out 1054 px wide — and Qt bounds a resize
        # by the minimum before the resize folds the dock. Narrower, the status bar's "Live
        # panels" button collapses it.
        self.setMinimumWidth(DOCK_MIN_WIDTH)
        self.snapshots = 0

    def on_metrics(self, snapshot: MetricsSnapshot) -> None:
        self.snapshots += 1
        self.memory.update_metrics(snapshot)
        self.speed.update_metrics(snapshot)
        self.speculative.update_metrics(snapshot)

    def set_palette(self, palette: Palette) -> None:
        for panel in (self.memory, self.speed, self.speculative):
            panel.set_palette(palette)

    def on_model(self, model: ServedModel | None) -> None:
        self.speculative.set_model(model)
        self.memory.set_plan(model.plan if model is not None else None)
        self._order(drafting=model is not None and bool(model.draft) and not model.draft_refused)

    def _order(self, drafting: bool) -> None:
        """Speculative right under Memory while a drafter is loaded, else last. Third, its
        acceptance chart began 580 px down a 658 px dock at 1024×700 (below the fold); second,
        it shows whole without scrolling. Without a drafter it says only "off", and Speed's
        plot is the one worth the room."""
        second = self.speculative if drafting else self.speed
        if self._stack.indexOf(second) != 1:
            self._stack.insertWidget(1, second)

    def on_step(self, step: StepStats) -> None:
        self.speculative.update_step(step)

    def on_busy(self, busy: bool) -> None:
        if busy:
            self.speculative.reset_reply()
        else:
            self.speculative.end_reply()

    def on_reply_finished(self, message: FinishedReply) -> None:
        self.speed.update_reply(message.stats)
        self.speculative.update_reply(message.stats)  # the footer's figures, as it shows them
