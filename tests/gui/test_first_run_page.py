"""The first-run page on its own: free memory is said in the app's binary units."""

from __future__ import annotations

from pathlib import Path

from app.first_run.page import FirstRunPage
from app.services.background import BackgroundRunner


def test_free_memory_is_in_gib_like_the_other_pages(qtbot, tmp_path: Path) -> None:
    runner = BackgroundRunner()
    try:
        page = FirstRunPage(runner, tmp_path / "absent.gguf")
        qtbot.addWidget(page)
        qtbot.waitUntil(lambda: "free)" in page.recommended_title.text(), timeout=10_000)
        page._on_recommendations((int(22.8 * (1 << 30)), []))
        assert page.recommended_title.text() == "Recommended for this machine (22.8 GiB free)"
    finally:
        runner.shutdown()
