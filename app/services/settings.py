"""The app settings as the GUI holds them: one current `AppSettings`, saved in the background.

    controller = SettingsController.open()            # reads settings.toml (at start-up)
    if controller.startup_problem:                    # a bad file was kept aside
        window.statusBar().showMessage(controller.startup_problem)
    controller.changed.connect(on_settings)
    controller.update(dataclasses.replace(controller.settings, theme="dark"))
    ...
    controller.shutdown()                             # writes anything not yet saved

Every change is written by a worker thread (`BackgroundRunner`), coalesced: while one save
runs, later changes wait and only the newest is written next.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.qt import QtCore, Signal
from app.services.background import BackgroundRunner
from runtime.errors import OutriderError
from runtime.settings.user import AppSettings, ModelPrefs, Secret, SettingsStore


class SettingsController(QtCore.QObject):
    """Signals:
        changed(AppSettings): the settings changed (emitted before they are written).
        saved(AppSettings): this version is on disk.
        save_failed(str): writing failed; the message says why (the settings stay in memory).

    Attributes:
        settings: the current AppSettings. startup_problem: the message of a bad file at
        start-up (kept aside as settings.toml.bad), else None.
    """

    changed = Signal(object)
    saved = Signal(object)
    save_failed = Signal(str)

    def __init__(self, store: SettingsStore, settings: AppSettings | None = None,
                 startup_problem: str | None = None,
                 parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.settings = settings if settings is not None else AppSettings()
        self.startup_problem = startup_problem
        self._runner = BackgroundRunner(self)
        self._version = 0
        self._saved_version = 0
        self._saving = False

    @classmethod
    def open(cls, store: SettingsStore | None = None,
             parent: QtCore.QObject | None = None) -> SettingsController:
        """Read the files now (start-up, before the window shows); a bad file is kept aside
        and reported in `startup_problem` instead of stopping the app."""
        store = store or SettingsStore()
        settings, problem = store.load_or_reset()
        return cls(store, settings, problem, parent)

    # -- changing ------------------------------------------------------------------------

    def update(self, settings: AppSettings) -> None:
        if settings == self.settings:
            return
        self.settings = settings
        self._version += 1
        self.changed.emit(settings)
        self._save_soon()

    def update_model(self, path: Path, prefs: ModelPrefs) -> None:
        """Remember `prefs` for the model file `path`."""
        self.update(self.settings.with_model(path, prefs))

    def set_token(self, token: str | None) -> None:
        """Store (or, with None or blank, forget) the Hugging Face token."""
        secret = Secret(token) if token and token.strip() else None
        self.update(dataclasses.replace(self.settings, hf_token=secret))

    # -- saving --------------------------------------------------------------------------

    def _save_soon(self) -> None:
        if self._saving:
            return  # the running save's completion writes the newest version next
        self._saving = True
        version, settings = self._version, self.settings
        job = self._runner.submit(self.store.save, settings)
        job.done.connect(lambda _r: self._on_saved(version, settings))
        job.failed.connect(self._on_save_failed)

    def _on_saved(self, version: int, settings: AppSettings) -> None:
        self._saving = False
        self._saved_version = version
        if self._version != version:
            self._save_soon()
        else:
            self.saved.emit(settings)

    def _on_save_failed(self, exc: object) -> None:
        self._saving = False
        reason = str(exc) if isinstance(exc, OutriderError | OSError) else repr(exc)
        self.save_failed.emit(f"The settings could not be saved: {reason}")

    @property
    def pending(self) -> bool:
        """True while a change is not yet on disk."""
        return self._saved_version != self._version

    def shutdown(self) -> None:
        """Stop the worker and write what is not saved yet (at exit: no change is lost)."""
        # Wait for a save in flight: its rename must not land after the final save below.
        self._runner.shutdown(timeout=None)
        if self.pending:
            try:
                self.store.save(self.settings)
                self._saved_version = self._version
            except OSError as exc:
                self.save_failed.emit(f"The settings could not be saved: {exc}")
