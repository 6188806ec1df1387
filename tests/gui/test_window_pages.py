"""The Models and Settings pages inside the main window: Load from the library and from the
Settings page reaches the engine with the model's remembered settings, the chat's picker lists
the library and loads with the same settings, new chats take the model's sampling defaults,
the theme setting applies, the server settings apply at the engine's restart, settings survive
a restart of the window, and a bad settings file is reported without stopping the app."""

from __future__ import annotations

import dataclasses
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.chat.conversation import DEFAULT_SAMPLING
from app.engine.client import EngineState
from app.engine.process import EngineListen
from app.models.models_page import LIBRARY, ModelsPage
from app.qt import Qt, QtGui, QtWidgets
from app.server.page import describe_listen
from app.settings.settings_page import SettingsPage
from app.theme import DARK, LIGHT, system_palette
from app.window import CHAT, MODELS, SERVER, SETTINGS, MainWindow
from runtime.events import SamplingParams
from runtime.paths import user_dirs
from runtime.settings.load import LoadSettings
from runtime.settings.user import AppSettings, ModelPrefs, Secret, ServerSettings
from tests.gui.conftest import WindowFactory, fake_command, load

WAIT = 20_000


def put_in_library(source: Path, repo: str = "owner/repo") -> Path:
    dest = user_dirs().models / repo / source.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def record_loads(window: MainWindow, monkeypatch: pytest.MonkeyPatch) -> list[LoadSettings]:
    """Every LoadSettings the engine client is asked to load (then loaded as usual)."""
    loads: list[LoadSettings] = []
    real = window.client.load

    def load_and_record(settings: LoadSettings) -> object:
        loads.append(settings)
        return real(settings)

    monkeypatch.setattr(window.client, "load", load_and_record)
    return loads


def wait_ready(qtbot, window: MainWindow, loads: list[LoadSettings], n: int) -> None:
    qtbot.waitUntil(lambda: len(loads) == n and window.client.state == EngineState.READY,
                    timeout=WAIT)


def open_library(qtbot, window: MainWindow, path: Path) -> None:
    window.show_page(MODELS)
    window.models_page.setCurrentIndex(LIBRARY)
    library = window.models_page.library
    qtbot.waitUntil(lambda: any(m.path == path for m in library.models), timeout=WAIT)
    library.select(path)


def window_color() -> str:
    return QtWidgets.QApplication.instance().palette().color(QtGui.QPalette.ColorRole.Window).name()


@pytest.fixture
def restore_theme(qapp: QtWidgets.QApplication) -> Iterator[None]:
    """The theme tests change the application's palette and style sheet: put them back."""
    palette, sheet = QtGui.QPalette(qapp.palette()), qapp.styleSheet()
    yield
    qapp.setStyleSheet(sheet)
    qapp.setPalette(palette)


