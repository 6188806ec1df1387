"""The memory plan on screen: verdict, breakdown (weights, KV cache, compute, other), each
device against its free memory, the largest context that fits, and the planner's notes.

    view = PlanView()
    view.show_plan(plan_memory(info, settings, devices), n_ctx_train=info.n_ctx_train)
    view.value("kv")        # the text shown for the KV cache, e.g. '48.0 MiB (4,096 cells)'
"""

from __future__ import annotations

from app.fit_badge import BADGE_ROLE, badge_text
from app.qt import Qt, QtWidgets
from app.services.memory_terms import network_text
from runtime.planner.plan import KV_CELL_PAD, MemoryPlan
from runtime.units import fmt_bytes

ROWS = (("weights", "Weights"), ("kv", "KV cache"), ("compute", "Compute buffers"),
        ("overhead", "Other"), ("total", "Total"), ("max_context", "Largest context that fits"),
        ("kv_per_token", "KV cache per token"), ("gpu_layers", "Layers on GPU"))
_COLORS = {"ok": "#1a7f37", "warn": "#9a6700", "accent": "#3b6fd8", "error_text": "#cf222e"}


def context_text(plan: MemoryPlan, n_ctx_train: int = 0) -> str:
    """The largest context that fits, and whether the model rather than memory set it.

    The planner looks no further than the trained context (or the asked one, when larger),
    so a largest context equal to the trained one says memory allows at least that much:
    "8,192 tokens (trained)" — one line: Qt's form layout clipped the wrapped sentence this
    once was after a theme change; the row's tooltip (TRAINED_TIP) says memory is not the
    limit. Otherwise memory is (or the asked context) the
    limit: "3,584 tokens"; "none fits" when not even 256 do.
    """
    if not plan.max_context:
        return "none fits"
    text = f"{plan.max_context:,} tokens"
    trained = n_ctx_train // KV_CELL_PAD * KV_CELL_PAD  # the planner's cells come in 256s
    if 0 < plan.n_ctx <= n_ctx_train and plan.max_context == trained:
        text += " (trained)"
    return text


def sliding_window_text(plan: MemoryPlan) -> str:
    """What the sliding-window layers keep, when some keep less than the context:
    "sliding window: 15 of 18 layers keep 1,024 tokens" (Gemma-3-270M: a 512-token window
    plus one 512-token micro-batch); "" otherwise."""
    if not plan.swa_layers:
        return ""
    return (f"sliding window: {plan.swa_layers} of {plan.n_blocks} layers keep "
            f"{plan.swa_cells:,} tokens")


def experts_text(plan: MemoryPlan, is_moe: bool) -> str:
    """Where a mixture-of-experts model's expert weights go, as planned (for "auto", what it
    chose): "MoE experts in RAM: the first 34 of 48 layers"; "" for a dense model."""
    if not is_moe:
        return ""
    n, blocks = plan.cpu_moe_layers, plan.n_blocks
    if n == 0:
        return "MoE experts in RAM: none (all with their layers)"
    if n >= blocks:
        return f"MoE experts in RAM: all {blocks} layers"
    return f"MoE experts in RAM: the first {n} of {blocks} layers"


def projector_text(plan: MemoryPlan) -> str:
    """What a vision projector takes (part of the weights and compute above), for the notes:
    "vision projector: 812 MiB of that (weights and compute buffer)"; "" for a text model.
    (What each image takes of the context is the planner's own note.)"""
    vision = sum(d.projector for d in plan.devices)
    if not vision:
        return ""
    return f"vision projector: {fmt_bytes(vision)} of that (weights and compute buffer)"


def split_text(plan: MemoryPlan) -> str:
    """How a plan with workers splits the layers, in the planner's words (the head of
    `MemoryPlan.describe`, before its totals): "Split: 11 of 31 layers here, 20 on 2 workers";
    "" for a plan on this machine alone, or one that does not fit."""
    if plan.verdict == "wont_fit" or not any(d.kind == "rpc" for d in plan.devices):
        return ""
    return plan.describe().rsplit(": ", 1)[0]  # the totals after the last ": " have none


