"""The model picker in the chat header: choose a library model, load or unload it.

The list is the library's (`set_library`, fed from the Models page's scans) plus models opened
from elsewhere (`add_model`); until the first scan arrives it lists the models folder itself.
Load takes the model's remembered load settings (`settings_for`, the Settings page's).

Loading shows the memory plan first (computed off the GUI thread with `runtime.planner.plan` from
the file's header), asks before trying a plan that says "won't fit", shows progress while the
engine loads, and afterwards planned beside measured memory (llama.cpp's own buffer sizes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.engine.client import EngineClient, EngineState, LoadJob
from app.engine.wire import ReplyError, ServedModel
from app.qt import Qt, QtWidgets, Signal
from app.services.background import BackgroundRunner
from app.services.memory_terms import BUFFERS, BUFFERS_TIP, PLANNED_TIP
from app.services.projectors import plan_model as plan_with_projector
from app.widgets import ElidedLabel
from runtime.errors import OutriderError
from runtime.library.projectors import is_projector_name
from runtime.settings.load import LoadSettings
from runtime.units import fmt_bytes

_SPLIT_PART = re.compile(r"-(\d{5})-of-\d{5}$")
NO_MODELS = "No models in the library"
CHOOSE = "Choose a model to load"
UNLOADED = "No model loaded: choose one and press Load"


def library_models(models_dir: Path) -> list[Path]:
    """Every complete .gguf under the library folder, sorted by name (partial downloads,
    later parts of split models and vision projectors, which load with their model, left
    out)."""
    if not models_dir.is_dir():
        return []
    found = []
    for path in models_dir.rglob("*.gguf"):
        split = _SPLIT_PART.search(path.stem)
        if (not path.name.startswith(".") and (split is None or split.group(1) == "00001")
                and not is_projector_name(path.name)):
            found.append(path)
    return sorted(found, key=lambda p: p.name.lower())


def plan_model(settings: LoadSettings) -> dict[str, Any]:
    """The memory plan for `settings` as a dict, its projector counted (runs on the
    background thread)."""
    return plan_with_projector(settings)


def plan_summary(plan: dict[str, Any]) -> str:
    summary = plan.get("summary")
    if isinstance(summary, str):
        return summary
    total = plan.get("total") or plan.get("total_bytes") or 0
    return f"{plan.get('verdict', '?')}: {fmt_bytes(total)}"


def measured_total(measured: dict[str, Any]) -> int:
    """Sum of llama.cpp's reported buffers (`LoadedModel.allocated`), nested dicts included."""
    total = 0
    for value in measured.values():
        if isinstance(value, int | float):
            total += int(value)
        elif isinstance(value, dict):
            total += measured_total(value)
    return total


def planned_vs_measured(model: ServedModel) -> str:
    """'planned 134 MiB · buffers 131 MiB' after a load, or '' without figures. "buffers",
    not "measured": the Memory panel's Engine RAM is measured too, and larger (see
    `app.services.memory_terms`)."""
    planned = model.plan.get("total") or model.plan.get("total_bytes")
    measured = measured_total(model.measured)
    if not planned and not measured:
        return ""
    parts = []
    if planned:
        parts.append(f"planned {fmt_bytes(int(planned))}")
    if measured:
        parts.append(f"{BUFFERS} {fmt_bytes(measured)}")
    return " · ".join(parts)


