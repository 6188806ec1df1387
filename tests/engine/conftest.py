"""Engine-test fixtures: an engine thread per test (stopped afterwards) and load helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.settings.load import LoadSettings


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = Engine()
    eng.start()
    yield eng
    eng.stop()


def tiny_settings(path: Path, **kw: object) -> LoadSettings:
    """One thread: the test machine's cores are shared, and spinning threads only slow it."""
    base: dict[str, object] = {"model_path": path, "n_ctx": 512, "n_threads": 1}
    base.update(kw)
    return LoadSettings(**base)  # type: ignore[arg-type]
