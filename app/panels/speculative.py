"""Speculative panel: acceptance rate over time, mean accepted length, current k, drafted /
accepted, predicted vs measured speedup, and why drafting is off when it is.

Two sources, kept apart. The reply rows (Acceptance, Accepted, Per round, Speedup) are the
chat reply's, whole: while it streams, from the last `StepStats` (which carries the reply's
running counts), and once it ended, from its footer — the same numbers the footer and the
`/v1` stream show. The Now row and the plot are the engine's rolling metrics (once a second:
the last few seconds, every sequence, server clients too). Mixing them is how one reply's
footer said "acceptance 92% (11/12 drafted)" while this panel said "Acceptance 88%" (the
rolling window) and "Accepted 4 / 4" (the sum of the rounds that reached it, when the server
had sent only the last round of each burst). Every figure is computed in the engine with
`runtime.speculative.stats`; the predicted speedup is its formula (1 − α^(k+1)) /
((1 − α)(k·c + 1)) at the per-position α, measured is the reply's timing.
"""

from __future__ import annotations

import time
from typing import Any

from app.engine.wire import MetricsSnapshot, ServedModel
from app.panels.base import Panel
from app.qt import QtWidgets
from app.theme import Palette
from app.throttle import Throttle
from runtime.events import StepStats

NO_DRAFT = "no drafter loaded (choose a draft model or n-gram lookup in Settings)"
WAITING = "waiting for the first speculative round"
# The engine's auto-off reasons (`runtime.speculative.adaptive`) are whole sentences with the
# figures behind the decision; the Drafting line says what happened in plain words and keeps
# the sentence for its tooltip.
OFF_MEASURED = "Off: drafting was slower than plain decoding"
OFF_PREDICTED = "Off: drafting would be slower than plain decoding here"
SLOWER_ADVICE = "drafting is slower here: turn it off or pick a smaller draft"
STEP_REPAINT_MS = 100
FULL = 100.0  # % acceptance: the y axis is always 0 … 100
SHOWN = ("acceptance", "k", "counts", "mean_len", "speedup", "now")  # what a new load clears


def drafting_state(drafter: str | None, refused: str | None, off_reason: str | None,
                   rounds_seen: bool, generating: bool) -> str:
    """The "Drafting" line: what is true of drafting now, in a few words.

    `drafter`, `refused`: the loaded model's drafter ("ngram", a draft model's name, None) and
    why a requested draft model was refused; `off_reason`: why the engine stopped drafting
    for the sequence it runs (it judges each sequence on its own, so the reason lapses when
    the sequence ends); `rounds_seen`: whether any speculative round ran since this load;
    `generating`: whether a sequence is being written. Once idle the panel keeps the last
    reply's numbers, and the line says they are not live.

    >>> drafting_state("ngram", None, None, rounds_seen=False, generating=False)
    'ngram: waiting for the first speculative round'
    >>> drafting_state("ngram", None, None, rounds_seen=True, generating=True)
    'on (ngram)'
    >>> drafting_state("ngram", None, None, rounds_seen=True, generating=False)
    'on (ngram) · idle'
    >>> drafting_state("ngram", None, "speculation off: 9.0 tok/s with drafting is below "
    ...                "10.0 tok/s plain over the last 8 rounds", True, True)
    'Off: drafting was slower than plain decoding'
    >>> drafting_state("ngram", None, "speculation off: slower than plain", True, False)
    'on (ngram) · idle'
    >>> drafting_state(None, "vocabularies differ", None, rounds_seen=False, generating=False)
    'off — draft refused: vocabularies differ'
    """
    if refused:
        return f"off — draft refused: {refused}"
    if off_reason and generating:
        return off_headline(off_reason)
    if not rounds_seen:
        return f"{drafter}: {WAITING}" if drafter else f"off — {NO_DRAFT}"
    on = f"on ({drafter or 'draft'})"  # rounds before the model's description arrived
    return on if generating else f"{on} · idle"


def off_headline(reason: str) -> str:
    """A short line for an engine's reason to stop drafting (the reason is the tooltip).

    >>> off_headline("speculation off: at α 0.62 per draft position and a draft step "
    ...              "costing 0.00× a target step, no draft length beats plain decoding; "
    ...              "trying again in 64 steps")
    'Off: drafting would be slower than plain decoding here'
    >>> off_headline("draft model unloaded")
    'Off: draft model unloaded'
    """
    if "no draft length beats" in reason:
        return OFF_PREDICTED
    if reason.startswith("speculation off"):
        return OFF_MEASURED
    return f"Off: {reason}"


def speedup_text(predicted: float | None, measured: float) -> str:
    """The Speedup line; below 1× it says what to do about it.

    >>> speedup_text(1.4, 1.2)
    'predicted 1.40× · measured 1.20×'
    >>> speedup_text(None, 0.7)
    'measured 0.70× — drafting is slower here: turn it off or pick a smaller draft'
    """
    text = (f"predicted {predicted:.2f}× · " if predicted else "") + f"measured {measured:.2f}×"
    return f"{text} — {SLOWER_ADVICE}" if measured < 1.0 else text


