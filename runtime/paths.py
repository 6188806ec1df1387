"""Where Outrider keeps user data, following each platform's conventions (platformdirs).

`OUTRIDER_HOME` overrides everything (tests and portable installs use it): with it set, all
directories live below that one folder.

    models/<owner>/<repo>/<file>.gguf   the library
    downloads/                          partial downloads that survive restarts
    chats.sqlite3                       conversations
    settings.toml                       (config dir)
    logs/, crash/                       (state dir)
    cache/                              remote-header cache, generated test models, wheels
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "outrider"


@dataclass(frozen=True)
class UserDirs:
    data: Path
    config: Path
    cache: Path
    state: Path

    @property
    def models(self) -> Path:
        override = os.environ.get("OUTRIDER_MODELS_DIR")
        return Path(override) if override else self.data / "models"

    @property
    def downloads(self) -> Path:
        return self.data / "downloads"

    @property
    def chats_db(self) -> Path:
        return self.data / "chats.sqlite3"

    @property
    def settings_file(self) -> Path:
        return self.config / "settings.toml"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def crash_reports(self) -> Path:
        return self.state / "crash"


def user_dirs() -> UserDirs:
    """The directories for this user, honouring `OUTRIDER_HOME`."""
    home = os.environ.get("OUTRIDER_HOME")
    if home:
        root = Path(home)
        return UserDirs(root / "data", root / "config", root / "cache", root / "state")
    return UserDirs(
        Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_state_dir(APP_NAME, appauthor=False)),
    )
