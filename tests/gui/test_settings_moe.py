"""The Settings page's "MoE experts on CPU": shown only for a mixture-of-experts model, it
re-plans live and is remembered per file (fake devices)."""

from __future__ import annotations

from pathlib import Path

from app.services.models import ModelServices
from app.services.settings import SettingsController
from runtime.gguf.info import read_model_info
from runtime.planner.plan import plan_memory
from runtime.settings.load import LoadSettings
from tests.fixtures.tiny_moe_gguf import MOE, write_tiny_moe_gguf
from tests.gui.model_helpers import Devices, cpu, gpu
from tests.gui.test_settings_page import WAIT, open_page, put_in_library, wait_plan

pytest_plugins = ["tests.gui.model_fixtures"]


def test_the_row_is_hidden_for_a_dense_model(qtbot, settings_ctl: SettingsController,
                                             services: ModelServices, tiny_target: Path) -> None:
    page = open_page(qtbot, settings_ctl, services, put_in_library(tiny_target))
    assert page.form.cpu_moe.isHidden()


def test_experts_on_cpu_replan_and_are_remembered(qtbot, settings_ctl: SettingsController,
                                                  services: ModelServices, devices: Devices,
                                                  tmp_path: Path) -> None:
    devices.now = [gpu(), cpu()]
    path = put_in_library(write_tiny_moe_gguf(tmp_path / "tiny-moe.gguf"))
    page = open_page(qtbot, settings_ctl, services, path)
    spin = page.form.cpu_moe
    assert not spin.isHidden() and (spin.minimum(), spin.maximum()) == (-1, MOE.n_layer)
    assert spin.value() == 0

    spin.setValue(2)
    info = read_model_info(path)
    expected = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096, cpu_moe=2), devices())
    wait_plan(qtbot, page, expected)
    assert expected.cpu_moe_layers == 2
    qtbot.waitUntil(lambda: settings_ctl.settings.model_prefs(path).load.cpu_moe == 2,
                    timeout=WAIT)

    spin.setValue(MOE.n_layer)
    qtbot.waitUntil(lambda: settings_ctl.settings.model_prefs(path).load.cpu_moe == "all",
                    timeout=WAIT)
    spin.setValue(-1)
    assert spin.text() == "auto (most on the GPU that fit)"
    qtbot.waitUntil(lambda: settings_ctl.settings.model_prefs(path).load.cpu_moe == "auto",
                    timeout=WAIT)
