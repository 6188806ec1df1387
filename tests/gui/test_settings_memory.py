"""The memory settings on the Settings pages: the disk kept for saved conversations' KV
caches (App), the sliding-window line of the plan and "MoE experts on CPU" in words with
what "auto" chose (Model). Fake devices; offscreen."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.qt import QtWidgets
from app.services.models import ModelServices
from app.services.settings import SettingsController
from app.settings.app_settings_page import AppSettingsPage
from app.settings.plan_view import experts_text, sliding_window_text
from runtime.gguf.info import read_model_info
from runtime.planner.plan import plan_memory
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.settings.user import SettingsStore
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import SWA_TARGET
from tests.fixtures.tiny_moe_gguf import MOE, write_tiny_moe_gguf
from tests.gui.model_helpers import Devices, cpu, gpu
from tests.gui.test_settings_page import WAIT, open_page, put_in_library, wait_plan

pytest_plugins = ["tests.gui.model_fixtures"]


def test_the_saved_kv_budget_is_a_field_and_is_remembered(
        qtbot, settings_ctl: SettingsController, tmp_path: Path) -> None:
    page = AppSettingsPage(settings_ctl, default_models_dir=tmp_path)
    qtbot.addWidget(page)
    box = next(b for b in page.findChildren(QtWidgets.QGroupBox)
               if b.title() == "Saved conversations")
    assert page.saved_kv in box.findChildren(QtWidgets.QDoubleSpinBox)
    assert page.saved_kv.text() == "4.0 GiB"  # the default
    assert "Applies when the engine next starts" in page.saved_kv_note.text()

    page.saved_kv.setValue(1.5)
    assert settings_ctl.settings.saved_kv_gib == 1.5
    qtbot.waitUntil(lambda: not settings_ctl.pending, timeout=WAIT)
    assert SettingsStore(settings_ctl.store.path).load().saved_kv_gib == 1.5  # on disk

    page.saved_kv.setValue(0)
    assert page.saved_kv.text() == "off (every chat recomputes its prompt)"
    assert settings_ctl.settings.saved_kv_gib == 0
    # Shown as saved when the settings change elsewhere (another page, a restart).
    settings_ctl.update(dataclasses.replace(settings_ctl.settings, saved_kv_gib=8.0))
    assert page.saved_kv.value() == 8.0


def test_the_plan_says_what_the_sliding_window_keeps(
        qtbot, settings_ctl: SettingsController, services: ModelServices,
        devices: Devices) -> None:
    path = put_in_library(tiny_model_path(SWA_TARGET))
    page = open_page(qtbot, settings_ctl, services, path)
    info = read_model_info(path)
    plain = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096), devices())
    wait_plan(qtbot, page, plain)
    line = sliding_window_text(plain)
    assert line == "sliding window: 5 of 6 layers keep 768 tokens"
    assert line in page.plan_view.notes.text().splitlines()

    page.form.draft_kind.setCurrentIndex(page.form.draft_kind.findData("ngram"))
    drafting = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096,
                                              draft=DraftSettings(kind="ngram")), devices())
    wait_plan(qtbot, page, drafting)
    assert line in page.plan_view.notes.text().splitlines()  # drafting keeps the window cache


def test_experts_on_cpu_read_as_words_and_auto_shows_its_choice(
        qtbot, settings_ctl: SettingsController, services: ModelServices, devices: Devices,
        tmp_path: Path) -> None:
    path = put_in_library(write_tiny_moe_gguf(tmp_path / "tiny-moe.gguf"))
    info = read_model_info(path)
    # A GPU with room for every layer but the experts of the first two blocks.
    roomy = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096, cpu_moe=2),
                        [gpu(), cpu()])
    devices.now = [gpu(free=roomy.devices[0].total), cpu()]
    page = open_page(qtbot, settings_ctl, services, path)
    spin = page.form.cpu_moe
    texts = {}
    for value in (0, 1, 2, MOE.n_layer):
        spin.setValue(value)
        texts[value] = spin.text()
    assert texts == {0: "none", 1: "first layer", 2: "first 2 layers", 4: "all 4 layers"}
    for typed, value in (("3", 3), ("none", 0), ("all", MOE.n_layer)):  # words typed in
        spin.lineEdit().selectAll()
        qtbot.keyClicks(spin, typed)
        spin.interpretText()
        assert spin.value() == value
    qtbot.waitUntil(lambda: settings_ctl.settings.model_prefs(path).load.cpu_moe == "all",
                    timeout=WAIT)

    spin.setValue(-1)
    auto = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096, cpu_moe="auto"),
                       devices())
    assert auto.cpu_moe_layers == 2 and auto.verdict == "full_gpu"
    wait_plan(qtbot, page, auto)
    assert spin.text() == "auto (most on the GPU that fit)"
    assert experts_text(auto, True) == "MoE experts in RAM: the first 2 of 4 layers"
    assert "MoE experts in RAM: the first 2 of 4 layers" in page.plan_view.notes.text()
    qtbot.waitUntil(lambda: settings_ctl.settings.model_prefs(path).load.cpu_moe == "auto",
                    timeout=WAIT)
