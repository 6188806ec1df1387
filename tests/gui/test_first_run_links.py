"""The first run's recommendations: each is a link that opens its repository, and sizes are
in GiB like every other page."""

from __future__ import annotations

from pathlib import Path

from app.first_run.page import FirstRunPage
from app.services.background import BackgroundRunner


def test_each_recommendation_opens_its_repository(qtbot, tmp_path: Path) -> None:
    runner = BackgroundRunner()
    try:
        page = FirstRunPage(runner, tmp_path / "absent.gguf")
        qtbot.addWidget(page)
        qtbot.waitUntil(lambda: "free)" in page.recommended_title.text(), timeout=10_000)
        repos = page.recommendation_links()
        assert repos, "this machine's free memory fits at least the smallest chat model"
        text = page.recommended.text()
        for repo in repos:  # each entry is a link to its repository
            assert f'<a href="{repo}">' in text
        # GiB like the title, and the speed each is expected to run at here.
        assert " GiB" in text and " GB " not in text and "tok/s here" in text
        with qtbot.waitSignal(page.open_repo, timeout=5000) as opened:
            page.recommended.linkActivated.emit(repos[-1])
        assert opened.args == [repos[-1]] and repos[-1].count("/") == 1
    finally:
        runner.shutdown()
