"""A mirror chosen in Settings → App reaches the download queue at once: a job retrying an
unreachable endpoint finishes from the new one without waiting out its backoff, in this run."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator

import pytest

from app.services.models import ModelServices
from app.services.settings import SettingsController
from runtime.downloads.manager import DownloadNotice, DownloadStateChanged
from runtime.downloads.queue import RetryPolicy
from runtime.paths import user_dirs
from tests.gui.model_helpers import Devices
from tests.hubserver import TINY_REPO, FakeHub

pytest_plugins = ["tests.gui.model_fixtures"]
WAIT = 20_000
FILE = "tiny-F32.gguf"
# After the first refusal a job would wait ten minutes before it tries again.
PATIENT = RetryPolicy(max_attempts=8, initial_delay=600.0, max_delay=600.0, stall_timeout=5.0,
                      connect_timeout=5.0)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def use_endpoint(settings_ctl: SettingsController, endpoint: str) -> None:
    s = settings_ctl.settings
    settings_ctl.update(dataclasses.replace(s, hub=dataclasses.replace(s.hub, endpoint=endpoint)))


@pytest.fixture
def patient_services(hub: FakeHub, settings_ctl: SettingsController,
                     devices: Devices) -> Iterator[ModelServices]:
    use_endpoint(settings_ctl, f"http://127.0.0.1:{closed_port()}")
    services = ModelServices(settings_ctl, user_dirs(), devices=devices,
                             download_options={"retry": PATIENT, "progress_interval": 0.0})
    services.start()
    yield services
    services.shutdown()


def test_a_new_mirror_takes_over_a_retrying_download(
        qtbot, patient_services: ModelServices, settings_ctl: SettingsController,
        hub: FakeHub) -> None:
    services = patient_services
    with qtbot.waitSignal(services.download_event, timeout=WAIT,
                          check_params_cb=lambda e: isinstance(e, DownloadNotice)
                          and "retrying in 600.0 s" in e.message):
        services.on_disk(services.downloads.enqueue, TINY_REPO, FILE)
    with qtbot.waitSignal(services.download_event, timeout=WAIT,
                          check_params_cb=lambda e: isinstance(e, DownloadStateChanged)
                          and e.job.state == "done"):
        use_endpoint(settings_ctl, hub.url)  # the user sets a mirror that answers
    assert hub.stats(TINY_REPO, FILE).gets == 1
    assert hub.url in repr(services.downloads)
