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


class FinishedReply(Protocol):
    """What the dock reads of a finished reply (the chat's `Message`): its footer statistics.
    A protocol, not the chat's class: the panels import no other page (pages import
    services, never each other)."""

    stats: dict[str, Any]


class LivePanels(QtWidgets.QDockWidget):
    """Attributes:
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
        layout = QtWidgets.QVBoxLayout(inner)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.setSpacing(8)
        for panel in (self.memory, self.speed, self.speculative):
            layout.addWidget(panel)
        layout.addStretch(1)
        scroll = QtWidgets.QScrollArea()
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        scroll.setWidget(inner)
        self.setWidget(scroll)
        # The window opens it at 380 px; it shrinks to 240 (the panels' own minimum is ~190)
        # so that a 1024 px window keeps the page beside it whole. Narrower, the status bar's
        # "Live panels" button collapses it.
        self.setMinimumWidth(240)
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
