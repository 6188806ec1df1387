"""The Library page's line for a vision model whose projector is missing, and its "Get projector".

A library model is a vision model without its projector when its architecture reads images
(`LibraryModel.projector_missing`: Gemma 3, Qwen2.5-VL …) or when its repository on the Hub
has projectors — looked up once per repository, the first time such a model is selected, on
the network thread (offline, the architecture alone decides). "Get projector" queues the
repository's projector (F16, else the smallest: `runtime.hub.quants.choose_projector`) in the
download manager; once it is in, the library scan pairs it and the line goes.

    note = ProjectorNote(services, selected=page.selected)
    note.show_for(model)        # shows or hides the line for the selected model
    note.message.connect(status.setText)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.qt import QtWidgets, Signal
from app.services.models import ModelServices
from app.services.outcome import on_result
from app.services.projectors import find_projector, queue_projector
from runtime.hub.quants import ProjectorChoice
from runtime.library.default_model import SMOLLM2
from runtime.library.library import LibraryModel
from runtime.units import fmt_bytes

# The bundled default model's folder: it looks like owner/repo but is no Hub repository.
BUNDLED = Path(SMOLLM2.library_path).parent.as_posix()


class ProjectorNote(QtWidgets.QWidget):
    """Signals: message(str): what happened (queued, not found), for the page's status line.

    Attributes: note (the line), button ("Get projector"), repo_projectors (repository →
    what it offers as a projector, None for none, once looked up).
    """

    message = Signal(str)

    def __init__(self, services: ModelServices, selected: Callable[[], LibraryModel | None],
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.selected = selected
        self.repo_projectors: dict[str, ProjectorChoice | None] = {}
        self._asking: set[str] = set()
        self.note = QtWidgets.QLabel()
        self.note.setObjectName("visionNote")
        self.note.setWordWrap(True)
        self.button = QtWidgets.QPushButton("Get projector")
        self.button.setObjectName("getProjector")
        self.button.clicked.connect(self._on_get_projector)
        row = QtWidgets.QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.note, 1)
        row.addWidget(self.button)
        self.show_for(None)

    def show_for(self, model: LibraryModel | None) -> None:
        """The line (and button) for a vision model without its projector; hidden otherwise."""
        offer = self._offer(model)
        missing = model is not None and model.projector is None and (
            model.projector_missing or offer is not None)
        self.note.setVisible(missing)
        self.button.setVisible(missing and model is not None and model.repo_id is not None)
        if not missing or model is None:
            return
        if model.repo_id is None:
            self.note.setText(f"{model.name} is a vision model without its projector: it reads "
                              "text only. Put its mmproj .gguf file in the same folder to let "
                              "it read images.")
            return
        what = f" ({offer.name}, {fmt_bytes(offer.size)})" if offer is not None else ""
        self.note.setText(f"{model.name} is a vision model without its projector{what}: it "
                          "reads text only until the projector is in.")
        self.button.setEnabled(model.repo_id not in self._asking)

    def _offer(self, model: LibraryModel | None) -> ProjectorChoice | None:
        """What the model's repository offers as a projector, if known; asks the Hub once."""
        repo = None if model is None or model.projector is not None else model.repo_id
        if repo is None or repo == BUNDLED:
            return None
        if repo not in self.repo_projectors:
            self._ask_hub(repo)
            return None
        return self.repo_projectors[repo]

    def _ask_hub(self, repo: str, then_queue: LibraryModel | None = None) -> None:
        if repo in self._asking:
            return
        self._asking.add(repo)
        job = self.services.on_net(find_projector, self.services.hub, repo)

        def done(choice: ProjectorChoice | None) -> None:
            self._asking.discard(repo)
            self.repo_projectors[repo] = choice
            if then_queue is not None:
                self._queue(then_queue, choice)
            self.show_for(self.selected())

        def failed(exc: object) -> None:  # offline: a known vision architecture still says so
            self._asking.discard(repo)
            self.repo_projectors[repo] = None  # asked again by "Get projector" only
            if then_queue is not None:
                self.message.emit(f"The projector could not be looked up: {exc}")
            self.show_for(self.selected())

        on_result(job, self, done, failed)

    def _on_get_projector(self) -> None:
        model = self.selected()
        if model is None or model.repo_id is None:
            return
        choice = self.repo_projectors.get(model.repo_id)
        if choice is None:  # not looked up yet, or looked up before it was published
            self.repo_projectors.pop(model.repo_id, None)
            self.button.setEnabled(False)
            self._ask_hub(model.repo_id, then_queue=model)
            return
        self._queue(model, choice)

    def _queue(self, model: LibraryModel, choice: ProjectorChoice | None) -> None:
        if choice is None:
            self.message.emit(f"{model.repo_id} has no projector (mmproj) file on the Hub.")
            return
        self.button.setEnabled(False)
        job = self.services.on_disk(queue_projector, self.services.downloads, model, choice)
        on_result(job, self,
                  lambda _job: self.message.emit(f"Downloading {choice.name} for {model.name} "
                                                 "(Downloads shows its progress)."),
                  lambda exc: self.message.emit(f"Could not queue the projector: {exc}"))
