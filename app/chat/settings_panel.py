"""Per-conversation settings: system prompt, sampling and structured output, shown in a
drawer under the header.

Values are validated by `SamplingParams` itself; a change is applied when the user leaves
the field (or after a short pause while typing the system prompt). The structured output
schema is checked at every keystroke (`app.chat.schema`): the line under it says in red why
it cannot be used, and each edit reaches the chat at once, so Send knows whether it may go.
"""

from __future__ import annotations

from dataclasses import replace

from app.chat import schema
from app.chat.conversation import DEFAULT_SAMPLING, Conversation
from app.qt import QtCore, QtGui, QtWidgets, Signal
from app.widgets import ElidedLabel, muted_label
from runtime.errors import SettingsError
from runtime.events import SamplingParams

SCHEMA_PLACEHOLDER = ('{"type": "object", "properties": {"answer": {"type": "string"}}, '
                      '"required": ["answer"]}')
SCHEMA_OFF = "Empty: off. A JSON schema here makes every reply match it."
SCHEMA_ON = "Valid: sent as response_format json_schema (strict); replies match it."


class ConversationSettings(QtWidgets.QFrame):
    """Signals:
        system_prompt_changed(str)
        sampling_changed(SamplingParams)
        response_schema_changed(str): the structured output field as typed (valid or not).
        problem(str): a value was refused (the message says why).

    Attributes:
        response_schema: the structured output field; schema_status: the line under it.
    """

    system_prompt_changed = Signal(str)
    sampling_changed = Signal(object)
    response_schema_changed = Signal(str)
    problem = Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        self._sampling = DEFAULT_SAMPLING
        self._loading = False
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 12)
        self._margins = layout.contentsMargins()
        layout.setSpacing(6)

        layout.addWidget(muted_label("System prompt"))
        self.system_prompt = QtWidgets.QPlainTextEdit()
        self.system_prompt.setPlaceholderText("e.g. You are a concise assistant.")
        self.system_prompt.setFixedHeight(58)
        self._prompt_timer = QtCore.QTimer(self, singleShot=True, interval=400)
        self._prompt_timer.timeout.connect(
            lambda: self.system_prompt_changed.emit(self.system_prompt.toPlainText()))
        self.system_prompt.textChanged.connect(self._on_prompt_edited)
        layout.addWidget(self.system_prompt)

        self.temperature = self._double(0.0, 5.0, 0.05, 2)
        self.top_p = self._double(0.01, 1.0, 0.01, 2)
        self.min_p = self._double(0.0, 0.99, 0.01, 2)
        self.top_k = self._int(0, 1000)
        self.max_tokens = self._int(1, 32768)
        self.seed = self._int(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")
        self._grid = QtWidgets.QGridLayout()
        self._grid.setHorizontalSpacing(10)
        self._grid.setVerticalSpacing(6)
        self._fields: list[tuple[QtWidgets.QLabel, QtWidgets.QAbstractSpinBox]] = []
        for name, box in (("Temperature", self.temperature), ("Top-p", self.top_p),
                          ("Min-p", self.min_p), ("Top-k", self.top_k),
                          ("Max tokens", self.max_tokens), ("Seed", self.seed)):
            label = QtWidgets.QLabel(name)
            label.setObjectName("muted")
            box.setFixedWidth(96)
            self._fields.append((label, box))
        self._columns = 0
        self._place(3)
        layout.addLayout(self._grid)

        layout.addWidget(muted_label("Structured output (JSON schema)"))
        self.response_schema = QtWidgets.QPlainTextEdit()
        self.response_schema.setObjectName("responseSchema")
        self.response_schema.setPlaceholderText(SCHEMA_PLACEHOLDER)
        self.response_schema.setFont(
            QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont))
        self.response_schema.setTabChangesFocus(True)
        self.response_schema.setFixedHeight(58)
        self.response_schema.textChanged.connect(self._on_schema_edited)
        layout.addWidget(self.response_schema)
        self.schema_status = ElidedLabel(SCHEMA_OFF)  # one line; the whole reason in its tip
        self.schema_status.setObjectName("muted")
        layout.addWidget(self.schema_status)

    # -- layout: three label/field pairs a row where they fit, else two or one -----------
    # A fixed three would make the drawer ~600 px wide at least; opening it then squeezed
    # the chat list beside it from 240 to 170 px.

    def minimumSizeHint(self) -> QtCore.QSize:
        hint = super().minimumSizeHint()
        margins = self._margins
        return QtCore.QSize(self._pair_width() + margins.left() + margins.right(), hint.height())

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:
        super().resizeEvent(event)
        margins = self._margins
        room = event.size().width() - margins.left() - margins.right()
        self._place(max(1, min(3, (room + 10) // (self._pair_width() + 10))))

    def _pair_width(self) -> int:
        spacing = self._grid.horizontalSpacing()
        return max(label.sizeHint().width() for label, _ in self._fields) + spacing + 96

    def _place(self, columns: int) -> None:
        if columns == self._columns:
            return
        self._columns = columns
        for label, box in self._fields:
            self._grid.removeWidget(label)
            self._grid.removeWidget(box)
        for column in range(7):
            self._grid.setColumnStretch(column, 0)
        for i, (label, box) in enumerate(self._fields):
            self._grid.addWidget(label, i // columns, (i % columns) * 2)
            self._grid.addWidget(box, i // columns, (i % columns) * 2 + 1)
        self._grid.setColumnStretch(columns * 2, 1)

    def _double(self, low: float, high: float, step: float, decimals: int) -> QtWidgets.QDoubleSpinBox:
        box = QtWidgets.QDoubleSpinBox()
        box.setRange(low, high)
        box.setSingleStep(step)
        box.setDecimals(decimals)
        box.editingFinished.connect(self._on_sampling_edited)
        box.valueChanged.connect(lambda _: self._on_sampling_edited())
        return box

    def _int(self, low: int, high: int) -> QtWidgets.QSpinBox:
        box = QtWidgets.QSpinBox()
        box.setRange(low, high)
        box.valueChanged.connect(lambda _: self._on_sampling_edited())
        return box

    def show_conversation(self, conv: Conversation | None) -> None:
        self._loading = True
        try:
            sampling = conv.sampling if conv else DEFAULT_SAMPLING
            self._sampling = sampling
            self.system_prompt.setPlainText(conv.system_prompt if conv else "")
            self.temperature.setValue(sampling.temperature)
            self.top_p.setValue(sampling.top_p)
            self.min_p.setValue(sampling.min_p)
            self.top_k.setValue(sampling.top_k)
            self.max_tokens.setValue(sampling.max_tokens)
            self.seed.setValue(-1 if sampling.seed is None else sampling.seed)
            schema_text = conv.response_schema if conv else ""
            if schema_text != self.response_schema.toPlainText():  # (keeps the cursor while
                self.response_schema.setPlainText(schema_text)     # typing starts a chat)
            self._show_schema_status()
        finally:
            self._loading = False

    def _on_schema_edited(self) -> None:
        self._show_schema_status()
        if not self._loading:
            self.response_schema_changed.emit(self.response_schema.toPlainText())

    def _show_schema_status(self) -> None:
        text = self.response_schema.toPlainText()
        problem = schema.check(text)
        self.schema_status.setText(problem or (SCHEMA_ON if text.strip() else SCHEMA_OFF))
        name = "errorText" if problem else "muted"
        if self.schema_status.objectName() != name:
            self.schema_status.setObjectName(name)
            style = self.schema_status.style()  # the style sheet picks colours by name
            style.unpolish(self.schema_status)
            style.polish(self.schema_status)

    def schema_problem(self) -> str:
        """Why the structured output field cannot be used ("" when it can, or is empty)."""
        return schema.check(self.response_schema.toPlainText())

    def sampling(self) -> SamplingParams:
        seed = self.seed.value()
        return replace(self._sampling, temperature=self.temperature.value(),
                       top_p=self.top_p.value(), min_p=self.min_p.value(),
                       top_k=self.top_k.value(), max_tokens=self.max_tokens.value(),
                       seed=None if seed < 0 else seed)

    def _on_prompt_edited(self) -> None:
        if not self._loading:
            self._prompt_timer.start()

    def _on_sampling_edited(self) -> None:
        if self._loading:
            return
        try:
            sampling = self.sampling()
        except SettingsError as exc:
            self.problem.emit(str(exc))
            return
        if sampling != self._sampling:
            self._sampling = sampling
            self.sampling_changed.emit(sampling)

    def flush(self) -> None:
        """Apply a pending system-prompt edit now (before sending)."""
        if self._prompt_timer.isActive():
            self._prompt_timer.stop()
            self.system_prompt_changed.emit(self.system_prompt.toPlainText())
