"""Vision models in the app: the load settings that bring a model's projector, the plan that
counts it, and fetching a projector that is missing.

    settings = load_settings_for(app_settings, path)     # the remembered settings + mmproj beside it
    plan = plan_model(settings)                          # a MemoryPlan dict: projector, draft
    choice = find_projector(hub, "ggml-org/gemma-3-4b-it-GGUF")   # on the network thread
    job = queue_projector(manager, model, choice)        # on the disk thread: same queue, resumable

The pairing rule itself is `runtime.library.projectors` (the projector in a library model's
folder); every app path that loads a library model goes through `load_settings_for` or
`paired`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.downloads.manager import DownloadJob, DownloadManager
from runtime.errors import OutriderError
from runtime.gguf.info import ModelInfo, read_model_info
from runtime.gguf.projector import ProjectorInfo, read_projector_info
from runtime.hub.client import Hub
from runtime.hub.quants import ProjectorChoice, choose_projector
from runtime.library.library import LibraryModel
from runtime.library.projectors import library_roots, with_projector
from runtime.paths import user_dirs
from runtime.planner.gpu_layers import read_draft_info
from runtime.planner.plan import plan_memory
from runtime.settings.load import LoadSettings
from runtime.settings.user import AppSettings

__all__ = ["find_projector", "load_settings_for", "paired", "plan_model", "projector_info_for",
           "queue_projector"]


def roots_of(app: AppSettings) -> tuple[Path, ...]:
    """The folders whose models pair with their projector, the settings' models folder first."""
    return library_roots(app.models_path(user_dirs().models))


def paired(app: AppSettings, load: LoadSettings) -> LoadSettings:
    """`load` with the projector beside a library model, when it names none."""
    return with_projector(load, roots_of(app))


def load_settings_for(app: AppSettings, path: Path) -> LoadSettings:
    """How the app loads the model file `path`: its remembered settings, with its projector
    beside it when they name none."""
    return paired(app, app.model_prefs(path).load)


def projector_info_for(settings: LoadSettings,
                       roots: tuple[Path, ...] | None = None) -> ProjectorInfo | None:
    """The header of the projector `settings` would load (theirs, else the one beside a
    library model); None for a text model. A projector that cannot be read is a typed error."""
    path = with_projector(settings, roots).mmproj_path
    return None if path is None else read_projector_info(path)


def plan_model(settings: LoadSettings, devices: list[Any] | None = None) -> dict[str, Any]:
    """The memory plan of `settings` as a dict (`MemoryPlan.to_dict()`), its projector and
    its draft model counted, as the engine's plan of the load counts them
    (`runtime.planner.gpu_layers`): what the model picker shows before a load (disk: call it
    off the GUI thread)."""
    info: ModelInfo = read_model_info(settings.model_path)
    return plan_memory(info, settings, devices, draft=read_draft_info(settings),
                       projector=projector_info_for(settings)).to_dict()


def find_projector(hub: Hub, repo_id: str) -> ProjectorChoice | None:
    """The projector a repository offers (F16, else the smallest); None when it has none
    (network: call it on the network thread)."""
    return choose_projector(hub.repo_details(repo_id))


def queue_projector(manager: DownloadManager, model: LibraryModel,
                    choice: ProjectorChoice) -> DownloadJob:
    """Queue `choice` into `model`'s folder (its repository's), through the download manager:
    resumed and verified as any download (disk: call it off the GUI thread)."""
    if model.repo_id is None:
        raise OutriderError(f"{model.name} came from no known repository: put its projector "
                            "(the mmproj .gguf) in the same folder")
    return manager.enqueue(model.repo_id, choice.name, size=choice.file.size,
                           sha256=choice.file.sha256, group=f"{model.repo_id}:projector")
