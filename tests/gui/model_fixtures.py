"""Fixtures for the Models and Settings pages: the settings controller, the services over the
fake hub, and devices the tests choose (so fit verdicts do not depend on this machine).
A test module takes them with

    pytest_plugins = ["tests.gui.model_fixtures"]
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import huggingface_hub
import pytest

from app.services.models import ModelServices
from app.services.settings import SettingsController
from tests.gui.model_helpers import Devices, make_services
from tests.hubserver import FakeHub
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)


@pytest.fixture
def hub(fake_hub: FakeHub) -> Iterator[FakeHub]:  # noqa: F811
    """The fake hub; afterwards huggingface_hub's pooled connections are closed and the
    server's connection threads given time to end (the GUI tests fail on leaked threads)."""
    before = set(threading.enumerate())
    yield fake_hub
    fake_hub.release_stalls()
    huggingface_hub.close_session()
    for t in set(threading.enumerate()) - before:
        if "process_request" in t.name:
            t.join(timeout=10)


@pytest.fixture
def settings_ctl(qtbot: object) -> Iterator[SettingsController]:
    ctl = SettingsController.open()
    yield ctl
    ctl.shutdown()


@pytest.fixture
def devices() -> Devices:
    return Devices()


@pytest.fixture
def services(hub: FakeHub, settings_ctl: SettingsController,
             devices: Devices) -> Iterator[ModelServices]:
    made: list[ModelServices] = []
    yield make_services(settings_ctl, devices, made)
    for s in made:
        s.shutdown()


