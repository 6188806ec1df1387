"""The local API: a fixed, remembered port (1234 by default) on this computer without a key; a
port another program holds is named and the engine runs anyway; a stop on purpose is no crash."""

from __future__ import annotations

import dataclasses
import socket
import urllib.request

from app.engine import process as process_module
from app.engine.client import EngineState
from app.engine.process import EngineCommand, EngineListen
from app.window import SERVER, MainWindow
from runtime.settings.user import ServerSettings

WAIT = 20_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def restart(qtbot, window: MainWindow) -> None:
    with qtbot.waitSignal(window.client.state_changed, timeout=WAIT,
                          check_params_cb=lambda s: s == EngineState.READY):
        window.server.restart_button.click()


def test_default_is_port_1234_on_this_computer_without_a_key() -> None:
    assert EngineListen() == EngineListen("127.0.0.1", 1234, None)
    assert ServerSettings().port == 1234


def test_the_port_is_remembered_and_needs_no_key_on_this_computer(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    port = free_port()
    window.settings.update(dataclasses.replace(window.settings.settings,
                                               server=ServerSettings(port=port)))
    window.show_page(SERVER)
    for _ in range(2):  # the same address at every start
        restart(qtbot, window)
        address = window.client.address
        assert address is not None and address.url == f"http://127.0.0.1:{port}"
        assert address.api_key == ""
    # Another tool on this computer needs no key.
    with urllib.request.urlopen(f"{address.url}/v1/models", timeout=10) as reply:
        assert reply.status == 200
    assert window.server.key_label.text() == "none needed on this computer"
    assert "Authorization" not in window.server.connect_panel.text(masked=False)
    assert window.client.model is not None  # the model came back with the engine


def test_a_port_held_by_another_program_is_named(qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = int(other.getsockname()[1])
        window.settings.update(dataclasses.replace(window.settings.settings,
                                                   server=ServerSettings(port=held)))
        window.show_page(SERVER)
        restart(qtbot, window)
        address = window.client.address
        assert address is not None and not address.url.endswith(f":{held}")
        assert window.server.config_label.text().startswith(
            f"Port {held} is used by another program")


def test_a_port_taken_between_the_check_and_the_bind_is_named_too(
        qtbot, fake_window: MainWindow, monkeypatch) -> None:
    """The check says free, another program binds first: the engine exits "already in use"
    before it is ready, and the app starts it again on a free port, as for a taken port."""
    window = fake_window
    monkeypatch.setattr(process_module, "port_is_free", lambda host, port: True)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = int(other.getsockname()[1])
        window.settings.update(dataclasses.replace(window.settings.settings,
                                                   server=ServerSettings(port=held)))
        window.show_page(SERVER)
        restart(qtbot, window)
        address = window.client.address
        assert address is not None and not address.url.endswith(f":{held}")
        assert window.server.config_label.text().startswith(
            f"Port {held} is used by another program")


def test_stopping_the_api_keeps_the_chats_model_and_is_no_crash(
        qtbot, fake_window: MainWindow) -> None:
    window = fake_window
    port = free_port()
    window.settings.update(dataclasses.replace(window.settings.settings,
                                               server=ServerSettings(port=port)))
    window.show_page(SERVER)
    restart(qtbot, window)
    page, client = window.server, window.client
    model = client.model
    assert model is not None
    with qtbot.waitSignal(client.model_changed, timeout=WAIT,
                          check_params_cb=lambda m: m is not None):
        page.stop_button.click()
    assert client.model == model  # the chat has its model again, on a private address
    assert client.address is not None and not client.address.url.endswith(f":{port}")
    assert client.address.api_key  # private: a random key no other program knows
    assert client.last_exit is not None and client.last_exit.expected
    assert not client.last_exit.crashed and page.crash_label.isHidden()
    assert page.start_api_button.isVisibleTo(page) and not page.stop_button.isVisibleTo(page)
    with qtbot.waitSignal(client.model_changed, timeout=WAIT,
                          check_params_cb=lambda m: m is not None):
        page.start_api_button.click()
    assert client.address is not None and client.address.url == f"http://127.0.0.1:{port}"
    assert not page.pending_label.isVisible()


def test_the_saved_kv_budget_reaches_the_engine(
        qtbot, fake_window: MainWindow, monkeypatch) -> None:
    """Settings → the engine's next start: `--saved-kv-gib` from the app's settings."""
    window = fake_window
    started: list[list[str]] = []
    real = EngineCommand.argv

    def recording(self: EngineCommand, *args: object, **kwargs: object) -> list[str]:
        argv = real(self, *args, **kwargs)  # type: ignore[arg-type]
        started.append(argv)
        return argv

    monkeypatch.setattr(EngineCommand, "argv", recording)
    window.settings.update(dataclasses.replace(window.settings.settings, saved_kv_gib=1.5))
    restart(qtbot, window)
    assert started and started[-1][-2:] == ["--saved-kv-gib", "1.5"]
