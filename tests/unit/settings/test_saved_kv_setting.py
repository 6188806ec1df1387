"""The saved KV cache budget: an app setting (validated, kept in settings.toml) and the
server's `--saved-kv-gib` flag (runtime.engine.kv_store)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from runtime.cli.serve import saved_kv_from_args
from runtime.engine.kv_store import GIB
from runtime.errors import SettingsError
from runtime.paths import user_dirs
from runtime.settings.user import AppSettings, SettingsStore


def test_the_budget_defaults_to_4_gib_and_is_kept(tmp_path: Path) -> None:
    store = SettingsStore(tmp_path / "settings.toml")
    assert store.load().saved_kv_gib == 4.0
    store.save(AppSettings(saved_kv_gib=12.5))
    assert store.load().saved_kv_gib == 12.5


@pytest.mark.parametrize("bad", ["-1", "2000", "'lots'"])
def test_a_bad_budget_is_an_error_naming_it(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(f"saved_kv_gib = {bad}\n")
    with pytest.raises(SettingsError, match="saved"):
        SettingsStore(path).load()


def test_the_serve_flag_sets_the_folder_and_budget() -> None:
    opts = saved_kv_from_args(argparse.Namespace(saved_kv_gib=2.0))
    assert opts is not None
    assert opts.budget_bytes == 2 * GIB and opts.folder == user_dirs().cache / "kv"
    assert saved_kv_from_args(argparse.Namespace(saved_kv_gib=0.0)) is None
    with pytest.raises(SettingsError, match="--saved-kv-gib"):
        saved_kv_from_args(argparse.Namespace(saved_kv_gib=-1.0))
