"""The Models page: Discover · Repository · Downloads · Library, as tabs.

    page = ModelsPage(services)                       # app.services.models.ModelServices
    page.load_requested.connect(picker.load)          # LoadSettings
    page.settings_requested.connect(settings_page.show_model)

Opening a search hit shows its repository tab; a finished download refreshes the library.
"""

from __future__ import annotations

from typing import Any

from app.models.discover_page import DiscoverPage
from app.models.downloads_page import DownloadsPage
from app.models.library_page import LibraryPage
from app.models.repo_page import RepoPage
from app.qt import QtWidgets, Signal
from app.services.models import ModelServices
from app.token_dialog import TokenPrompt, ask_token

DISCOVER, REPOSITORY, DOWNLOADS, LIBRARY = range(4)


class ModelsPage(QtWidgets.QTabWidget):
    """Signals:
        load_requested(LoadSettings): the user pressed Load on a library model.
        settings_requested(object): the Path of a model whose load settings to show.
        app_settings_requested(): Settings → App (the Hub mirror), from a failed Hub call.
        message(str): a line for the status bar.

    Attributes: discover, repo, downloads, library — the four tabs.
    """

    load_requested = Signal(object)
    settings_requested = Signal(object)
    app_settings_requested = Signal()
    message = Signal(str)

    def __init__(self, services: ModelServices, *, ask_token: TokenPrompt = ask_token,
                 library_options: dict[str, Any] | None = None, debounce_ms: int = 350,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.discover = DiscoverPage(services, debounce_ms=debounce_ms)
        self.repo = RepoPage(services, ask_token=ask_token)
        self.downloads = DownloadsPage(services, ask_token=ask_token)
        self.library = LibraryPage(services, **(library_options or {}))
        self.addTab(self.discover, "Discover")
        self.addTab(self.repo, "Repository")
        self.addTab(self.downloads, "Downloads")
        self.addTab(self.library, "Library")
        self.setTabEnabled(REPOSITORY, False)

        self.discover.repo_activated.connect(self.open_repo)
        self.discover.settings_requested.connect(self.app_settings_requested)
        self.repo.settings_requested.connect(self.app_settings_requested)
        self.repo.back_requested.connect(lambda: self.setCurrentIndex(DISCOVER))
        self.repo.download_started.connect(self._on_download_started)
        self.downloads.count_changed.connect(self._on_download_count)
        self.downloads.finished.connect(
            lambda job: self.message.emit(f"Downloaded {job.filename}: it is in the library."))
        self.library.load_requested.connect(self.load_requested)
        self.library.settings_requested.connect(self.settings_requested)
        self.library.message.connect(self.message)
        services.refresh_library()

    def open_repo(self, repo_id: str) -> None:
        self.setTabEnabled(REPOSITORY, True)
        self.setTabText(REPOSITORY, repo_id.split("/")[-1])
        self.setCurrentIndex(REPOSITORY)
        self.repo.open_repo(repo_id)

    def _on_download_started(self, jobs: list[Any]) -> None:
        names = ", ".join(j.filename for j in jobs)
        self.message.emit(f"Downloading {names} (see Downloads).")

    def _on_download_count(self, active: int) -> None:
        self.setTabText(DOWNLOADS, f"Downloads ({active})" if active else "Downloads")
