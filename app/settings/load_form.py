"""The inputs of a model's settings: context, GPU layers, K/V cache types, flash attention,
threads, batch sizes, the workers lending their devices, drafting and sampling — turned into
(and from) `ModelPrefs`.

    form = LoadForm()
    form.set_prefs(prefs, n_layers=31, has_gpu=False)
    form.edited.connect(replan)                   # any input changed by the user
    prefs = form.prefs(path)                      # SettingsError if a combination is refused

Draft models come with the compatibility verdict (`set_draft_candidates`): incompatible ones
are listed greyed out, not selectable, with the reason beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from app.qt import Qt, QtGui, QtWidgets, Signal
from app.services.drafts import DraftCandidate
from app.settings.kv_notes import kv_note
from app.settings.moe_spin import ExpertLayersSpin
from app.settings.workers_field import WorkersField
from runtime.errors import SettingsError
from runtime.events import SamplingParams
from runtime.settings.load import KV_CACHE_TYPES, DraftSettings, LoadSettings
from runtime.settings.user import ModelPrefs

DRAFT_KINDS = (("None", "none"), ("Prompt lookup (n-gram)", "ngram"), ("Draft model", "model"))
FLASH = (("Auto", "auto"), ("On", "on"), ("Off", "off"))
MAX_CONTEXT = 1 << 20
PATH_ROLE = Qt.ItemDataRole.UserRole


class LoadForm(QtWidgets.QWidget):
    """Signals:
        edited(): the user changed an input (not emitted while `set_prefs` fills them).
        largest_context_requested(): the "Largest that fits" button.
    """

    edited = Signal()
    largest_context_requested = Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._filling = False
        self._draft_reasons: dict[str, tuple[str, ...]] = {}
        self._draft_path: Path | None = None
        self._moe_blocks = 0  # a MoE model's block count; 0 hides "MoE experts on CPU"
        self._base = ModelPrefs(LoadSettings(model_path=Path("model.gguf")))

        self.n_ctx = _spin(16, MAX_CONTEXT, 256)
        self.n_ctx.setObjectName("n_ctx")
        self.largest = QtWidgets.QPushButton("Largest that fits")
        self.largest.clicked.connect(self.largest_context_requested)
        ctx_row = _row(self.n_ctx, self.largest)
        self.gpu_auto = QtWidgets.QCheckBox("Auto (as many as fit)")
        self.gpu_layers = QtWidgets.QSlider(Qt.Orientation.Horizontal)
        self.gpu_layers_value = QtWidgets.QLabel("0")
        self.gpu_note = QtWidgets.QLabel()
        self.gpu_note.setObjectName("muted")
        gpu_row = _row(self.gpu_auto, self.gpu_layers, self.gpu_layers_value)
        # MoE experts on CPU: -1 auto, 0 none, N the first N blocks, all blocks = "all".
        self.cpu_moe = ExpertLayersSpin()
        self.cpu_moe.setObjectName("cpu_moe")

        self.type_k = _combo([(t, t) for t in KV_CACHE_TYPES])
        self.type_v = _combo([(t, t) for t in KV_CACHE_TYPES])
        self.flash = _combo(FLASH)
        self.kv_note = QtWidgets.QLabel()
        self.kv_note.setWordWrap(True)
        self.kv_note.setObjectName("muted")

        self.threads = _spin(0, 512)
        self.threads.setSpecialValueText("auto")
        self.n_batch = _spin(1, 65536, 64)
        self.n_ubatch = _spin(1, 65536, 64)
        self.workers = WorkersField()
        self.workers_note = QtWidgets.QLabel(
            "Other machines running `outrider worker` (Server → Lend this machine) hold some "
            "layers over the network; Check asks each for its free memory. No password or "
            "encryption: private networks or SSH tunnels only.")
        self.workers_note.setWordWrap(True)
        self.workers_note.setObjectName("muted")

        self.draft_kind = _combo(DRAFT_KINDS)
        self.draft_model = QtWidgets.QComboBox()
        self.draft_model.setModel(QtGui.QStandardItemModel(self.draft_model))
        self.draft_note = QtWidgets.QLabel()
        self.draft_note.setWordWrap(True)
        self.draft_note.setObjectName("muted")
        self.draft_k_auto = QtWidgets.QCheckBox("Auto (adapts each round)")
        self.draft_k = _spin(1, 32)
        k_row = _row(self.draft_k_auto, self.draft_k)

        self.temperature = _double(0.0, 5.0, 0.05)
        self.top_k = _spin(0, 1000)
        self.top_p = _double(0.01, 1.0, 0.01)
        self.min_p = _double(0.0, 0.99, 0.01)
        self.repeat_penalty = _double(0.5, 2.0, 0.05)
        self.max_tokens = _spin(1, 1 << 17)
        self.seed = _spin(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")

        memory = QtWidgets.QFormLayout()
        memory.addRow("Context length", ctx_row)
        memory.addRow("GPU layers", gpu_row)
        memory.addRow("", self.gpu_note)
        memory.addRow("MoE experts on CPU", self.cpu_moe)
        self._memory = memory
        memory.addRow("K cache type", self.type_k)
        memory.addRow("V cache type", self.type_v)
        memory.addRow("Flash attention", self.flash)
        memory.addRow(self.kv_note)
        memory.addRow("Threads", self.threads)
        memory.addRow("Batch size", self.n_batch)
        memory.addRow("Micro-batch size", self.n_ubatch)
        machines = QtWidgets.QFormLayout()
        machines.addRow("Workers", self.workers)
        machines.addRow(self.workers_note)
        drafting = QtWidgets.QFormLayout()
        drafting.addRow("Drafting", self.draft_kind)
        drafting.addRow("Draft model", self.draft_model)
        drafting.addRow(self.draft_note)
        drafting.addRow("Draft length k", k_row)
        sampling = QtWidgets.QFormLayout()
        for label, widget in (("Temperature", self.temperature), ("Top-k", self.top_k),
                              ("Top-p", self.top_p), ("Min-p", self.min_p),
                              ("Repeat penalty", self.repeat_penalty),
                              ("Max tokens", self.max_tokens), ("Seed", self.seed)):
            sampling.addRow(label, widget)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for title, form in (("Memory and speed", memory), ("Other machines", machines),
                            ("Speculative decoding", drafting), ("Sampling defaults", sampling)):
            box = QtWidgets.QGroupBox(title)
            box.setLayout(form)
            layout.addWidget(box)
        layout.addStretch(1)

        for spin in (self.n_ctx, self.threads, self.n_batch, self.n_ubatch, self.draft_k,
                     self.top_k, self.max_tokens, self.seed, self.gpu_layers, self.cpu_moe):
            spin.valueChanged.connect(self._on_edit)
        for dspin in (self.temperature, self.top_p, self.min_p, self.repeat_penalty):
            dspin.valueChanged.connect(self._on_edit)
        for combo in (self.type_k, self.type_v, self.flash, self.draft_kind, self.draft_model):
            combo.currentIndexChanged.connect(self._on_edit)
        for check in (self.gpu_auto, self.draft_k_auto):
            check.toggled.connect(self._on_edit)
        self.workers.edited.connect(self._on_edit)

    # -- filling ---------------------------------------------------------------------------

    def set_prefs(self, prefs: ModelPrefs, n_layers: int, has_gpu: bool,
                  moe_blocks: int = 0) -> None:
        """Show `prefs` for a model of `n_layers` offloadable layers; `moe_blocks` > 0 (a
        mixture-of-experts model's block count) shows "MoE experts on CPU"."""
        self._filling = True
        try:
            load, s = prefs.load, prefs.sampling
            self._moe_blocks = max(moe_blocks, 0)
            self._memory.setRowVisible(self.cpu_moe, moe_blocks > 0)
            self.cpu_moe.set_blocks(moe_blocks)
            self.cpu_moe.setValue(-1 if load.cpu_moe == "auto" else moe_blocks
                                  if load.cpu_moe == "all" else min(load.cpu_moe, moe_blocks))
            self.n_ctx.setValue(load.n_ctx)
            self.gpu_layers.setRange(0, max(n_layers, 0))
            self.gpu_auto.setChecked(load.gpu_layers is None)
            self.gpu_layers.setValue(min(load.gpu_layers or 0, n_layers))
            self.set_gpu_available(has_gpu)
            self.workers.set_endpoints(load.workers)
            _select(self.type_k, load.type_k)
            _select(self.type_v, load.type_v)
            _select(self.flash, load.flash_attn)
            self.threads.setValue(load.n_threads or 0)
            self.n_batch.setValue(load.n_batch)
            self.n_ubatch.setValue(load.n_ubatch)
            _select(self.draft_kind, load.draft.kind)
            self._draft_path = load.draft.model_path
            self._select_draft(load.draft.model_path)
            self.draft_k_auto.setChecked(load.draft.k is None)
            self.draft_k.setValue(load.draft.k or 4)
            self.temperature.setValue(s.temperature)
            self.top_k.setValue(s.top_k)
            self.top_p.setValue(s.top_p)
            self.min_p.setValue(s.min_p)
            self.repeat_penalty.setValue(s.repeat_penalty)
            self.max_tokens.setValue(s.max_tokens)
            self.seed.setValue(-1 if s.seed is None else s.seed)
            self._base = prefs
        finally:
            self._filling = False
        self._update_enabled()

    def set_gpu_available(self, has_gpu: bool) -> None:
        """Whether layers can go anywhere but this CPU: a GPU here, or a checked worker's
        device (the GPU-layer count is then how many leave this machine's CPU)."""
        self.gpu_auto.setEnabled(has_gpu)
        self.gpu_note.setText("" if has_gpu else "No GPU found: every layer runs on the CPU.")
        self._update_enabled()

    def set_draft_candidates(self, candidates: list[DraftCandidate]) -> None:
        """List the library's other models: compatible ones selectable, the rest greyed out
        with the reason."""
        self._filling = True
        try:
            model: QtGui.QStandardItemModel = self.draft_model.model()  # type: ignore[assignment]
            model.clear()
            self._draft_reasons = {}
            for c in candidates:
                text = c.model.name if c.compatible else f"{c.model.name} — {c.reasons[0]}"
                item = QtGui.QStandardItem(text)
                item.setData(str(c.model.path), PATH_ROLE)
                if not c.compatible:
                    item.setEnabled(False)  # shown, not selectable
                    item.setToolTip("Cannot draft for this model:\n" + "\n".join(c.reasons))
                    self._draft_reasons[str(c.model.path)] = c.reasons
                model.appendRow(item)
            self._select_draft(self._draft_path)
        finally:
            self._filling = False
        n_bad = len(self._draft_reasons)
        n_ok = len(candidates) - n_bad
        self.draft_note.setText(
            f"{n_ok} compatible draft model(s) in the library"
            + (f"; {n_bad} greyed out cannot draft for this one (hover for why)." if n_bad else ".")
            if candidates else "No other models in the library to draft with.")
        self._update_enabled()

    def draft_reasons(self, path: Path) -> tuple[str, ...]:
        """Why `path` cannot draft for this model (empty: it can)."""
        return self._draft_reasons.get(str(path), ())

    def draft_selectable(self, path: Path) -> bool:
        model: QtGui.QStandardItemModel = self.draft_model.model()  # type: ignore[assignment]
        for row in range(model.rowCount()):
            item = model.item(row)
            if item.data(PATH_ROLE) == str(path):
                return bool(item.flags() & Qt.ItemFlag.ItemIsEnabled)
        return False

    def _select_draft(self, path: Path | None) -> None:
        index = -1
        model: QtGui.QStandardItemModel = self.draft_model.model()  # type: ignore[assignment]
        for row in range(model.rowCount()):
            item = model.item(row)
            if path is not None and item.data(PATH_ROLE) == str(path) and item.isEnabled():
                index = row
        if index < 0:  # the remembered draft is gone or refused: the first compatible one
            index = next((r for r in range(model.rowCount()) if model.item(r).isEnabled()), -1)
        self.draft_model.setCurrentIndex(index)

    # -- reading ---------------------------------------------------------------------------

    def prefs(self, path: Path) -> ModelPrefs:
        """The settings shown, for the model `path`; SettingsError if they are refused."""
        kind = self.draft_kind.currentData()
        draft_path = self.draft_model.currentData(PATH_ROLE)
        if kind == "model" and not draft_path:
            raise SettingsError("choose a compatible draft model (or another kind of drafting)")
        base = self._base.load.draft
        draft = DraftSettings(kind=kind, model_path=Path(draft_path) if kind == "model" else None,
                              k=None if self.draft_k_auto.isChecked() else self.draft_k.value(),
                              k_max=base.k_max, p_min=base.p_min, ngram_min=base.ngram_min,
                              ngram_max=base.ngram_max, verifier=base.verifier)
        base_load = self._base.load
        load = LoadSettings(
            model_path=path, n_ctx=self.n_ctx.value(),
            gpu_layers=None if self.gpu_auto.isChecked() else self.gpu_layers.value(),
            type_k=self.type_k.currentData(), type_v=self.type_v.currentData(),
            flash_attn=self.flash.currentData(), n_threads=self.threads.value() or None,
            n_threads_batch=base_load.n_threads_batch, n_batch=self.n_batch.value(),
            n_ubatch=self.n_ubatch.value(), n_parallel=base_load.n_parallel,
            use_mmap=base_load.use_mmap, draft=draft, cpu_moe=self._cpu_moe(base_load),
            tensor_split=base_load.tensor_split, main_gpu=base_load.main_gpu,
            mmproj_path=base_load.mmproj_path,  # a projector the user chose (none: paired)
            workers=self.workers.endpoints())
        base_s = self._base.sampling
        sampling = SamplingParams(
            temperature=round(self.temperature.value(), 4), top_k=self.top_k.value(),
            top_p=round(self.top_p.value(), 4), min_p=round(self.min_p.value(), 4),
            repeat_penalty=round(self.repeat_penalty.value(), 4),
            frequency_penalty=base_s.frequency_penalty, presence_penalty=base_s.presence_penalty,
            penalty_last_n=base_s.penalty_last_n,
            seed=None if self.seed.value() < 0 else self.seed.value(),
            max_tokens=self.max_tokens.value(), stop=base_s.stop)
        return ModelPrefs(load, sampling)

    def _cpu_moe(self, base: LoadSettings) -> int | Literal["all", "auto"]:
        if not self._moe_blocks:
            return base.cpu_moe  # a dense model: nothing shown, nothing changed
        value = self.cpu_moe.value()
        if value < 0:
            return "auto"
        return "all" if value and value == self.cpu_moe.maximum() else value

    # -- reacting --------------------------------------------------------------------------

    def _on_edit(self, *_: object) -> None:
        self._update_enabled()
        if not self._filling:
            chosen = self.draft_model.currentData(PATH_ROLE)
            if chosen:
                self._draft_path = Path(chosen)  # kept when the candidate list is refreshed
            self.edited.emit()

    def _update_enabled(self) -> None:
        self.gpu_layers.setEnabled(self.gpu_auto.isEnabled() and not self.gpu_auto.isChecked())
        self.gpu_layers_value.setText("auto" if self.gpu_auto.isChecked()
                                      else str(self.gpu_layers.value()))
        model_draft = self.draft_kind.currentData() == "model"
        self.draft_model.setEnabled(model_draft)
        drafting = self.draft_kind.currentData() != "none"
        self.draft_k_auto.setEnabled(drafting)
        self.draft_k.setEnabled(drafting and not self.draft_k_auto.isChecked())
        self.kv_note.setText(kv_note(self.type_k.currentData(), self.type_v.currentData(),
                                     self.flash.currentData()))


def _spin(lo: int, hi: int, step: int = 1) -> QtWidgets.QSpinBox:
    spin = QtWidgets.QSpinBox()
    spin.setRange(lo, hi)
    spin.setSingleStep(step)
    spin.setGroupSeparatorShown(True)
    return spin


def _double(lo: float, hi: float, step: float) -> QtWidgets.QDoubleSpinBox:
    spin = QtWidgets.QDoubleSpinBox()
    spin.setRange(lo, hi)
    spin.setSingleStep(step)
    spin.setDecimals(2)
    return spin


def _combo(items: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> QtWidgets.QComboBox:
    combo = QtWidgets.QComboBox()
    for label, value in items:
        combo.addItem(label, value)
    return combo


def _select(combo: QtWidgets.QComboBox, value: object) -> None:
    index = combo.findData(value)
    combo.setCurrentIndex(max(index, 0))


def _row(*widgets: QtWidgets.QWidget) -> QtWidgets.QWidget:
    box = QtWidgets.QWidget()
    row = QtWidgets.QHBoxLayout(box)
    row.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        row.addWidget(w, 1 if isinstance(w, (QtWidgets.QSlider, QtWidgets.QSpinBox)) else 0)
    return box
