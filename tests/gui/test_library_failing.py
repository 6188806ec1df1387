"""The Library page marks a file llama.cpp is known to crash on (runtime.gguf.verdicts): a
warning sign before its name and the crash in its tooltip."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.models.models_page import LIBRARY, ModelsPage
from app.services.models import ModelServices
from runtime.gguf.verdicts import LoadVerdict, VerdictStore
from runtime.paths import user_dirs

pytest_plugins = ["tests.gui.model_fixtures"]  # its fixtures: hub, services, settings_ctl ...
WAIT = 20_000
CRASH = "baichuan.cpp:50: GGML_ASSERT(n_embd_head == n_rot) failed"


@pytest.fixture
def page(qtbot, services: ModelServices) -> ModelsPage:
    p = ModelsPage(services, ask_token=lambda _parent, _repo: None)
    qtbot.addWidget(p)
    p.show()
    qtbot.waitExposed(p)
    return p


def test_a_crashing_file_is_marked_and_says_why(qtbot, page: ModelsPage, services: ModelServices,
                                                tiny_target: Path) -> None:
    folder = user_dirs().models / "o" / "r"
    folder.mkdir(parents=True)
    bad, good = folder / "bad.gguf", folder / "good.gguf"
    shutil.copyfile(tiny_target, bad)
    shutil.copyfile(tiny_target, good)
    VerdictStore().put(bad, LoadVerdict(ok=False, reason=CRASH))
    services.refresh_library()
    page.setCurrentIndex(LIBRARY)
    table = page.library.table
    qtbot.waitUntil(lambda: table.rowCount() == 2, timeout=WAIT)
    rows = {table.item(row, 0).text(): row for row in range(2)}
    assert set(rows) == {"⚠ bad", "good"}
    assert table.item(rows["⚠ bad"], 0).toolTip() == f"llama.cpp crashed loading this file: {CRASH}"
    assert table.item(rows["good"], 0).toolTip() == str(good)