class ModelPicker(QtWidgets.QWidget):
    """Combo box of library models with Load / Unload and a one-line status.

    Signals:
        model_chosen(str): the user loaded this model path (for the conversation's record).
    """

    model_chosen = Signal(str)

    def __init__(self, client: EngineClient, runner: BackgroundRunner, models_dir: Path,
                 settings_for: Callable[[Path], LoadSettings] | None = None,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._client = client
        self._runner = runner
        self._models_dir = models_dir
        self._settings_for = settings_for or (lambda path: LoadSettings(model_path=path))
        self._extra: list[Path] = []
        self._library: list[Path] | None = None  # None: scan the folder (no library feed)
        self._plan: dict[str, Any] | None = None
        self._confirm: QtWidgets.QMessageBox | None = None
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        self.combo = QtWidgets.QComboBox()
        # As wide as ~14 characters, not as the longest model name: a long name elides
        # (its path is the item's tooltip) instead of widening a 1024 px window.
        self.combo.setSizeAdjustPolicy(
            QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(14)
        self.combo.setPlaceholderText(NO_MODELS)
        self.combo.currentIndexChanged.connect(self._update_buttons)
        layout.addWidget(self.combo)
        self.load_button = QtWidgets.QPushButton("Load")
        self.load_button.clicked.connect(self.load_selected)
        layout.addWidget(self.load_button)
        self.unload_button = QtWidgets.QPushButton("Unload")
        self.unload_button.clicked.connect(client.unload)
        layout.addWidget(self.unload_button)
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setFixedWidth(120)
        self.progress.setTextVisible(False)
        self.progress.hide()
        layout.addWidget(self.progress)
        self.status = ElidedLabel()
        self.status.setObjectName("muted")
        layout.addWidget(self.status, 1)
        client.state_changed.connect(self._on_state)
        client.model_changed.connect(self._on_model)
        client.problem.connect(self._on_problem)
        self.refresh()
        self._on_state(client.state)

    # -- library -----------------------------------------------------------------------

    def add_model(self, path: Path) -> None:
        """Offer a model outside the library too (`--model PATH`, the first-run download)."""
        if path not in self._extra:
            self._extra.append(path)
        self.refresh()
        self.select(path)

    def set_library(self, paths: list[Path]) -> None:
        """List these models (the library's latest scan) instead of scanning the folder."""
        self._library = list(paths)
        self.refresh()

    def refresh(self) -> None:
        current = self.selected()
        if self._library is not None:
            paths = list(self._library)
        else:
            paths = library_models(self._models_dir)
        paths += [p for p in self._extra if p not in paths]
        self.combo.blockSignals(True)
        self.combo.clear()
        for path in paths:
            self.combo.addItem(path.stem, str(path))
            self.combo.setItemData(self.combo.count() - 1, str(path), Qt.ItemDataRole.ToolTipRole)
        self.combo.blockSignals(False)
        self.combo.setPlaceholderText(CHOOSE if self.combo.count() else NO_MODELS)
        if current is not None:
            self.select(current)
        if self.combo.currentIndex() < 0 and self.combo.count():
            self.combo.setCurrentIndex(0)  # the placeholder would otherwise keep it at -1
        self._update_buttons()

    def select(self, path: Path | str) -> None:
        index = self.combo.findData(str(path))
        if index >= 0:
            self.combo.setCurrentIndex(index)

    def selected(self) -> Path | None:
        data = self.combo.currentData()
        return Path(data) if data else None

    # -- loading -----------------------------------------------------------------------

    def load_selected(self) -> None:
        path = self.selected()
        if path is None:
            return
        try:
            settings = self._settings_for(path)
        except OutriderError as exc:
            self.status.setText(str(exc))
            return
        self.plan_and_load(settings)

    def plan_and_load(self, settings: LoadSettings) -> None:
        """Plan first; load when it fits, ask first when the plan says it won't (the
        library's and the Settings page's Load)."""
        if self.combo.findData(str(settings.model_path)) < 0:
            self.add_model(settings.model_path)
        self.select(settings.model_path)
        self.status.setText("Planning memory…")
        self.load_button.setEnabled(False)
        job = self._runner.submit(plan_model, settings)
        job.done.connect(lambda plan: self._on_plan(settings, plan))
        job.failed.connect(lambda exc: self._on_plan_failed(settings, exc))

    def load(self, settings: LoadSettings) -> LoadJob:
        """Load without planning first (start-up, self-test)."""
        return self._start_load(settings)

    def _on_plan(self, settings: LoadSettings, plan: dict[str, Any]) -> None:
        self._plan = plan
        self.status.setText(plan_summary(plan))
        # With workers, this plan (this machine's devices only: asking a worker here would
        # find it busy serving the model loaded now) cannot judge the fit; the engine plans
        # again with the workers' devices as it loads, and its plan replaces this one here.
        if plan.get("verdict") != "wont_fit" or settings.workers:
            self._start_load(settings)
            return
        box = QtWidgets.QMessageBox(self)
        box.setIcon(QtWidgets.QMessageBox.Icon.Warning)
        box.setWindowTitle("Model won't fit")
        box.setText(f"{settings.model_path.name} is not expected to fit in free memory.")
        box.setInformativeText(plan_summary(plan) + "\n\nLoading may fail or slow the machine "
                               "down. Try anyway?")
        box.setStandardButtons(QtWidgets.QMessageBox.StandardButton.Yes
                               | QtWidgets.QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QtWidgets.QMessageBox.StandardButton.Cancel)
        box.finished.connect(lambda result: self._on_confirm(settings, result))
        self._confirm = box
        box.open()

    def _on_confirm(self, settings: LoadSettings, result: int) -> None:
        self._confirm = None
        if result == QtWidgets.QMessageBox.StandardButton.Yes:
            self._start_load(settings)
        else:
            self.status.setText("Not loaded: " + (plan_summary(self._plan or {})))
            self._update_buttons()

    def _on_plan_failed(self, settings: LoadSettings, exc: object) -> None:
        if isinstance(exc, OutriderError):
            self.status.setText(str(exc))
            self._update_buttons()
        else:  # the planner could not say; the engine will plan again while loading
            self._start_load(settings)

    def _start_load(self, settings: LoadSettings) -> LoadJob:
        job = self._client.load(settings)
        job.plan.connect(self._on_engine_plan)
        job.progress.connect(lambda f: self.progress.setValue(int(f * 1000)))
        self.progress.setValue(0)
        self.progress.show()
        self.model_chosen.emit(str(settings.model_path))
        return job

    def _on_engine_plan(self, plan: dict[str, Any]) -> None:
        self._plan = plan
        self.status.setText("Loading · " + plan_summary(plan))

    # -- engine events -----------------------------------------------------------------

    def _on_state(self, state: EngineState) -> None:
        self.progress.setVisible(state == EngineState.LOADING)
        if state == EngineState.STARTING:
            self.status.setText("Starting the engine…")
        elif state == EngineState.CRASHED:
            self.status.setText("The engine stopped. Send a message or Load to restart it.")
        self._update_buttons()

    def _on_model(self, model: ServedModel | None) -> None:
        if model is not None:
            self.select(model.path)
            detail = planned_vs_measured(model)
            head = model.quant or "Loaded"
            self.status.setText(head + (f" · {detail}" if detail else ""))
            if detail:  # what each figure counts (the full text is in the label itself)
                self.status.setToolTip(f"{self.status.text()}\n\n{PLANNED_TIP}\n{BUFFERS_TIP}")
        elif self._client.wanted is None:  # unloaded (or a load that failed: its problem follows)
            self._forget_model()
        self._update_buttons()

    def _forget_model(self) -> None:
        """After Unload: no old model selected, no old plan or measurements."""
        self._plan = None
        self.progress.hide()
        self.combo.setCurrentIndex(-1)
        self.status.setText(UNLOADED)

    def _on_problem(self, error: ReplyError) -> None:
        self.progress.hide()
        self.status.setText(error.message)
        self._update_buttons()

    def _update_buttons(self) -> None:
        state = self._client.state
        busy = state in (EngineState.LOADING, EngineState.STARTING)
        self.load_button.setEnabled(not busy and self.selected() is not None)
        self.unload_button.setEnabled(self._client.model is not None and not busy)
