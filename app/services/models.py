"""What the Models and model Settings pages work with: the Hub, the download queue, the library,
the devices, and the worker threads that keep network and disk off the GUI thread.

    services = ModelServices(settings_controller, user_dirs())
    services.start()                                  # resumes the queue of the last run
    services.download_event.connect(...)              # progress, state changes, notices
    services.library_changed.connect(...)             # list[LibraryModel] after each scan
    services.refresh_library()
    ...
    services.shutdown()                               # at exit: partial downloads resume next time

The download manager reports from its own threads; `download_event` re-emits each report on
the GUI thread. The Hub client follows the settings (token, endpoint) as they change, and so
does the download queue: a new mirror applies to queued jobs and to those in flight at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from app.qt import QtCore, Signal
from app.services.background import BackgroundRunner, Job
from app.services.drafts import DraftVerdicts
from app.services.inbox import Inbox
from app.services.settings import SettingsController
from runtime.downloads.manager import DownloadEvent, DownloadManager, DownloadStateChanged
from runtime.hub.client import Hub
from runtime.library.library import Library, LibraryModel
from runtime.paths import UserDirs
from runtime.planner.devices import Device, list_devices
from runtime.settings.user import AppSettings

DeviceLister = Callable[[], list[Device]]


class ModelServices(QtCore.QObject):
    """Signals:
        download_event(object): a DownloadProgress, DownloadStateChanged, DownloadNotice or
            QueueSaveChanged (the queue file could not be saved: a full disk).
        library_changed(object): the library's models (list[LibraryModel]), after each scan.
        library_failed(str): a scan failed (the message says why).

    Attributes:
        settings: the SettingsController. hub: the current Hub client (replaced when the token
        or endpoint changes). downloads: the DownloadManager. library: the Library.
        devices: lists this machine's devices (injected in tests: a fake GPU).
        models: the last scan's models. net, disk, cpu: worker threads for Hub calls, file
        work and computations (memory plans); long: one for jobs of minutes (making a draft).
    """

    download_event = Signal(object)
    library_changed = Signal(object)
    library_failed = Signal(str)

    def __init__(self, settings: SettingsController, dirs: UserDirs, *,
                 devices: DeviceLister = list_devices,
                 download_options: dict[str, Any] | None = None,
                 parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.dirs = dirs
        self.devices = devices
        current = settings.settings
        self._inbox = Inbox(self)  # download threads → the GUI thread
        self.hub = self._make_hub(current)
        models_dir = current.models_path(dirs.models)
        self.library = Library(models_dir, dirs.cache)
        self.downloads = DownloadManager(
            self.hub, models_dir=models_dir, downloads_dir=dirs.downloads,
            max_concurrent=current.hub.parallel_downloads, on_event=self._relay,
            **(download_options or {}))
        self.models: list[LibraryModel] = []
        self._inbox.received.connect(self.download_event)
        self.net = BackgroundRunner(self)
        self.disk = BackgroundRunner(self)
        self.long = BackgroundRunner(self)
        self.cpu = BackgroundRunner(self)
        self._scanning = False
        self._rescan = False
        self._applied = current
        self.draft_verdicts = DraftVerdicts()  # pair verdicts kept across library scans
        # Set at shutdown so long jobs (making a draft) stop instead of holding the exit.
        self.cancel_events: set[threading.Event] = set()
        settings.changed.connect(self._on_settings)
        self.download_event.connect(self._on_download_event)

    def start(self) -> None:
        """Start the download workers (off the GUI thread: it rewrites the queue file)."""
        self.disk.submit(self.downloads.start)

    def shutdown(self) -> None:
        """Stop the workers. Running downloads stay queued and resume from their partial
        files at the next start."""
        for event in self.cancel_events:
            event.set()
        self.downloads.shutdown(timeout=10)
        self._inbox.close()
        for runner in (self.net, self.disk, self.cpu):
            runner.shutdown()  # a Hub call in flight is abandoned (its result dropped)
        # A quantize job stops its child process within seconds once cancelled; waiting
        # for it leaves no quantizer running and no partial file behind.
        self.long.shutdown(timeout=None)

    # -- the library ---------------------------------------------------------------------

    def refresh_library(self) -> None:
        """Scan the models folder in the background; `library_changed` brings the result.
        Scans asked for while one runs collapse into one more."""
        if self._scanning:
            self._rescan = True
            return
        self._scanning = True
        job = self.disk.submit(self.library.scan)
        job.done.connect(self._on_scanned)
        job.failed.connect(self._on_scan_failed)

    def _on_scanned(self, models: list[LibraryModel]) -> None:
        self._scanning = False
        self.models = list(models)
        self.library_changed.emit(self.models)
        if self._rescan:
            self._rescan = False
            self.refresh_library()

    def _on_scan_failed(self, exc: object) -> None:
        self._scanning = False
        self.library_failed.emit(f"The library could not be read: {exc}")

    # -- background calls ----------------------------------------------------------------

    def on_disk(self, func: Callable[..., Any], *args: Any) -> Job:
        return self.disk.submit(func, *args)

    def on_net(self, func: Callable[..., Any], *args: Any) -> Job:
        return self.net.submit(func, *args)

    def on_cpu(self, func: Callable[..., Any], *args: Any) -> Job:
        """Pure computations that may take more than a few ms (memory plans)."""
        return self.cpu.submit(func, *args)

    # -- settings ------------------------------------------------------------------------

    def _make_hub(self, settings: AppSettings) -> Hub:
        return Hub(token=settings.token(), endpoint=settings.hub.endpoint,
                   cache_dir=self.dirs.cache)

    def _on_settings(self, settings: AppSettings) -> None:
        old, self._applied = self._applied, settings
        if (old.hf_token, old.hub.endpoint) != (settings.hf_token, settings.hub.endpoint):
            self.hub = self._make_hub(settings)
            # Queued jobs and those in flight move to the new endpoint (and token) at once.
            self.downloads.set_hub(self.hub)
        if old.hub.parallel_downloads != settings.hub.parallel_downloads:
            self.downloads.max_concurrent = settings.hub.parallel_downloads
            self.disk.submit(self.downloads.start)  # start more workers if there is room
        models_dir = settings.models_path(self.dirs.models)
        if models_dir != self.library.models_dir:
            self.library = Library(models_dir, self.dirs.cache)
            self.downloads.models_dir = models_dir
            self.refresh_library()

    # -- downloads -----------------------------------------------------------------------

    def _relay(self, event: DownloadEvent) -> None:
        """Called on download threads: the inbox carries the event to the GUI thread."""
        self._inbox.post(event)

    def _on_download_event(self, event: object) -> None:
        if isinstance(event, DownloadStateChanged) and event.job.state == "done":
            self.refresh_library()
