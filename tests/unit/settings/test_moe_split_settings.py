"""The MoE and multi-GPU load settings survive the settings file (TOML has no null, and
`cpu_moe` is a count or a word), and a wrong value names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.errors import SettingsError
from runtime.settings.load import LoadSettings
from runtime.settings.user import AppSettings, ModelPrefs, SettingsStore


@pytest.mark.parametrize("cpu_moe", [0, 7, "all", "auto"])
def test_cpu_moe_and_the_split_round_trip(tmp_path: Path, cpu_moe: int | str) -> None:
    path = tmp_path / "moe.gguf"
    load = LoadSettings(model_path=path, cpu_moe=cpu_moe, tensor_split=(3.0, 1.0))  # type: ignore[arg-type]
    store = SettingsStore(tmp_path / "settings.toml")
    store.save(AppSettings().with_model(path, ModelPrefs(load)))
    again = store.load().model_prefs(path).load
    assert (again.cpu_moe, again.tensor_split, again.main_gpu) == (cpu_moe, (3.0, 1.0), None)


def test_a_wrong_cpu_moe_in_the_file_names_the_key(tmp_path: Path) -> None:
    settings_file = tmp_path / "settings.toml"
    path = tmp_path / "moe.gguf"
    store = SettingsStore(settings_file)
    store.save(AppSettings().with_model(path, ModelPrefs(LoadSettings(model_path=path, cpu_moe=2))))
    settings_file.write_text(settings_file.read_text().replace("cpu_moe = 2", 'cpu_moe = "most"'))
    with pytest.raises(SettingsError, match=r"cpu_moe must be a whole number or one of all, "
                                            r"auto, not 'most'$"):
        store.load()
