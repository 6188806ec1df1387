"""The Models page's tables at the width they get beside the Live panels (a 1400 px window):
a model's name shows whole while short values take only the room they need, and no column
header is blank."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.models.models_page import DISCOVER, DOWNLOADS, LIBRARY, ModelsPage
from app.qt import QtWidgets
from app.services.models import ModelServices
from runtime.paths import user_dirs

pytest_plugins = ["tests.gui.model_fixtures"]  # its fixtures: hub, services, settings_ctl ...
WAIT = 20_000
PAGE_WIDTH = 830  # the Models page in a 1400 px window with the Live panels open


@pytest.fixture
def page(qtbot, services: ModelServices) -> ModelsPage:
    p = ModelsPage(services, ask_token=lambda _parent, _repo: None)
    qtbot.addWidget(p)
    p.resize(PAGE_WIDTH, 600)
    p.show()
    qtbot.waitExposed(p)
    return p


def shows_whole(table: QtWidgets.QTableWidget, column: int) -> bool:
    """Every cell of `column` fits its width (no "…")."""
    return table.columnWidth(column) >= table.sizeHintForColumn(column)


def test_discover_picks_show_model_names_whole(qtbot, page: ModelsPage) -> None:
    page.setCurrentIndex(DISCOVER)
    picks = page.discover.picks
    qtbot.waitUntil(lambda: picks.rowCount() > 0, timeout=WAIT)
    qtbot.waitUntil(lambda: shows_whole(picks, 0), timeout=WAIT)
    role = 6
    assert picks.horizontalHeaderItem(role).text() == "Role"
    assert picks.columnWidth(role) < picks.columnWidth(0) / 2  # "chat" does not share the room


def test_library_shows_model_names_whole(qtbot, page: ModelsPage, services: ModelServices,
                                         tiny_target: Path) -> None:
    folder = user_dirs().models / "bartowski" / "SmolLM2-135M-Instruct-GGUF"
    folder.mkdir(parents=True)
    shutil.copyfile(tiny_target, folder / "SmolLM2-135M-Instruct-Q4_K_M.gguf")
    services.refresh_library()
    page.setCurrentIndex(LIBRARY)
    table = page.library.table
    qtbot.waitUntil(lambda: table.rowCount() == 1, timeout=WAIT)
    assert table.item(0, 0).text() == "SmolLM2-135M-Instruct-Q4_K_M"
    qtbot.waitUntil(lambda: shows_whole(table, 0), timeout=WAIT)
    header = table.horizontalHeader()
    drafts = header.count() - 1
    assert table.horizontalHeaderItem(drafts).toolTip().startswith("Models in the library")


def test_downloads_table_has_no_blank_header(page: ModelsPage) -> None:
    page.setCurrentIndex(DOWNLOADS)
    table = page.downloads.table
    titles = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert all(titles), titles
    assert titles[-1] == "Actions"  # the column of Pause / Cancel / Retry buttons
