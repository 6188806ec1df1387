"""The `fake_hub` pytest fixture: import it into a test module to use it.

    from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hubserver.repos import add_tiny_repos
from tests.hubserver.server import FakeHub


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A started fake hub serving the tiny repositories, with HF_ENDPOINT pointing at it."""
    from tests.conftest import _REAL_DIRS

    hub = FakeHub().start()
    add_tiny_repos(hub, _REAL_DIRS.cache / "test-models")
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        yield hub
    finally:
        hub.stop()
