"""Library: the models on this disk, what each one is, and what can draft for it.

Load (emits `load_requested` with the model's remembered settings), Settings…, Delete (asks
first), Reveal in the file manager, Import (a file dialog, or drop .gguf files on the page)
and Make a draft (a low-bit copy of the model made with llama.cpp's quantizer, for drafting
when no smaller sibling exists). Every file operation runs on a worker thread.

A vision model is marked in the Architecture column ("gemma3 · vision") and loads with its
projector (the `mmproj*.gguf` beside it: `app.services.projectors`). One whose projector is
missing says so under the table, with a "Get projector" button (`app.models.projector_note`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.models.projector_note import ProjectorNote
from app.qt import QtCore, QtGui, QtWidgets, Signal
from app.services.drafts import compatible_drafts
from app.services.inbox import Inbox
from app.services.models import ModelServices
from app.services.outcome import on_result
from app.services.projectors import load_settings_for
from app.widgets import read_only_table
from runtime.library.library import LibraryModel
from runtime.quality.quantize import QuantRecipe, default_output_path, quantize
from runtime.units import fmt_bytes, fmt_count

# Short headers, as a column is as wide as its header or values: the Model column shows names
# whole, Repository takes what is left; the headers' tooltips say the rest.
COLUMNS = ("Model", "Repository", "Architecture", "Parameters", "Quant", "Size", "Context",
           "Drafts")
HEADER_TIPS = {"Context": "The context length the model was trained on",
               "Drafts": "Models in the library that can draft for this one (speculative "
                         "decoding)"}
DRAFT_TYPES = ("Q4_0", "Q2_K", "Q3_K_M", "Q4_K_M")

Confirm = Callable[[QtWidgets.QWidget, str, str], bool]
ChooseFiles = Callable[[QtWidgets.QWidget], list[Path]]
ChooseDraftType = Callable[[QtWidgets.QWidget, LibraryModel], "str | None"]
OpenUrl = Callable[[QtCore.QUrl], Any]


def confirm(parent: QtWidgets.QWidget, title: str, text: str) -> bool:
    answer = QtWidgets.QMessageBox.question(parent, title, text)
    return answer == QtWidgets.QMessageBox.StandardButton.Yes


def choose_files(parent: QtWidgets.QWidget) -> list[Path]:
    names, _ = QtWidgets.QFileDialog.getOpenFileNames(parent, "Import GGUF models", "",
                                                      "GGUF models (*.gguf)")
    return [Path(n) for n in names]


def choose_draft_type(parent: QtWidgets.QWidget, model: LibraryModel) -> str | None:
    kind, ok = QtWidgets.QInputDialog.getItem(
        parent, "Make a draft",
        f"Make a low-bit copy of {model.name} to draft for it. Smaller drafts run faster but "
        "agree with the model less often.", list(DRAFT_TYPES), 0, False)
    return kind if ok else None


class LibraryPage(QtWidgets.QWidget):
    """Signals:
        load_requested(LoadSettings): Load, with the model's remembered settings
            (runtime.settings.load.LoadSettings).
        settings_requested(object): the Path of a model whose settings the user wants.
        message(str): something to tell the user (status bar).
    """

    load_requested = Signal(object)
    settings_requested = Signal(object)
    message = Signal(str)

    def __init__(self, services: ModelServices, *, confirm: Confirm = confirm,
                 choose_files: ChooseFiles = choose_files,
                 choose_draft_type: ChooseDraftType = choose_draft_type,
                 open_url: OpenUrl = QtGui.QDesktopServices.openUrl,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.confirm = confirm
        self.choose_files = choose_files
        self.choose_draft_type = choose_draft_type
        self.open_url = open_url
        self.models: list[LibraryModel] = []
        self.drafts: dict[Path, list[LibraryModel]] = {}
        self._cancel_draft: threading.Event | None = None
        self.setAcceptDrops(True)

        self.table = read_only_table(COLUMNS, stretch=1, tips=HEADER_TIPS)  # Repository
        self.buttons: dict[str, QtWidgets.QPushButton] = {}
        bar = QtWidgets.QHBoxLayout()
        for key, label in (("load", "Load"), ("settings", "Settings…"), ("delete", "Delete…"),
                           ("reveal", "Reveal in folder"), ("draft", "Make a draft…"),
                           ("import", "Import…")):
            button = QtWidgets.QPushButton(label)
            button.setObjectName(key)
            self.buttons[key] = button
            if key == "import":
                bar.addStretch(1)
            bar.addWidget(button)
        self.status = QtWidgets.QLabel("Drop .gguf files here to import them.")
        self.status.setObjectName("muted")
        self.status.setWordWrap(True)
        self.progress = QtWidgets.QProgressBar()
        self.progress.hide()
        self.cancel_button = QtWidgets.QPushButton("Cancel")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(self._on_cancel_draft)
        foot = QtWidgets.QHBoxLayout()
        foot.addWidget(self.status, 1)
        foot.addWidget(self.progress)
        foot.addWidget(self.cancel_button)
        self.projector_note = ProjectorNote(services, self.selected)
        self.projector_note.message.connect(self.status.setText)
        self.vision_note = self.projector_note.note
        self.projector_button = self.projector_note.button
        layout = QtWidgets.QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.projector_note)
        layout.addLayout(foot)

        self.buttons["load"].clicked.connect(self._on_load)
        self.buttons["settings"].clicked.connect(self._on_settings)
        self.buttons["delete"].clicked.connect(self._on_delete)
        self.buttons["reveal"].clicked.connect(self._on_reveal)
        self.buttons["import"].clicked.connect(self._on_import)
        self.buttons["draft"].clicked.connect(self._on_make_draft)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.cellActivated.connect(lambda _r, _c: self._on_load())
        self._progress_inbox = Inbox(self)  # the quantizer's thread → the GUI thread
        self._progress_inbox.received.connect(self._on_draft_progress)
        services.library_changed.connect(self.show_models)
        services.library_failed.connect(self.status.setText)
        self._update_buttons()

    # -- showing ---------------------------------------------------------------------------

    def show_models(self, models: list[LibraryModel]) -> None:
        chosen = self.selected()
        self.models = list(models)
        self.table.setRowCount(len(self.models))
        for row, m in enumerate(self.models):
            info = m.info or {}
            ctx = info.get("n_ctx_train")
            arch = m.architecture or "?"
            cells = (m.name, m.repo_id or "—", f"{arch} · vision" if m.projector else arch,
                     fmt_count(info.get("n_params")),
                     m.quant or "?", fmt_bytes(m.size), f"{ctx:,}" if ctx else "?",
                     self._drafts_text(m))
            if m.failing:  # a known crash: the server refuses it, say why before
                cells = (f"⚠ {m.name}", *cells[1:])
            tip = m.error or (f"llama.cpp crashed loading this file: {m.failing}" if m.failing
                              else str(m.path))
            for col, text in enumerate(cells):
                item = QtWidgets.QTableWidgetItem(text)
                item.setToolTip(tip)
                self.table.setItem(row, col, item)
            if chosen is not None and m.path == chosen.path:
                self.table.selectRow(row)
        self._update_buttons()
        job = self.services.on_disk(compatible_drafts, self.models, self.services.draft_verdicts)
        on_result(job, self, self._on_drafts)

    def _drafts_text(self, model: LibraryModel) -> str:
        if model.path not in self.drafts:
            return "…"
        names = [d.name for d in self.drafts[model.path]]
        return ", ".join(names) if names else "none"

    def _on_drafts(self, drafts: dict[Path, list[LibraryModel]]) -> None:
        self.drafts = drafts
        for row, m in enumerate(self.models):
            item = self.table.item(row, 7)
            if item is not None:
                item.setText(self._drafts_text(m))

    def selected(self) -> LibraryModel | None:
        rows = {i.row() for i in self.table.selectedItems()}
        return self.models[min(rows)] if rows and min(rows) < len(self.models) else None

    def select(self, path: Path) -> None:
        for row, m in enumerate(self.models):
            if m.path == path:
                self.table.selectRow(row)

    def _update_buttons(self) -> None:
        model = self.selected()
        usable = model is not None and model.error is None
        for key in ("load", "settings", "draft"):
            self.buttons[key].setEnabled(usable)
        for key in ("delete", "reveal"):
            self.buttons[key].setEnabled(model is not None)
        if self._cancel_draft is not None:
            self.buttons["draft"].setEnabled(False)
        self.projector_note.show_for(model)

    # -- actions ---------------------------------------------------------------------------

    def _on_load(self) -> None:
        model = self.selected()
        if model is None or model.error:
            return
        self.load_requested.emit(load_settings_for(self.services.settings.settings, model.path))

    def _on_settings(self) -> None:
        model = self.selected()
        if model is not None:
            self.settings_requested.emit(model.path)

    def _on_delete(self) -> None:
        model = self.selected()
        if model is None:
            return
        text = (f"Delete {model.path.name}? Its {fmt_bytes(model.size)} leave the library "
                "folder (an imported link loses only the link).")
        if not self.confirm(self, "Delete model", text):
            return
        job = self.services.on_disk(self.services.library.delete, model)
        on_result(job, self, lambda _r: self._after(f"Deleted {model.path.name}."),
                  lambda exc: self.status.setText(f"Could not delete: {exc}"))

    def _on_reveal(self) -> None:
        model = self.selected()
        if model is not None:
            self.open_url(QtCore.QUrl.fromLocalFile(str(model.path.parent)))

    def _on_import(self) -> None:
        paths = self.choose_files(self)
        if paths:
            self.import_files(paths)

    def import_files(self, paths: list[Path]) -> None:
        """Copy GGUF files into the library (in the background)."""
        library = self.services.library

        def work() -> list[str]:
            return [library.import_file(p, mode="copy").path.name for p in paths]

        self.status.setText(f"Importing {len(paths)} file(s)…")
        job = self.services.on_disk(work)
        on_result(job, self, lambda names: self._after(f"Imported {', '.join(names)}."),
                  lambda exc: self.status.setText(f"Import failed: {exc}"))

    def _after(self, text: str) -> None:
        self.status.setText(text)
        self.message.emit(text)
        self.services.refresh_library()

    # -- drag and drop ---------------------------------------------------------------------

    def dragEnterEvent(self, event: QtGui.QDragEnterEvent) -> None:
        if _gguf_paths(event.mimeData()):
            event.acceptProposedAction()

    def dragMoveEvent(self, event: QtGui.QDragMoveEvent) -> None:
        if _gguf_paths(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QtGui.QDropEvent) -> None:
        paths = _gguf_paths(event.mimeData())
        if paths:
            event.acceptProposedAction()
            self.import_files(paths)

    # -- make a draft ----------------------------------------------------------------------

    def _on_make_draft(self) -> None:
        model = self.selected()
        if model is None or self._cancel_draft is not None:
            return
        kind = self.choose_draft_type(self, model)
        if kind:
            self.make_draft(model, kind)

    def make_draft(self, model: LibraryModel, kind: str) -> None:
        """Quantize `model` to `kind` beside it (a worker process does the work)."""
        cancel = threading.Event()
        self._cancel_draft = cancel
        self.services.cancel_events.add(cancel)  # an app exit stops it too
        dst = default_output_path(model.path, kind)
        inbox = self._progress_inbox
        recipe = QuantRecipe(kind, allow_requantize=True)
        self.progress.setRange(0, 0)
        self.progress.show()
        self.cancel_button.show()
        self.status.setText(f"Making {dst.name} (llama.cpp's quantizer)…")
        self._update_buttons()
        job = self.services.long.submit(
            lambda: quantize(model.path, dst, recipe, on_progress=inbox.post,
                             cancel_event=cancel))
        on_result(job, self,
                  lambda path: self._draft_over(f"Made {Path(path).name}: choose it as the "
                                                "draft in the model's settings."),
                  lambda exc: self._draft_over(f"Could not make the draft: {exc}"))

    def _on_draft_progress(self, progress: Any) -> None:
        self.progress.setRange(0, int(getattr(progress, "total", 0)))
        self.progress.setValue(int(getattr(progress, "done", 0)))

    def _on_cancel_draft(self) -> None:
        if self._cancel_draft is not None:
            self._cancel_draft.set()

    def _draft_over(self, text: str) -> None:
        if self._cancel_draft is not None:
            self.services.cancel_events.discard(self._cancel_draft)
        self._cancel_draft = None
        self.progress.hide()
        self.cancel_button.hide()
        self._update_buttons()
        self._after(text)


def _gguf_paths(mime: QtCore.QMimeData) -> list[Path]:
    if not mime.hasUrls():
        return []
    paths = [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile()]
    return [p for p in paths if p.suffix.lower() == ".gguf"]