TRAINED_TIP = ("The model's trained context: the longest it was made for. Memory would hold "
               "more, so memory is not the limit here.")


def plan_values(plan: MemoryPlan, n_ctx_train: int = 0) -> dict[str, str]:
    """The text of each row for `plan` (what the view shows, and what tests compare);
    `n_ctx_train`, the model's trained context, says which limit the largest context hit."""
    return {
        "weights": fmt_bytes(plan.weights),
        "kv": f"{fmt_bytes(plan.kv)} ({plan.kv_cells:,} cells)",
        "compute": fmt_bytes(plan.compute),
        "overhead": fmt_bytes(plan.overhead),
        "total": fmt_bytes(plan.total),
        "max_context": context_text(plan, n_ctx_train),
        "kv_per_token": f"{plan.kv_bytes_per_token:,} bytes",
        "gpu_layers": f"{plan.gpu_layers} of {plan.n_layers}",
    }


class PlanView(QtWidgets.QGroupBox):
    """Attributes: plan — the MemoryPlan shown (None while there is none)."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Memory plan", parent)
        self.plan: MemoryPlan | None = None
        self.verdict = QtWidgets.QLabel("—")
        self.verdict.setObjectName("verdict")
        self.verdict.setWordWrap(True)
        font = self.verdict.font()
        font.setPointSizeF(font.pointSizeF() * 1.3)
        font.setBold(True)
        self.verdict.setFont(font)
        form = QtWidgets.QFormLayout()
        self.labels: dict[str, QtWidgets.QLabel] = {}
        for key, title in ROWS:
            label = QtWidgets.QLabel("—")
            label.setObjectName(key)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.labels[key] = label
            form.addRow(title, label)
        self.devices = QtWidgets.QLabel()
        self.devices.setWordWrap(True)
        self.notes = QtWidgets.QLabel()
        self.notes.setWordWrap(True)
        self.notes.setObjectName("muted")
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(self.verdict)
        layout.addLayout(form)
        layout.addWidget(self.devices)
        layout.addWidget(self.notes)
        layout.addStretch(1)

    def show_plan(self, plan: MemoryPlan, extra_notes: tuple[str, ...] = (),
                  n_ctx_train: int = 0, *, is_moe: bool = False) -> None:
        self.plan = plan
        self.verdict.setText(split_text(plan) or badge_text(
            {"verdict": plan.verdict, "gpu_layers": plan.gpu_layers, "n_layers": plan.n_layers}))
        color = _COLORS.get(BADGE_ROLE.get(plan.verdict, ""), "")
        self.verdict.setStyleSheet(f"color: {color};" if color else "")
        for key, text in plan_values(plan, n_ctx_train).items():
            self.labels[key].setText(text)
        trained = self.labels["max_context"].text().endswith("(trained)")
        self.labels["max_context"].setToolTip(TRAINED_TIP if trained else "")
        self.devices.setText("\n".join(
            f"{d.name}: {fmt_bytes(d.total)} of {fmt_bytes(d.free_bytes)} free"
            + ("" if d.fits else " — too much") for d in plan.devices))
        said = (network_text(plan.links), sliding_window_text(plan), experts_text(plan, is_moe),
                projector_text(plan))
        self.notes.setText("\n".join((*plan.notes, *(s for s in said if s), *extra_notes)))

    def show_message(self, text: str) -> None:
        """No plan: say why (reading the model, a setting refused …)."""
        self.plan = None
        self.verdict.setText(text)
        self.verdict.setStyleSheet("")
        for label in self.labels.values():
            label.setText("—")
        self.devices.setText("")
        self.notes.setText("")

    def value(self, key: str) -> str:
        return self.labels[key].text()
