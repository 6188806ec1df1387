"""The "MoE experts on CPU" input: a spin box whose values read as words.

    spin = ExpertLayersSpin()
    spin.set_blocks(48)            # Qwen3-30B-A3B
    spin.setValue(-1)  → "auto (most on the GPU that fit)"   (LoadSettings.cpu_moe "auto")
    spin.setValue(0)   → "none"                               (0)
    spin.setValue(34)  → "first 34 layers"                    (34)
    spin.setValue(48)  → "all 48 layers"                      ("all")

Typing works too: a number, "none", "all" or "auto". What "auto" chose is in the memory plan
beside it ("MoE experts in RAM: the first 34 of 48 layers", `app.settings.plan_view`).
"""

from __future__ import annotations

from app.qt import QtGui, QtWidgets

AUTO_TEXT = "auto (most on the GPU that fit)"


class ExpertLayersSpin(QtWidgets.QSpinBox):
    """-1 auto, 0 none, N the first N blocks, the block count "all"."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setRange(-1, 0)
        self.setSpecialValueText(AUTO_TEXT)  # shown for the minimum, -1
        self.setToolTip("Keep the expert weights of the first N layers in RAM: attention and "
                        "shared weights stay on the GPU. Auto keeps as many on the GPU as fit "
                        "with the context chosen.")

    def set_blocks(self, n: int) -> None:
        """The model's block count: the largest value, "all"."""
        self.setRange(-1, max(n, 0))

    def textFromValue(self, value: int) -> str:
        if value < 0:
            return AUTO_TEXT
        if value == 0:
            return "none"
        if value == self.maximum():
            return f"all {value} layers" if value > 1 else "all (1 layer)"
        return "first layer" if value == 1 else f"first {value} layers"

    def valueFromText(self, text: str) -> int:
        parsed = self._parse(text)
        return self.value() if parsed is None else parsed

    def validate(self, text: str, pos: int) -> tuple[QtGui.QValidator.State, str, int]:
        parsed = self._parse(text)
        ok = parsed is not None and self.minimum() <= parsed <= self.maximum()
        state = QtGui.QValidator.State.Acceptable if ok else QtGui.QValidator.State.Intermediate
        return state, text, pos

    def _parse(self, text: str) -> int | None:
        words = text.strip().lower()
        if words.startswith("auto"):
            return -1
        if words.startswith("none"):
            return 0
        if words.startswith("all"):
            return self.maximum()
        digits = "".join(c for c in words if c.isdigit())
        if digits:
            return int(digits)
        return 1 if words.startswith("first layer") else None
