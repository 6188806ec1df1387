"""Speed panel: decode and prefill tokens per second over time, and the last reply's time to
first token (from the reply's own timings, which the engine measures from request to token)."""

from __future__ import annotations

from typing import Any

from app.engine.wire import MetricsSnapshot
from app.panels.base import Panel
from app.qt import QtWidgets
from app.theme import Palette
from runtime.units import fmt_latency, fmt_rate

MIN_TOP = 10.0  # tok/s: the y axis shows at least 0 … 10 (round ticks while idle)


class SpeedPanel(Panel):
    def __init__(self, palette: Palette, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Speed", palette, MIN_TOP, parent)
        self.add_value("decode", "Decode")
        self.add_value("prefill", "Prefill")
        self.add_value("ttft", "Last TTFT")
        self.add_value("sequences", "Sequences", wide=True)
        self.plot.setLabel("left", "tok/s")
        self.add_curve("decode", "decode", 0)
        self.add_curve("prefill", "prefill", 1)
        self.finish_layout()

    def update_metrics(self, snapshot: MetricsSnapshot) -> None:
        self.set_value("decode", fmt_rate(snapshot.decode_tokens_per_s))
        self.set_value("prefill", fmt_rate(snapshot.prefill_tokens_per_s))
        waiting = f" (+{snapshot.waiting_sequences} waiting)" if snapshot.waiting_sequences else ""
        self.set_value("sequences", f"{snapshot.active_sequences} active{waiting}")
        self.record("decode", snapshot.time, snapshot.decode_tokens_per_s)
        self.record("prefill", snapshot.time, snapshot.prefill_tokens_per_s)
        self.redraw(snapshot.time)

    def update_ttft(self, seconds: float) -> None:
        """The reply being written got its first token: show its time to first token now,
        not only when the reply ends (the first reply of a session showed "–" throughout)."""
        self.set_value("ttft", fmt_latency(seconds))

    def update_reply(self, stats: dict[str, Any]) -> None:
        """A reply finished: show its time to first token (the engine's own measurement)."""
        ttft = stats.get("ttft_s")
        if ttft is not None:
            self.set_value("ttft", fmt_latency(ttft))
