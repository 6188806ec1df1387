"""No connection to the Hub: Discover and a repository page say so in words, with Retry and a
link to Settings → App (the mirror); Retry after choosing a reachable endpoint works."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from app.models.hub_notice import NO_CONNECTION
from app.models.models_page import ModelsPage
from app.services.models import ModelServices
from app.services.settings import SettingsController
from tests.hubserver import TINY_REPO, FakeHub

pytest_plugins = ["tests.gui.model_fixtures"]
WAIT = 20_000


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def use_endpoint(settings_ctl: SettingsController, endpoint: str) -> None:
    s = settings_ctl.settings
    settings_ctl.update(dataclasses.replace(s, hub=dataclasses.replace(s.hub, endpoint=endpoint)))


@pytest.fixture
def page(qtbot, services: ModelServices) -> ModelsPage:
    p = ModelsPage(services, ask_token=lambda _parent, _repo: None, debounce_ms=30)
    qtbot.addWidget(p)
    return p


def test_search_without_a_connection_says_so_with_retry_and_the_setting(
        qtbot, page: ModelsPage, settings_ctl: SettingsController, hub: FakeHub) -> None:
    use_endpoint(settings_ctl, f"http://127.0.0.1:{closed_port()}")
    discover = page.discover
    discover.search.setText("tiny")
    discover.run_search()
    qtbot.waitUntil(lambda: not discover.notice.isHidden(), timeout=WAIT)
    assert discover.notice.text.text() == NO_CONNECTION
    assert "Settings → App" in discover.notice.text.text()
    with qtbot.waitSignal(page.app_settings_requested, timeout=WAIT):
        discover.notice.text.linkActivated.emit("settings:app")
    use_endpoint(settings_ctl, hub.url)  # the user set a reachable mirror
    discover.notice.retry.click()
    assert discover.notice.isHidden()
    qtbot.waitUntil(lambda: TINY_REPO in discover.hit_ids(), timeout=WAIT)


def test_repository_without_a_connection_says_so_and_retries(
        qtbot, page: ModelsPage, settings_ctl: SettingsController, hub: FakeHub) -> None:
    use_endpoint(settings_ctl, f"http://127.0.0.1:{closed_port()}")
    page.open_repo(TINY_REPO)
    repo = page.repo
    qtbot.waitUntil(lambda: not repo.notice.isHidden(), timeout=WAIT)
    assert repo.notice.text.text() == NO_CONNECTION
    with qtbot.waitSignal(page.app_settings_requested, timeout=WAIT):
        repo.notice.text.linkActivated.emit("settings:app")
    use_endpoint(settings_ctl, hub.url)
    repo.notice.retry.click()
    qtbot.waitUntil(lambda: repo.listing is not None, timeout=WAIT)
    assert repo.notice.isHidden()
