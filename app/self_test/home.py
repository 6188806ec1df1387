"""The self-test's temporary home: OUTRIDER_HOME for this process and every child it starts,
removed afterwards unless a check failed (`KEEP_MARK`: its engine logs stay to be read)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.paths import UserDirs

# Where user data goes: the self-test points both at its temporary home, for this process and
# every child it starts (engine, probe, router engines, worker, quantizer).
_HOME_VARIABLES = ("OUTRIDER_HOME", "OUTRIDER_MODELS_DIR")


KEEP_MARK = ".keep"  # written by a failed self-test: its home (the engine's logs) stays


@contextmanager
def self_test_home() -> Iterator[UserDirs]:
    """A temporary OUTRIDER_HOME (models, settings, chats, caches, logs) for the self-test;
    the environment is restored afterwards, and the folder removed unless a check failed
    (then the failure lines' engine logs are still there to read)."""
    saved = {name: os.environ.get(name) for name in _HOME_VARIABLES}
    root = Path(tempfile.mkdtemp(prefix="outrider-self-test-"))
    os.environ["OUTRIDER_HOME"] = str(root)
    os.environ.pop("OUTRIDER_MODELS_DIR", None)  # the library: the home's own, empty
    try:
        yield UserDirs(root / "data", root / "config", root / "cache", root / "state")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if not (root / KEEP_MARK).exists():
            shutil.rmtree(root, ignore_errors=True)
