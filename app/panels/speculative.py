"""Speculative panel: acceptance rate over time, mean accepted length, current k, drafted /
accepted, predicted vs measured speedup, and why drafting is off when it is.

Two sources: the engine's rolling metrics (once a second) and the per-round `StepStats` of
the reply being written (more precise while it streams). The predicted speedup is the
formula (1 − α^(k+1)) / ((1 − α)(k·c + 1)) the engine evaluates; measured is its timing.
"""

from __future__ import annotations

import time

from app.panels.base import Panel
from app.qt import QtWidgets
from app.theme import Palette
from app.throttle import Throttle
from app.wire import MetricsSnapshot, ModelInfo
from runtime.events import StepStats

NO_DRAFT = "no drafter loaded (choose a draft model or n-gram lookup in Settings)"
WAITING = "waiting for the first speculative round"
STEP_REPAINT_MS = 100
FULL = 100.0  # % acceptance: the y axis is always 0 … 100


class SpeculativePanel(Panel):
    def __init__(self, palette: Palette, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Speculative", palette, FULL, parent)
        # Short names keep the name column narrow, so the wide rows' values fit on one line
        # at the dock's default width.
        self.add_value("acceptance", "Acceptance")
        self.add_value("k", "Draft k")
        self.add_value("counts", "Accepted", wide=True)
        self.add_value("mean_len", "Per step", wide=True)  # the mean accepted length
        self.add_value("speedup", "Speedup", wide=True)
        self.add_value("state", "Drafting", wide=True)
        self.plot.setLabel("left", "%")
        self.add_curve("acceptance", "acceptance", 2)
        self.finish_layout()
        self._drafted = 0
        self._accepted = 0
        self._drafter: str | None = None
        self._refused: str | None = None
        self._last_step: StepStats | None = None
        self._step_throttle = Throttle(self._show_step, STEP_REPAINT_MS, self)

    def set_model(self, model: ModelInfo | None) -> None:
        """The loaded model's drafter (None, "ngram" or a draft model's name)."""
        self._drafter = model.draft if model else None
        self._refused = model.draft_refused if model else None
        self.set_value("state", self._idle_state(None))

    def _idle_state(self, reason: str | None) -> str:
        if reason:
            return f"off — {reason}"
        if self._refused:
            return f"off — draft refused: {self._refused}"
        if self._drafter:
            return f"{self._drafter}: {WAITING}"
        return f"off — {NO_DRAFT}"

    def update_metrics(self, snapshot: MetricsSnapshot) -> None:
        if snapshot.acceptance_rate is None:
            self.set_value("state", self._idle_state(snapshot.drafting_off_reason))
            self.redraw(snapshot.time)
            return
        self.set_value("acceptance", f"{snapshot.acceptance_rate:.0%}")
        if snapshot.mean_accepted_length is not None:
            self.set_value("mean_len", f"{snapshot.mean_accepted_length:.2f} tokens")
        if snapshot.draft_k is not None:
            self.set_value("k", str(snapshot.draft_k))
        reason = snapshot.drafting_off_reason
        self.set_value("state", f"off — {reason}" if reason else f"on ({self._drafter or 'draft'})")
        self.record("acceptance", snapshot.time, snapshot.acceptance_rate * 100)
        self.redraw(snapshot.time)

    def update_step(self, step: StepStats) -> None:
        """One speculative round of the reply being written (drawn at most ten times a
        second: rounds can come a thousand times a second)."""
        self._drafted += step.drafted
        self._accepted += step.accepted
        self._last_step = step
        self._step_throttle()

    def _show_step(self) -> None:
        step = self._last_step
        if step is None:
            return
        self.set_value("acceptance", f"{step.acceptance_rate:.0%}")
        self.set_value("mean_len", f"{step.mean_accepted_length:.2f} tokens")
        self.set_value("k", str(step.k))
        self.set_value("counts", f"{self._accepted:,} / {self._drafted:,} drafted")
        self.set_value("speedup", f"predicted {step.predicted_speedup:.2f}× · "
                                  f"measured {step.measured_speedup:.2f}×")
        reason = step.drafting_off_reason
        self.set_value("state", f"off — {reason}" if reason else f"on ({self._drafter or 'draft'})")

    def flush(self) -> None:
        """Show the last round now (the reply ended)."""
        self._step_throttle.flush()

    def reset_reply(self) -> None:
        """A new reply starts: drafted / accepted count from zero again."""
        self._step_throttle.flush()
        self._drafted = self._accepted = 0
        self._last_step = None
        self.redraw(time.time())