def test_library_load_reaches_the_engine_with_the_remembered_settings(
        qtbot, make_window: WindowFactory, tiny_target: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = put_in_library(tiny_target)
    window = make_window(fake_command())
    assert isinstance(window.models_page, ModelsPage)
    assert window.pages.widget(MODELS).isAncestorOf(window.models_page)
    assert isinstance(window.settings_page, SettingsPage)
    assert window.pages.widget(SETTINGS).isAncestorOf(window.settings_page)
    remembered = LoadSettings(model_path=path, n_ctx=1024, type_k="q8_0", type_v="q8_0",
                              n_threads=1)
    window.settings.update_model(path, ModelPrefs(remembered))
    loads = record_loads(window, monkeypatch)

    open_library(qtbot, window, path)
    assert window.picker.combo.findData(str(path)) >= 0  # the chat's picker lists the library
    window.models_page.library.buttons["load"].click()
    assert window.pages.currentIndex() == CHAT  # where the load's progress shows
    wait_ready(qtbot, window, loads, 1)
    assert loads == [remembered]
    assert window.client.model.n_ctx == 1024  # what the (fake) engine was sent
    assert window.settings_page.model._loaded == path  # for the quant switch's reload


def test_settings_page_load_and_the_pickers_load_use_the_settings_shown(
        qtbot, make_window: WindowFactory, tiny_target: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = put_in_library(tiny_target)
    window = make_window(fake_command())
    loads = record_loads(window, monkeypatch)
    open_library(qtbot, window, path)
    window.models_page.library.buttons["settings"].click()
    assert window.pages.currentIndex() == SETTINGS
    page = window.settings_page.model
    assert page.path == path
    qtbot.waitUntil(lambda: page.plan_view.plan is not None, timeout=WAIT)

    page.form.n_ctx.setValue(1536)
    page.load_button.click()
    wait_ready(qtbot, window, loads, 1)
    assert loads[0].model_path == path and loads[0].n_ctx == 1536
    assert window.pages.currentIndex() == SETTINGS  # stays, to watch the plan and panels
    assert window.settings.settings.model_prefs(path).load == loads[0]

    window.show_page(CHAT)
    window.picker.select(path)
    window.picker.load_button.click()  # the chat header's Load: the remembered settings
    wait_ready(qtbot, window, loads, 2)
    assert loads[1] == loads[0]

    other = dataclasses.replace(loads[0], n_ctx=512)
    page.reload_requested.emit(other)  # a quant switch: exactly these settings, no plan
    assert loads[2] == other
    wait_ready(qtbot, window, loads, 3)


def test_new_chats_take_the_models_remembered_sampling(qtbot, make_window: WindowFactory,
                                                        tiny_target: Path) -> None:
    path = put_in_library(tiny_target)
    window = make_window(fake_command())
    controller = window.controller
    assert controller.new_conversation().sampling == DEFAULT_SAMPLING  # no model yet
    sampling = SamplingParams(temperature=0.2, top_k=5, max_tokens=77)
    window.settings.update_model(path, ModelPrefs(LoadSettings(model_path=path), sampling))
    load(qtbot, window, path)
    chat = controller.new_conversation()
    assert chat.sampling == sampling
    own = dataclasses.replace(sampling, temperature=1.1)
    controller.set_sampling(own)  # a chat's own sampling is its own
    assert controller.store.conversation(chat.id).sampling == own


def test_theme_setting_applies_at_once_and_at_start(qtbot, make_window: WindowFactory,
                                                     restore_theme: None) -> None:
    window = make_window(fake_command())
    window.settings.update(dataclasses.replace(window.settings.settings, theme="dark"))
    assert window_color() == DARK.window
    window._on_color_scheme(Qt.ColorScheme.Light)  # the OS's scheme no longer decides
    assert window_color() == DARK.window

    window.show_page(SETTINGS)
    window.settings_page.app.theme.setCurrentText("light")  # the App tab's combo
    assert window.settings.settings.theme == "light"
    assert window_color() == LIGHT.window
    window.settings_page.app.theme.setCurrentText("system")
    assert window_color() == system_palette(QtWidgets.QApplication.instance()).window

    window.settings_page.app.theme.setCurrentText("dark")
    window.close()
    again = make_window(fake_command(), palette=None)  # as at start-up: the saved theme
    assert again.settings.settings.theme == "dark"
    assert window_color() == DARK.window


def test_settings_survive_a_window_restart(qtbot, make_window: WindowFactory,
                                           tiny_target: Path) -> None:
    path = put_in_library(tiny_target)
    window = make_window(fake_command())
    app_page = window.settings_page.app
    app_page.parallel.setValue(3)
    app_page.preferred.setCurrentText("Q8_0")
    window.show_model_settings(path)
    page = window.settings_page.model
    qtbot.waitUntil(lambda: page.plan_view.plan is not None, timeout=WAIT)
    page.form.n_ctx.setValue(3072)
    window.close()  # before the save timer: closing writes the edit

    again = make_window(fake_command())
    saved = again.settings.settings
    assert saved.hub.parallel_downloads == 3 and saved.hub.preferred_quant == "Q8_0"
    assert saved.model_prefs(path).load.n_ctx == 3072
    assert again.settings_page.app.parallel.value() == 3
    assert again.pages.currentIndex() == SETTINGS  # the page shown at close


def test_a_bad_settings_file_is_reported_and_the_app_still_opens(
        qtbot, make_window: WindowFactory, tiny_target: Path) -> None:
    settings_file = user_dirs().settings_file
    settings_file.parent.mkdir(parents=True, exist_ok=True)
    settings_file.write_text("theme = 'purple'\n")
    window = make_window(fake_command())
    message = window.statusBar().currentMessage()
    assert "theme" in message and "settings.toml.bad" in message
    assert settings_file.with_name("settings.toml.bad").is_file()
    assert window.settings.settings == AppSettings()
    app_page = window.settings_page.app
    assert app_page.problem.isVisibleTo(app_page) and "purple" in app_page.problem.text()
    load(qtbot, window, put_in_library(tiny_target))  # and the app works


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_server_settings_apply_when_the_engine_restarts(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    window.show_page(SERVER)
    page = window.server
    # 1234 unless another program (another test run) holds it: then the page names it.
    assert page.config_label.text() in ("Port 1234 on this computer only, no API key needed.",
                                        describe_listen(EngineListen(), port_taken=1234))
    assert not page.pending_label.isVisible()
    before = window.client.address
    port = free_port()
    window.settings.update(dataclasses.replace(
        window.settings.settings, server=ServerSettings(port=port),
        server_api_key=Secret("sk-test-key")))
    assert page.config_label.text() == f"Port {port} on this computer only, with your API key."
    assert page.pending_label.isVisible()
    assert window.client.address == before  # nothing changes until the restart

    with qtbot.waitSignal(window.client.state_changed, timeout=WAIT,
                          check_params_cb=lambda s: s == EngineState.READY):
        page.restart_button.click()
    address = window.client.address
    assert address.url == f"http://127.0.0.1:{port}" and address.api_key == "sk-test-key"
    assert page.url_label.text() == address.url
    assert not page.pending_label.isVisible()
    assert window.client.model is not None  # the model came back with the engine

    # Network access without a key: the engine would stay on this computer, and says why.
    window.settings.update(dataclasses.replace(
        window.settings.settings, server=ServerSettings(port=port, allow_network=True),
        server_api_key=None))
    assert window.client.process.listen == EngineListen(port=port)
    assert "needs an API key" in page.config_label.text()
    assert page.pending_label.isVisible()
