"""The Settings pages: the plan follows every toggle with the planner's own numbers, an
incompatible draft cannot be chosen and says why, switching quant reloads with the other file,
settings survive a restart, and a bad settings file is reported, not fatal."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from app.qt import QtWidgets
from app.services.models import ModelServices
from app.services.settings import SettingsController
from app.settings.model_settings_page import ModelSettingsPage
from app.settings.plan_view import plan_values
from app.settings.settings_page import SettingsPage
from runtime.errors import HubUnreachable, RepoNotFound
from runtime.gguf.info import read_model_info
from runtime.planner.plan import plan_memory
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.settings.user import SettingsStore
from tests.gui.model_helpers import Devices, cpu, gpu
from tests.hubserver import TINY_REPO, FakeHub

pytest_plugins = ["tests.gui.model_fixtures"]  # its fixtures: hub, services, settings_ctl ...
WAIT = 20_000


def put_in_library(source: Path, repo: str = TINY_REPO, name: str | None = None) -> Path:
    from runtime.paths import user_dirs

    dest = user_dirs().models / repo / (name or source.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def open_page(qtbot, settings_ctl: SettingsController, services: ModelServices, path: Path,
              n_models: int = 1) -> ModelSettingsPage:
    page = ModelSettingsPage(settings_ctl, services, save_delay_ms=10)
    qtbot.addWidget(page)
    services.refresh_library()
    qtbot.waitUntil(lambda: len(services.models) == n_models, timeout=WAIT)
    page.show_model(path)
    qtbot.waitUntil(lambda: page.plan_view.plan is not None, timeout=WAIT)
    return page


def shown(page: ModelSettingsPage) -> dict[str, str]:
    return {key: page.plan_view.value(key) for key in page.plan_view.labels}


def wait_plan(qtbot, page: ModelSettingsPage, expected: object) -> None:
    """The plan is computed on a worker thread: wait for the newest one on screen."""
    qtbot.waitUntil(lambda: not page.planning and page.plan_view.plan == expected, timeout=WAIT)


def test_plan_follows_kv_types_and_context(qtbot, settings_ctl: SettingsController,
                                           services: ModelServices, devices: Devices,
                                           tiny_target: Path) -> None:
    path = put_in_library(tiny_target)
    page = open_page(qtbot, settings_ctl, services, path)
    info = read_model_info(path)
    expected = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096), devices())
    wait_plan(qtbot, page, expected)
    assert shown(page) == plan_values(expected, info.n_ctx_train)
    assert page.plan_view.verdict.text() == "CPU only"
    assert shown(page)["max_context"] == "4,096 tokens"  # as asked: beyond the trained 2,048

    form = page.form
    form.type_k.setCurrentIndex(form.type_k.findData("q8_0"))
    form.type_v.setCurrentIndex(form.type_v.findData("q4_0"))
    settings = LoadSettings(model_path=path, n_ctx=4096, type_k="q8_0", type_v="q4_0")
    expected_q = plan_memory(info, settings, devices())
    wait_plan(qtbot, page, expected_q)
    assert shown(page) == plan_values(expected_q, info.n_ctx_train)
    assert shown(page)["kv"] != plan_values(expected)["kv"]  # the number on screen moved
    assert "flash attention: it will be on" in form.kv_note.text()

    form.n_ctx.setValue(1024)
    expected_c = plan_memory(info, dataclasses.replace(settings, n_ctx=1024), devices())
    wait_plan(qtbot, page, expected_c)
    assert shown(page) == plan_values(expected_c, info.n_ctx_train)
    assert info.n_ctx_train == expected_c.max_context == 2048  # memory would hold more
    assert shown(page)["max_context"] == "2,048 tokens (trained)"
    assert "memory is not the limit" in page.plan_view.labels["max_context"].toolTip()

    # The choice is remembered for this file a moment later.
    qtbot.waitUntil(lambda: settings_ctl.settings.model_prefs(path).load.n_ctx == 1024,
                    timeout=WAIT)
    assert settings_ctl.settings.model_prefs(path).load.type_v == "q4_0"


def test_largest_context_that_fits(qtbot, settings_ctl: SettingsController,
                                   services: ModelServices, devices: Devices,
                                   tiny_target: Path) -> None:
    devices.now = [cpu(free=12 << 20)]  # 12 MiB: a short context fits, 4,096 tokens do not
    path = put_in_library(tiny_target)
    page = open_page(qtbot, settings_ctl, services, path)
    info = read_model_info(path)
    start = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096), devices())
    assert start.verdict == "wont_fit" and 0 < start.max_context < 4096
    assert page.plan_view.verdict.text() == "Won't fit"
    assert shown(page)["max_context"] == f"{start.max_context:,} tokens"  # memory's limit
    page.form.largest.click()
    assert page.form.n_ctx.value() == start.max_context
    after = plan_memory(info, LoadSettings(model_path=path, n_ctx=start.max_context), devices())
    wait_plan(qtbot, page, after)
    assert after.verdict == "cpu_only" and page.plan_view.verdict.text() == "CPU only"


def test_gpu_layers_auto_and_fixed(qtbot, settings_ctl: SettingsController,
                                   services: ModelServices, devices: Devices,
                                   tiny_target: Path) -> None:
    devices.now = [gpu(), cpu()]
    path = put_in_library(tiny_target)
    page = open_page(qtbot, settings_ctl, services, path)
    info = read_model_info(path)
    assert page.plan_view.verdict.text() == "Full GPU"
    assert page.form.gpu_auto.isChecked() and not page.form.gpu_layers.isEnabled()
    page.form.gpu_auto.setChecked(False)
    page.form.gpu_layers.setValue(2)
    expected = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096, gpu_layers=2),
                           devices())
    wait_plan(qtbot, page, expected)
    assert page.plan_view.verdict.text() == f"Partial 2 of {info.n_layers_offloadable}"
    assert page.plan_view.value("gpu_layers") == f"2 of {info.n_layers_offloadable}"


def test_without_gpu_the_slider_is_off_and_says_why(qtbot, settings_ctl: SettingsController,
                                                    services: ModelServices,
                                                    tiny_target: Path) -> None:
    page = open_page(qtbot, settings_ctl, services, put_in_library(tiny_target))
    assert not page.form.gpu_layers.isEnabled() and not page.form.gpu_auto.isEnabled()
    assert "No GPU found" in page.form.gpu_note.text()


def test_incompatible_draft_is_greyed_out_with_its_reason(
        qtbot, settings_ctl: SettingsController, services: ModelServices, devices: Devices,
        tiny_target: Path, tiny_draft: Path, alien_draft: Path) -> None:
    path = put_in_library(tiny_target)
    draft = put_in_library(tiny_draft)
    alien = put_in_library(alien_draft)
    page = open_page(qtbot, settings_ctl, services, path, n_models=3)
    form = page.form
    qtbot.waitUntil(lambda: form.draft_model.count() == 2, timeout=WAIT)
    assert form.draft_selectable(draft)
    assert not form.draft_selectable(alien)
    reasons = form.draft_reasons(alien)
    assert reasons and any("token" in r or "vocabulary" in r for r in reasons)
    alien_row = form.draft_model.findData(str(alien), 256)  # Qt.UserRole
    assert reasons[0] in form.draft_model.itemText(alien_row)
    assert "greyed out cannot draft" in form.draft_note.text()

    form.draft_kind.setCurrentIndex(form.draft_kind.findData("model"))
    assert form.draft_model.currentData(256) == str(draft)  # the compatible one, never the alien
    info, draft_info = read_model_info(path), read_model_info(draft)
    settings = LoadSettings(model_path=path, n_ctx=4096,
                            draft=DraftSettings(kind="model", model_path=draft))
    expected = plan_memory(info, settings, devices(), draft_info)
    wait_plan(qtbot, page, expected)  # once the draft's header is read
    assert expected.devices[-1].draft > 0

    with qtbot.waitSignal(page.load_requested, timeout=WAIT) as loaded:
        page.load_button.click()
    assert loaded.args[0] == settings


def test_switching_quant_downloads_and_reloads_with_the_same_settings(
        qtbot, settings_ctl: SettingsController, services: ModelServices, hub: FakeHub,
        tiny_target: Path) -> None:
    path = put_in_library(tiny_target, name="tiny-F32.gguf")  # the repo's F32 file
    page = open_page(qtbot, settings_ctl, services, path)
    page.set_loaded_model(path)
    qtbot.waitUntil(lambda: any(c.name == "tiny-Q4_K_M.gguf" for c in page.choices),
                    timeout=WAIT)
    names = {c.name: c for c in page.choices}
    assert names["tiny-F32.gguf"].local and not names["tiny-Q4_K_M.gguf"].local
    assert page.quant_combo.isEnabled()
    page.form.n_ctx.setValue(2048)
    page.form.type_k.setCurrentIndex(page.form.type_k.findData("q8_0"))

    other = path.with_name("tiny-Q4_K_M.gguf")
    with qtbot.waitSignal(page.reload_requested, timeout=WAIT) as reload:
        page.choose_quant("tiny-Q4_K_M.gguf")
    assert reload.args[0] == LoadSettings(model_path=other, n_ctx=2048, type_k="q8_0")
    assert other.is_file()
    assert page.path == other
    qtbot.waitUntil(lambda: page.plan_view.plan is not None, timeout=WAIT)
    assert page.form.n_ctx.value() == 2048  # the other file got the same settings

    # Back to the first: it is in the library, so the reload is asked at once.
    qtbot.waitUntil(lambda: any(c.name == "tiny-F32.gguf" and c.local for c in page.choices),
                    timeout=WAIT)
    with qtbot.waitSignal(page.reload_requested, timeout=WAIT) as back:
        page.choose_quant("tiny-F32.gguf")
    assert back.args[0].model_path == path and back.args[0].n_ctx == 2048


def test_unreachable_hub_is_said_plainly_with_the_details_in_the_tooltip(
        qtbot, settings_ctl: SettingsController, services: ModelServices,
        tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    detail = "cannot reach https://huggingface.co: [Errno -2] Name or service not known"

    def unreachable(repo_id: str) -> None:
        raise HubUnreachable(detail)

    monkeypatch.setattr(services.hub, "repo_details", unreachable)
    page = open_page(qtbot, settings_ctl, services, put_in_library(tiny_target))
    qtbot.waitUntil(lambda: "could not be listed" in page.quant_status.text(), timeout=WAIT)
    assert page.quant_status.text() == ("Other quants on the Hub could not be listed: the Hub "
                                        "is unreachable (offline?)")
    assert page.quant_status.toolTip() == detail
    # Other Hub errors already read well: their own message is shown.
    page._quants_not_listed(RepoNotFound(f"no repository {TINY_REPO} on the Hub"))
    assert page.quant_status.text().endswith(f": no repository {TINY_REPO} on the Hub")


def test_quant_switch_of_a_model_not_loaded_only_shows_the_other(
        qtbot, settings_ctl: SettingsController, services: ModelServices,
        tiny_target: Path) -> None:
    first = put_in_library(tiny_target, name="tiny-F32.gguf")
    second = put_in_library(tiny_target, name="tiny-copy-F32.gguf")
    page = open_page(qtbot, settings_ctl, services, first, n_models=2)
    qtbot.waitUntil(lambda: len(page.choices) == 2, timeout=WAIT)
    with qtbot.assertNotEmitted(page.reload_requested):
        page.choose_quant(second.name)
    assert page.path == second


def test_settings_survive_a_restart(qtbot, settings_ctl: SettingsController,
                                    services: ModelServices, devices: Devices,
                                    tiny_target: Path, tmp_path: Path) -> None:
    path = put_in_library(tiny_target)
    page = SettingsPage(settings_ctl, services, default_models_dir=tmp_path / "default")
    qtbot.addWidget(page)
    app = page.app
    app.preferred.setCurrentText("Q6_K")
    app.parallel.setValue(3)
    app.theme.setCurrentText("dark")
    app.fit_ctx.setValue(8192)
    app.endpoint.setText("https://hf-mirror.example")
    app.endpoint.editingFinished.emit()
    app.token.setText("hf_secret_token_value_123456")
    app.token.editingFinished.emit()
    services.refresh_library()
    qtbot.waitUntil(lambda: len(services.models) == 1, timeout=WAIT)
    page.show_model(path)
    model = page.model
    qtbot.waitUntil(lambda: model.form.isEnabled(), timeout=WAIT)
    assert model.form.n_ctx.value() == 8192  # a new model starts from the fit defaults
    model.form.n_ctx.setValue(1536)
    model.form.temperature.setValue(0.3)
    model.save_now()
    settings_ctl.shutdown()  # writes anything not yet on disk

    again = SettingsController.open()
    try:
        s = again.settings
        assert (s.hub.preferred_quant, s.hub.parallel_downloads, s.theme, s.fit.n_ctx) == \
            ("Q6_K", 3, "dark", 8192)
        assert s.hub.endpoint == "https://hf-mirror.example"
        assert s.token() == "hf_secret_token_value_123456"
        page2 = SettingsPage(again, services, default_models_dir=tmp_path / "default")
        qtbot.addWidget(page2)
        assert page2.app.preferred.currentText() == "Q6_K"
        assert page2.app.token.text() == ""  # never shown again, only its mask
        assert "hf_…3456" in page2.app.token.placeholderText()
        page2.show_model(path)
        qtbot.waitUntil(lambda: page2.model.form.isEnabled(), timeout=WAIT)
        assert page2.model.form.n_ctx.value() == 1536
        assert page2.model.form.temperature.value() == pytest.approx(0.3)
    finally:
        again.shutdown()


def test_fit_defaults_have_a_plain_heading_and_say_what_they_are_for(
        qtbot, settings_ctl: SettingsController, tmp_path: Path) -> None:
    from app.settings.app_settings_page import AppSettingsPage

    page = AppSettingsPage(settings_ctl, default_models_dir=tmp_path)
    qtbot.addWidget(page)
    titles = [box.title() for box in page.findChildren(QtWidgets.QGroupBox)]
    assert titles == ["Models and the Hub", "Local server", "Saved conversations", "Appearance",
                      "Fit verdicts"]
    assert page.fit_note.text().startswith("A repository's quant table judges fit with these")


def test_refused_value_is_explained_and_not_saved(qtbot, settings_ctl: SettingsController,
                                                  tmp_path: Path) -> None:
    from app.settings.app_settings_page import AppSettingsPage

    page = AppSettingsPage(settings_ctl, default_models_dir=tmp_path)
    qtbot.addWidget(page)
    before = settings_ctl.settings
    page.endpoint.setText("ftp://mirror")
    page.endpoint.editingFinished.emit()
    assert "http(s) URL" in page.problem.text() and not page.problem.isHidden()
    assert settings_ctl.settings == before
    page.endpoint.setText("")
    page.endpoint.editingFinished.emit()
    assert page.problem.isHidden()


def test_a_bad_settings_file_is_reported_not_fatal(qtbot, tmp_path: Path) -> None:
    from app.settings.app_settings_page import AppSettingsPage

    store = SettingsStore()
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_text("[hub]\nparallel_downloads = 'many'\nflavour = 1\n")
    ctl = SettingsController.open(store)
    try:
        assert ctl.startup_problem is not None
        assert "settings.toml.bad" in ctl.startup_problem
        page = AppSettingsPage(ctl, default_models_dir=tmp_path)
        qtbot.addWidget(page)
        assert not page.problem.isHidden()
        assert "flavour" in page.problem.text()
        assert page.parallel.value() == 2  # the defaults
        assert store.path.with_name("settings.toml.bad").is_file()
    finally:
        ctl.shutdown()


def test_token_never_appears_in_a_widget(qtbot, settings_ctl: SettingsController,
                                         tmp_path: Path) -> None:
    from app.settings.app_settings_page import AppSettingsPage

    token = "hf_do_not_show_me_0123456789"
    page = AppSettingsPage(settings_ctl, default_models_dir=tmp_path)
    qtbot.addWidget(page)
    page.token.setText(token)
    page.token.editingFinished.emit()
    assert settings_ctl.settings.token() == token
    texts = [w.text() for w in page.findChildren(QtWidgets.QLineEdit)]
    texts += [w.placeholderText() for w in page.findChildren(QtWidgets.QLineEdit)]
    texts += [w.text() for w in page.findChildren(QtWidgets.QLabel)]
    assert not any(token in t for t in texts)
    page.remove_token.click()
    assert settings_ctl.settings.hf_token is None
