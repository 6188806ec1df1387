"""Vision models in the app, against the fake hub: the quant table shows each quant's projector
and Download brings it; the library marks the pair and loads with it; a vision model without
its projector says so and "Get projector" fetches it; the model settings plan counts it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.models.models_page import LIBRARY, ModelsPage
from app.qt import QtCore
from app.services.models import ModelServices
from app.services.projectors import plan_model
from app.services.settings import SettingsController
from app.settings.model_settings_page import ModelSettingsPage
from app.settings.quant_choices import remote_choices
from runtime.hub.client import Hub
from runtime.paths import user_dirs
from tests.hubserver import VISION_MODEL, VISION_PROJECTOR, VISION_REPO, FakeHub, add_vision_repo

pytest_plugins = ["tests.gui.model_fixtures"]  # its fixtures: hub, services, settings_ctl ...
WAIT = 20_000


@pytest.fixture
def page(qtbot, hub: FakeHub, services: ModelServices) -> ModelsPage:
    add_vision_repo(hub)
    p = ModelsPage(services, ask_token=lambda _parent, _repo: None, debounce_ms=30)
    qtbot.addWidget(p)
    return p


def in_library(source: Path, name: str) -> Path:
    dest = user_dirs().models / VISION_REPO / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def test_quant_table_shows_the_projector_and_download_brings_it(
        qtbot, page: ModelsPage, services: ModelServices, hub: FakeHub) -> None:
    page.open_repo(VISION_REPO)
    repo = page.repo
    qtbot.waitUntil(lambda: repo.listing is not None, timeout=WAIT)
    [row] = repo.rows()
    assert row["file"] == VISION_MODEL  # the projectors are no rows of their own
    assert row["vision"].startswith("vision: projector F16, ")
    assert not repo.table.isColumnHidden(5)
    assert "each image takes 64 tokens" in row["tooltip"]  # the fit counts the projector
    assert VISION_PROJECTOR in repo.status.text()

    qtbot.mouseClick(repo.button_for(VISION_MODEL), QtCore.Qt.MouseButton.LeftButton)
    folder = user_dirs().models / VISION_REPO
    qtbot.waitUntil(lambda: any(m.projector is not None for m in services.models), timeout=WAIT)
    assert (folder / VISION_MODEL).is_file() and (folder / VISION_PROJECTOR).is_file()
    assert hub.stats(VISION_REPO, "mmproj-tiny-vision-F32.gguf").gets == 0
    qtbot.waitUntil(lambda: repo.button_for(VISION_MODEL).text() == "In library", timeout=WAIT)

    library = page.library
    page.setCurrentIndex(LIBRARY)
    [model] = library.models  # one model, its projector beside it
    library.select(model.path)
    assert library.table.item(0, 2).text() == "llama · vision"
    assert library.vision_note.isHidden() and library.projector_button.isHidden()
    with qtbot.waitSignal(page.load_requested, timeout=WAIT) as loaded:
        qtbot.mouseClick(library.buttons["load"], QtCore.Qt.MouseButton.LeftButton)
    assert loaded.args[0].mmproj_path == folder / VISION_PROJECTOR
    assert plan_model(loaded.args[0], services.devices())["image_tokens"] == 64


def test_a_model_without_its_projector_offers_to_fetch_it(
        qtbot, page: ModelsPage, services: ModelServices, tiny_target: Path,
        tiny_mmproj: Path) -> None:
    path = in_library(tiny_target, VISION_MODEL)
    services.refresh_library()
    library = page.library
    qtbot.waitUntil(lambda: len(library.models) == 1, timeout=WAIT)
    library.select(path)
    # Its architecture (llama) says nothing; its repository on the Hub has projectors.
    qtbot.waitUntil(lambda: not library.vision_note.isHidden(), timeout=WAIT)
    assert "without its projector" in library.vision_note.text()
    assert VISION_PROJECTOR in library.vision_note.text()
    assert not library.projector_button.isHidden() and library.projector_button.isEnabled()
    with qtbot.waitSignal(page.load_requested, timeout=WAIT) as loaded:
        qtbot.mouseClick(library.buttons["load"], QtCore.Qt.MouseButton.LeftButton)
    assert loaded.args[0].mmproj_path is None  # nothing to pair yet

    qtbot.mouseClick(library.projector_button, QtCore.Qt.MouseButton.LeftButton)
    projector = path.with_name(VISION_PROJECTOR)
    qtbot.waitUntil(lambda: library.models and library.models[0].projector == projector,
                    timeout=WAIT)
    assert projector.read_bytes() == tiny_mmproj.read_bytes()  # through the queue, verified
    assert [j.filename for j in services.downloads.jobs()] == [VISION_PROJECTOR]
    library.select(path)
    assert library.vision_note.isHidden() and library.projector_button.isHidden()


def test_quant_table_offers_the_projector_of_a_model_in_the_library(
        qtbot, page: ModelsPage, services: ModelServices, tiny_target: Path) -> None:
    in_library(tiny_target, VISION_MODEL)
    services.refresh_library()
    qtbot.waitUntil(lambda: len(services.models) == 1, timeout=WAIT)
    page.open_repo(VISION_REPO)
    repo = page.repo
    qtbot.waitUntil(lambda: repo.listing is not None, timeout=WAIT)
    button = repo.button_for(VISION_MODEL)
    assert button.text() == "Get projector" and button.isEnabled()
    button.click()
    qtbot.waitUntil(lambda: repo.button_for(VISION_MODEL).text() == "In library", timeout=WAIT)
    assert [j.filename for j in services.downloads.jobs()] == [VISION_PROJECTOR]


def test_settings_plan_counts_the_projector(qtbot, settings_ctl: SettingsController,
                                            services: ModelServices, hub: FakeHub,
                                            tiny_target: Path, tiny_mmproj: Path) -> None:
    path = in_library(tiny_target, VISION_MODEL)
    in_library(tiny_mmproj, VISION_PROJECTOR)
    page = ModelSettingsPage(settings_ctl, services, save_delay_ms=10)
    qtbot.addWidget(page)
    services.refresh_library()
    qtbot.waitUntil(lambda: len(services.models) == 1, timeout=WAIT)
    page.show_model(path)
    qtbot.waitUntil(lambda: page.plan_view.plan is not None, timeout=WAIT)
    notes = page.plan_view.notes.text()
    assert "each image takes 64 tokens" in notes and "vision projector: " in notes
    assert page.plan_view.plan.image_tokens == 64  # type: ignore[union-attr]
    with qtbot.waitSignal(page.load_requested, timeout=WAIT) as loaded:
        page.load_button.click()
    assert loaded.args[0].mmproj_path == path.with_name(VISION_PROJECTOR)
    # What is remembered names no projector: the pair is found again at each load.
    qtbot.waitUntil(lambda: not settings_ctl.pending, timeout=WAIT)
    assert settings_ctl.settings.model_prefs(path).load.mmproj_path is None


def test_hub_quant_choices_bring_the_projector(hub: FakeHub) -> None:
    add_vision_repo(hub)
    [choice] = remote_choices(Hub().repo_details(VISION_REPO))
    assert [f.name for f in choice.files] == [VISION_MODEL, VISION_PROJECTOR]
    assert "+ vision projector" in choice.label
