"""Helpers for the Models and Settings page tests: devices the test chooses, services over
the fake hub with quick retries."""

from __future__ import annotations

from collections.abc import Callable

from app.services.models import ModelServices
from app.services.settings import SettingsController
from runtime.downloads.manager import RetryPolicy
from runtime.paths import user_dirs
from runtime.planner.devices import Device

GiB = 1 << 30
# Quick retries; a stall is noticed only after 20 s, far beyond any test's pause.
FAST = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05, stall_timeout=20.0,
                   connect_timeout=5.0)


def cpu(free: int = 16 * GiB) -> Device:
    return Device("cpu", "Test CPU", "cpu", 64 * GiB, free)


def gpu(free: int = 24 * GiB) -> Device:
    return Device("cuda:0", "Test GPU", "cuda", 24 * GiB, free)


class Devices:
    """A device list the test can change: `devices.now = [gpu(), cpu()]`."""

    def __init__(self) -> None:
        self.now: list[Device] = [cpu()]

    def __call__(self) -> list[Device]:
        return list(self.now)


def make_services(settings_ctl: SettingsController, devices: Callable[[], list[Device]],
                  made: list[ModelServices] | None = None) -> ModelServices:
    s = ModelServices(settings_ctl, user_dirs(), devices=devices,
                      download_options={"retry": FAST, "progress_interval": 0.0})
    s.start()
    if made is not None:
        made.append(s)
    return s
