"""Settings → App → API key: a generated key shows in clear text at once and stays so until
the user presses Hide (it used to be saved and the field emptied in the same click, so the key
could not be copied); Show brings the saved key back."""

from __future__ import annotations

from pathlib import Path

from app.qt import QtWidgets
from app.services.settings import SettingsController
from app.settings.app_settings_page import AppSettingsPage

pytest_plugins = ["tests.gui.model_fixtures"]  # its fixtures: settings_ctl …
NORMAL = QtWidgets.QLineEdit.EchoMode.Normal
PASSWORD = QtWidgets.QLineEdit.EchoMode.Password


def generate_button(page: AppSettingsPage) -> QtWidgets.QPushButton:
    [button] = [b for b in page.findChildren(QtWidgets.QPushButton) if b.text() == "Generate"]
    return button


def test_a_generated_key_stays_visible_until_the_user_hides_it(
        qtbot, settings_ctl: SettingsController, tmp_path: Path) -> None:
    page = AppSettingsPage(settings_ctl, default_models_dir=tmp_path)
    qtbot.addWidget(page)
    assert page.api_key.echoMode() == PASSWORD and page.api_key.text() == ""

    generate_button(page).click()
    saved = settings_ctl.settings.server_api_key
    assert saved is not None and saved.reveal().startswith("sk-outrider-")
    assert page.api_key.text() == saved.reveal()  # the key itself, in clear text
    assert page.api_key.echoMode() == NORMAL
    assert page.show_key.isChecked() and page.show_key.text() == "Hide"

    page.port.setValue(page.port.value() + 1)  # another setting saved: the key stays shown
    assert page.api_key.text() == saved.reveal() and page.api_key.echoMode() == NORMAL

    page.show_key.click()  # Hide
    assert page.api_key.echoMode() == PASSWORD and page.api_key.text() == ""
    assert page.show_key.text() == "Show"
    assert settings_ctl.settings.server_api_key == saved  # hiding keeps the key

    page.show_key.click()  # Show: the saved key again
    assert page.api_key.text() == saved.reveal() and page.api_key.echoMode() == NORMAL
