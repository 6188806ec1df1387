"""App settings: round trips through TOML, secrets kept apart with user-only permissions,
every bad key or value refused with a message that names it, a bad file kept aside."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from pathlib import Path

import pytest

from runtime.errors import SettingsError
from runtime.events import SamplingParams
from runtime.paths import user_dirs
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.settings.user import (
    QUANT_LEVELS,
    AppSettings,
    FitDefaults,
    HubSettings,
    ModelPrefs,
    Secret,
    ServerSettings,
    SettingsStore,
)

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"


def full_settings(tmp_path: Path) -> AppSettings:
    model = tmp_path / 'my "odd" models' / "a-Q4_K_M.gguf"
    load = LoadSettings(model_path=model, n_ctx=8192, gpu_layers=12, type_k="q8_0",
                        type_v="q4_0", flash_attn="on", n_threads=3, n_batch=256,
                        draft=DraftSettings(kind="model", model_path=tmp_path / "d.gguf", k=4))
    sampling = SamplingParams(temperature=0.3, top_k=20, seed=7, stop=("</s>",))
    settings = AppSettings(
        models_dir=tmp_path / "models", theme="dark",
        hub=HubSettings(endpoint="https://hf-mirror.example", preferred_quant="Q6_K",
                        parallel_downloads=3),
        server=ServerSettings(port=9000, allow_network=True),
        fit=FitDefaults(n_ctx=2048, type_k="q8_0", type_v="q8_0"),
        hf_token=Secret(TOKEN), server_api_key=Secret("sk-local-123"))
    return settings.with_model(model, ModelPrefs(load, sampling))


def test_defaults_when_there_is_no_file() -> None:
    settings = SettingsStore().load()
    assert settings == AppSettings()
    assert settings.hub.preferred_quant == "Q4_K_M"
    assert SettingsStore().path == user_dirs().settings_file


def test_quant_levels_match_the_quant_listing() -> None:
    from runtime.hub.quants import PREFERRED_QUANTS

    assert QUANT_LEVELS == PREFERRED_QUANTS


def test_round_trip_keeps_every_value(tmp_path: Path) -> None:
    settings = full_settings(tmp_path)
    SettingsStore().save(settings)
    again = SettingsStore().load()
    assert again == settings
    model = next(iter(settings.models))
    assert again.model_prefs(model).load.draft.k == 4
    assert again.model_prefs(model).sampling.stop == ("</s>",)
    assert again.model_prefs(model).load.gpu_layers == 12


def test_none_values_read_back_as_none(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    prefs = ModelPrefs(LoadSettings(model_path=path, gpu_layers=None, n_threads=None))
    SettingsStore().save(AppSettings().with_model(path, prefs))
    load = SettingsStore().load().model_prefs(path).load
    assert load.gpu_layers is None and load.n_threads is None and load.draft.k is None


def test_unconfigured_model_gets_the_fit_defaults(tmp_path: Path) -> None:
    settings = AppSettings(fit=FitDefaults(n_ctx=1024, type_k="q4_0", type_v="f16"))
    load = settings.model_prefs(tmp_path / "x.gguf").load
    assert (load.n_ctx, load.type_k, load.type_v) == (1024, "q4_0", "f16")
    assert load.model_path == tmp_path / "x.gguf"


def test_secrets_live_apart_with_user_only_permissions(tmp_path: Path) -> None:
    store = SettingsStore()
    store.save(full_settings(tmp_path))
    assert TOKEN not in store.path.read_text()
    assert "sk-local-123" not in store.path.read_text()
    assert TOKEN in store.secrets_path.read_text()
    if sys.platform != "win32":
        assert stat.S_IMODE(os.stat(store.secrets_path).st_mode) == 0o600
    store.save(dataclasses.replace(store.load(), hf_token=None, server_api_key=None))
    assert not store.secrets_path.exists()  # clearing the token removes it from disk


def test_token_is_masked_everywhere_but_reveal(tmp_path: Path) -> None:
    settings = full_settings(tmp_path)
    for text in (repr(settings), str(settings), f"{settings.hf_token}", repr(SettingsStore())):
        assert TOKEN not in text
    assert settings.token() == TOKEN
    assert settings.hf_token is not None and settings.hf_token.masked == "hf_…0123"
    assert Secret("  hf_x  ").reveal() == "hf_x"
    with pytest.raises(SettingsError):
        Secret("   ")


@pytest.mark.parametrize(("text", "message"), [
    ("colour = 'red'\n", "unknown key colour"),
    ("[hub]\nparallel_downloads = 'two'\n", "hub.parallel_downloads must be a whole number, not 'two'"),
    ("[hub]\nparallel_downloads = 0\n", "parallel downloads must be 1..8"),
    ("[hub]\npreferred_quant = 'Q4_0'\n", "preferred quant must be one of Q8_0"),
    ("[hub]\nendpoint = 'ftp://x'\n", "http(s) URL"),
    ("[server]\nadress = '0.0.0.0'\n", "unknown key server.adress"),
    ("[server]\nport = 70000\n", "port must be 1..65535"),
    ("[server]\nallow_network = 1\n", "server.allow_network must be true or false"),
    ("theme = 'pink'\n", "theme must be one of system, light, dark"),
    ("models_dir = 'relative/dir'\n", "absolute path"),
    ("[fit]\ntype_k = 'q3_k'\n", "default K cache type 'q3_k'"),
    ("[models.'/m.gguf']\nn_ctx = 8\n", "context length must be at least 16"),
    ("[models.'/m.gguf']\nctx = 8\n", "unknown key models.'/m.gguf'.ctx"),
    ("[models.'/m.gguf'.draft]\nkind = 'model'\n", "a draft model needs its file"),
    ("[models.'/m.gguf'.sampling]\ntop_p = 2.0\n", "top_p must be in (0, 1]"),
    ("[models.'/m.gguf'.sampling]\nstop = 'x'\n", "sampling.stop must be a list"),
    ("[hub\n", "is not valid TOML"),
])
def test_invalid_values_are_refused_by_name(text: str, message: str) -> None:
    store = SettingsStore()
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_text(text)
    with pytest.raises(SettingsError) as caught:
        store.load()
    assert message in str(caught.value)
    assert str(caught.value).startswith("settings.toml")
    assert "\n" not in str(caught.value)


def test_unknown_secret_is_refused_too() -> None:
    store = SettingsStore()
    store.secrets_path.parent.mkdir(parents=True, exist_ok=True)
    store.secrets_path.write_text("hf_tokn = 'x'\n")
    with pytest.raises(SettingsError, match=r"secrets.toml: unknown key hf_tokn"):
        store.load()


def test_a_bad_file_is_kept_aside_and_the_defaults_used(tmp_path: Path) -> None:
    store = SettingsStore()
    store.save(full_settings(tmp_path))  # a good token stays: only the bad file is reset
    store.path.write_text("[hub]\nparallel_downloads = 'two'\n")
    settings, problem = store.load_or_reset()
    assert problem is not None and "parallel_downloads" in problem
    assert "settings.toml.bad" in problem
    assert settings.hub == HubSettings() and settings.token() == TOKEN
    assert not store.path.exists()
    assert (store.path.parent / "settings.toml.bad").read_text().startswith("[hub]")
    assert store.load_or_reset() == (settings, None)


def test_good_files_load_without_a_problem(tmp_path: Path) -> None:
    store = SettingsStore()
    store.save(full_settings(tmp_path))
    assert store.load_or_reset() == (full_settings(tmp_path), None)


def test_with_and_without_model(tmp_path: Path) -> None:
    path = tmp_path / "a.gguf"
    other = LoadSettings(model_path=tmp_path / "elsewhere.gguf", n_ctx=512)
    settings = AppSettings().with_model(path, ModelPrefs(other))
    assert settings.model_prefs(path).load.model_path == path  # keyed by the file it is for
    assert settings.model_prefs(path).load.n_ctx == 512
    assert settings.without_model(path).models == {}


def test_models_path_and_host(tmp_path: Path) -> None:
    assert AppSettings().models_path(tmp_path) == tmp_path
    assert AppSettings(models_dir=tmp_path / "m").models_path(Path("/x")) == tmp_path / "m"
    assert ServerSettings().host == "127.0.0.1"
    assert ServerSettings(allow_network=True).host == "0.0.0.0"
