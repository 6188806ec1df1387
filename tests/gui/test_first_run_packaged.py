"""The first-run page inside the packaged app (PyInstaller sets `sys.frozen`): it has no pip
to fetch the default model from its PyPI wheel, so it points to the Hub and to importing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.window import FIRST_RUN, MODELS
from tests.gui.conftest import WindowFactory, fake_command


def test_packaged_app_sends_to_the_hub_instead_of_pip(qtbot, make_window: WindowFactory,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    window = make_window(fake_command())
    page = window.first_run
    page._default_path = tmp_path / "absent.gguf"
    page._update_default_button()
    assert window.offer_first_run() and window.pages.currentIndex() == FIRST_RUN
    qtbot.waitUntil(lambda: "Recommended for this machine (" in page.recommended_title.text(),
                    timeout=10_000)
    assert page.default_button.text() == "Find it on the Hub"

    with qtbot.waitSignal(page.browse_models):
        page.default_button.click()
    assert window.pages.currentIndex() == MODELS
    assert "Hub" in page.status.text() and "import" in page.status.text()
    assert page.default_button.isEnabled()  # nothing started in the background