class SpeculativePanel(Panel):
    """Attributes (besides `Panel`'s):
        rounds_seen: whether a speculative round ran since the model was loaded.
    """

    def __init__(self, palette: Palette, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Speculative", palette, FULL, parent)
        # Short names keep the name column narrow, so the wide rows' values fit on one line
        # at the dock's default width.
        self.add_value("acceptance", "Acceptance")
        self.add_value("k", "Draft k")
        # The acceptance chart right under its headline figure, above the detail rows:
        # nearer the top of the dock.
        self.plot.setLabel("left", "%")
        self.add_curve("acceptance", "acceptance", 2)
        self._layout.addWidget(self.legend)
        self._layout.addWidget(self.plot)
        self._details = QtWidgets.QGridLayout()
        self._details.setHorizontalSpacing(12)
        self._details.setVerticalSpacing(2)
        self._layout.addLayout(self._details)
        self._grid = self._details  # the rows below go under the chart
        self._rows = 0
        self.add_value("counts", "Accepted", wide=True)
        self.add_value("mean_len", "Per round", wide=True)  # the mean accepted length
        self.add_value("speedup", "Speedup", wide=True)
        self.add_value("now", "Now", wide=True)  # the engine's rolling window, not the reply
        self.add_value("state", "Drafting", wide=True)
        self._model: ServedModel | None = None
        self.rounds_seen = False
        self._off_reason: str | None = None  # the latest the engine gave (metrics or a round)
        self._replying = False  # a reply of this app's chat is being written …
        self._active = 0  # … or the engine runs sequences (this chat's, or a server client's)
        self._last_step: StepStats | None = None
        self._predicted: float | None = None  # the reply's last round's
        self._step_throttle = Throttle(self._show_step, STEP_REPAINT_MS, self)
        self._show_state()

    def set_model(self, model: ServedModel | None) -> None:
        """The loaded model (its drafter: None, "ngram" or a draft model's name). The engine
        client sends None before every load, and may send the same load again with new
        measurements: only a new load starts over."""
        if model is None or self._model is None or \
                (model.path, model.draft) != (self._model.path, self._model.draft):
            self.rounds_seen = False
            self._off_reason = None
            for key in SHOWN:  # the previous model's numbers
                self.set_value(key, "–")
        self._model = model
        self._show_state()

    def _show_state(self) -> None:
        model = self._model
        generating = self._replying or self._active > 0
        self.set_value("state", drafting_state(
            model.draft if model else None, model.draft_refused if model else None,
            self._off_reason, self.rounds_seen, generating))
        if self._off_reason and generating and not (model and model.draft_refused):
            self.values["state"].setToolTip(self._off_reason)  # the engine's whole reason

    def update_metrics(self, snapshot: MetricsSnapshot) -> None:
        self._active = snapshot.active_sequences
        self._off_reason = snapshot.drafting_off_reason
        if snapshot.acceptance_rate is not None:  # rounds in the engine's rolling window
            self.rounds_seen = True
            now = f"{snapshot.acceptance_rate:.0%} accepted"
            if snapshot.mean_accepted_length is not None:
                now += f" · {snapshot.mean_accepted_length:.2f} per round"
            self.set_value("now", now)
            if snapshot.draft_k is not None:
                self.set_value("k", str(snapshot.draft_k))
            self.record("acceptance", snapshot.time, snapshot.acceptance_rate * 100)
        elif self.rounds_seen:
            self.set_value("now", "no rounds")
        self._show_state()
        self.redraw(snapshot.time)

    def update_step(self, step: StepStats) -> None:
        """One speculative round of the reply being written (drawn at most ten times a
        second: rounds can come a thousand times a second). Only the last matters: it
        carries the reply's counts so far. A round with nothing drafted only says that
        drafting switched off or on."""
        self._last_step = step
        self._step_throttle()

    def _show_step(self) -> None:
        step = self._last_step
        if step is None:
            return
        self._off_reason = step.drafting_off_reason
        if step.reply_drafted:
            self.rounds_seen = True
            if step.k:
                self.set_value("k", str(step.k))
                self._predicted = step.predicted_speedup
            self._show_reply(step.reply_accepted, step.reply_drafted, step.acceptance_rate,
                             step.mean_accepted_length, step.measured_speedup)
        self._show_state()

    def _show_reply(self, accepted: int, drafted: int, rate: float, mean_len: float | None,
                    measured: float | None) -> None:
        self.set_value("acceptance", f"{rate:.0%}")
        self.set_value("counts", f"{accepted:,} / {drafted:,} drafted")
        if mean_len is not None:
            self.set_value("mean_len", f"{mean_len:.2f} tokens")
        if measured is not None:
            self.set_value("speedup", speedup_text(self._predicted, measured))

    def update_reply(self, stats: dict[str, Any]) -> None:
        """The reply ended with these footer statistics (`Message.stats`): show the reply's
        figures exactly as its footer does. Without them (stopped, failed) the last round's
        stay."""
        drafted = stats.get("drafted")
        if not drafted:
            return
        self._show_reply(int(stats.get("accepted", 0)), int(drafted),
                         float(stats.get("acceptance_rate", 0.0)),
                         stats.get("mean_accepted_length"), stats.get("measured_speedup"))

    def reset_reply(self) -> None:
        """A new reply starts: its rounds replace the last reply's numbers as they come."""
        self._step_throttle.flush()
        self._last_step = None
        self._predicted = None
        self._replying = True
        self._show_state()
        self.redraw(time.time())

    def end_reply(self) -> None:
        """The reply ended: show its last round now; its numbers stay until the next one."""
        self._step_throttle.flush()
        self._replying = False
        self._show_state()
