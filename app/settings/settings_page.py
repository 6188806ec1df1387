"""The Settings page: App (folders, Hub, token, server, theme) and Model (per model file).

    page = SettingsPage(settings_controller, services, default_models_dir=dirs.models)
    page.model.load_requested.connect(picker.load)
    page.model.reload_requested.connect(picker.load)
    models_page.settings_requested.connect(page.show_model)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.qt import QtWidgets
from app.services.models import ModelServices
from app.services.settings import SettingsController
from app.settings.app_settings_page import AppSettingsPage
from app.settings.model_settings_page import ModelSettingsPage

APP, MODEL = range(2)


class SettingsPage(QtWidgets.QTabWidget):
    """Attributes: app — the AppSettingsPage; model — the ModelSettingsPage."""

    def __init__(self, settings: SettingsController, services: ModelServices, *,
                 default_models_dir: Path, app_options: dict[str, Any] | None = None,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.app = AppSettingsPage(settings, default_models_dir=default_models_dir,
                                   **(app_options or {}))
        self.model = ModelSettingsPage(settings, services)
        scroll = QtWidgets.QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.app)
        self.addTab(scroll, "App")
        self.addTab(self.model, "Model")

    def show_model(self, path: Path) -> None:
        """Open the Model tab on `path`."""
        self.setCurrentIndex(MODEL)
        self.model.show_model(Path(path))
