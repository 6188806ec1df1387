"""The app's own settings, typed and validated, kept as TOML in the config folder.

    >>> import tempfile
    >>> config = tempfile.TemporaryDirectory()       # the app's: SettingsStore() alone
    >>> store = SettingsStore(Path(config.name, "settings.toml"))   # and secrets.toml beside it
    >>> settings, problem = store.load_or_reset()     # problem: one line, or None
    >>> settings.hub.preferred_quant, settings.fit.n_ctx, problem
    ('Q4_K_M', 4096, None)
    >>> path = Path("models/owner/repo/model-Q4_K_M.gguf")
    >>> settings = settings.with_model(path, ModelPrefs(LoadSettings(path, n_ctx=8192)))
    >>> store.save(settings)
    >>> SettingsStore(store.path).load().model_prefs(path).load.n_ctx
    8192
    >>> config.cleanup()

What is kept: the models folder, the Hugging Face token and the local server's API key (both
in a separate `secrets.toml` readable by the user alone, mode 0600, and shown as `***` by
every `repr`), the Hub endpoint (a mirror), the preferred quant level for downloads, parallel
downloads, the server's port and whether it may be reached from the network, the theme, the
context and KV cache types the fit verdicts assume, and each model file's load settings and
sampling defaults (`[models."<path>"]`).

A key the app does not know or a value of the wrong type or range is an error that names the
key, never silently dropped: `load` raises `SettingsError`; `load_or_reset` keeps the file
aside as `settings.toml.bad`, starts from defaults and returns the message for the app to
show.

    settings.toml: hub.parallel_downloads must be a whole number, not 'two'
    settings.toml: unknown key server.adress (known: port, allow_network)

Written with `tomli-w` (the TOML writer paired with the standard library's `tomllib` reader)
rather than by hand: quoting arbitrary paths as table keys is where small writers go wrong.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import tomli_w

from runtime.atomic_file import write_text
from runtime.errors import SettingsError
from runtime.events import SamplingParams
from runtime.paths import user_dirs
from runtime.settings.load import KV_CACHE_TYPES, DraftSettings, LoadSettings

# Quality order, best first (runtime.hub.quants.PREFERRED_QUANTS, repeated here so reading the
# settings does not import the Hub client; a unit test keeps the two equal).
QUANT_LEVELS: tuple[str, ...] = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K")
Theme = Literal["system", "light", "dark"]
THEMES: tuple[str, ...] = ("system", "light", "dark")
MAX_PARALLEL_DOWNLOADS = 8
MAX_SAVED_KV_GIB = 1024


@dataclass(frozen=True)
class Secret:
    """A credential. `str()` and `repr()` never show it; `reveal()` does, for the one call
    that needs it.

    >>> token = Secret("hf_abcdefghijklmnop"); token, f"{token}", token.masked
    (Secret('***'), '***', 'hf_…mnop')
    """

    value: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not self.value.strip():
            raise SettingsError("a secret must be a non-empty string")
        if self.value != self.value.strip():
            object.__setattr__(self, "value", self.value.strip())

    def reveal(self) -> str:
        return self.value

    @property
    def masked(self) -> str:
        """For display: the first 3 and last 4 characters of a long token, else ***."""
        v = self.value
        return f"{v[:3]}…{v[-4:]}" if len(v) >= 16 else "***"

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"


@dataclass(frozen=True)
class HubSettings:
    endpoint: str | None = None  # None: HF_ENDPOINT if set, else https://huggingface.co
    preferred_quant: str = "Q4_K_M"
    parallel_downloads: int = 2

    def __post_init__(self) -> None:
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise SettingsError(f"the Hub endpoint must be an http(s) URL, not {self.endpoint!r}")
        if self.preferred_quant not in QUANT_LEVELS:
            raise SettingsError(f"preferred quant must be one of {', '.join(QUANT_LEVELS)}, "
                                f"not {self.preferred_quant!r}")
        if not 1 <= self.parallel_downloads <= MAX_PARALLEL_DOWNLOADS:
            raise SettingsError(f"parallel downloads must be 1..{MAX_PARALLEL_DOWNLOADS}, "
                                f"not {self.parallel_downloads}")


@dataclass(frozen=True)
class ServerSettings:
    port: int = 1234  # the local API's port (LM Studio's default, what other tools expect)
    allow_network: bool = False  # listen on every interface instead of 127.0.0.1 only

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise SettingsError(f"the server port must be 1..65535, not {self.port}")

    @property
    def host(self) -> str:
        return "0.0.0.0" if self.allow_network else "127.0.0.1"


@dataclass(frozen=True)
class FitDefaults:
    """What the fit verdicts of the quant table assume (a model's own settings override)."""

    n_ctx: int = 4096
    type_k: str = "f16"
    type_v: str = "f16"

    def __post_init__(self) -> None:
        if self.n_ctx < 16:
            raise SettingsError(f"the default context must be at least 16 tokens, not {self.n_ctx}")
        for name, value in (("K", self.type_k), ("V", self.type_v)):
            if value not in KV_CACHE_TYPES:
                raise SettingsError(f"default {name} cache type {value!r} is not one of "
                                    f"{', '.join(KV_CACHE_TYPES)}")


@dataclass(frozen=True)
class ModelPrefs:
    """What is remembered for one model file: how to load it and how to sample from it."""

    load: LoadSettings
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class AppSettings:
    models_dir: Path | None = None  # None: the platform's data folder (see runtime.paths)
    theme: Theme = "system"
    hub: HubSettings = field(default_factory=HubSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    fit: FitDefaults = field(default_factory=FitDefaults)
    hf_token: Secret | None = None
    server_api_key: Secret | None = None
    models: Mapping[str, ModelPrefs] = field(default_factory=dict)  # str(path) → prefs
    highlight_drafts: bool = False  # the chat's "Draft tokens" toggle: tint accepted drafts
    # Disk the engine may fill with idle conversations' KV caches, to resume them without a
    # prefill (runtime.engine.kv_store; `outrider serve --saved-kv-gib`). 0: none kept.
    saved_kv_gib: float = 4.0

    def __post_init__(self) -> None:
        if self.theme not in THEMES:
            raise SettingsError(f"theme must be one of {', '.join(THEMES)}, not {self.theme!r}")
        if not 0 <= self.saved_kv_gib <= MAX_SAVED_KV_GIB:
            raise SettingsError(f"the saved KV cache budget must be 0..{MAX_SAVED_KV_GIB} GiB, "
                                f"not {self.saved_kv_gib}")
        if self.models_dir is not None and not Path(self.models_dir).is_absolute():
            raise SettingsError(f"the models folder must be an absolute path, not {self.models_dir}")

    def models_path(self, default: Path) -> Path:
        """The models folder to use: this setting, else `default` (`user_dirs().models`)."""
        return self.models_dir or default

    def token(self) -> str | None:
        """The Hugging Face token in clear, for the Hub client only."""
        return self.hf_token.reveal() if self.hf_token else None

    def model_prefs(self, path: Path | str) -> ModelPrefs:
        """The remembered settings of a model file, or the defaults (the fit context and
        KV types) for one never configured."""
        key = str(Path(path))
        if key in self.models:
            return self.models[key]
        return ModelPrefs(LoadSettings(model_path=Path(path), n_ctx=self.fit.n_ctx,
                                       type_k=self.fit.type_k, type_v=self.fit.type_v))

    def with_model(self, path: Path | str, prefs: ModelPrefs) -> AppSettings:
        """A copy remembering `prefs` for `path` (its load settings get that model_path)."""
        load = dataclasses.replace(prefs.load, model_path=Path(path))
        models = {**self.models, str(Path(path)): ModelPrefs(load, prefs.sampling)}
        return dataclasses.replace(self, models=models)

    def without_model(self, path: Path | str) -> AppSettings:
        return dataclasses.replace(
            self, models={k: v for k, v in self.models.items() if k != str(Path(path))})


# -- TOML ↔ dataclasses ---------------------------------------------------------------------

_SECRET_KEYS = ("hf_token", "server_api_key")


def settings_to_toml(settings: AppSettings) -> dict[str, Any]:
    """The settings file's content (secrets excluded), None values left out."""
    out: dict[str, Any] = {}
    if settings.models_dir is not None:
        out["models_dir"] = str(settings.models_dir)
    out["theme"] = settings.theme
    out["highlight_drafts"] = settings.highlight_drafts
    out["saved_kv_gib"] = settings.saved_kv_gib
    for name in ("hub", "server", "fit"):
        out[name] = _plain(dataclasses.asdict(getattr(settings, name)))
    models: dict[str, Any] = {}
    for key, prefs in sorted(settings.models.items()):
        load = prefs.load.to_dict()
        del load["model_path"]  # the table's key
        models[key] = _plain({**load, "sampling": dataclasses.asdict(prefs.sampling)})
    if models:
        out["models"] = models
    return out


def settings_from_toml(data: dict[str, Any]) -> AppSettings:
    """Validate and build (secrets aside); raises SettingsError naming the first bad key."""
    data = dict(data)
    raw_models = data.pop("models", {})
    if not isinstance(raw_models, dict):
        raise SettingsError("models must be a table of model files")
    base = _build(AppSettings, data, "", skip={"models", *_SECRET_KEYS})
    models: dict[str, ModelPrefs] = {}
    for key, table in raw_models.items():
        where = f"models.{key!r}."
        if not isinstance(table, dict):
            raise SettingsError(f"{where[:-1]} must be a table")
        table = dict(table)
        sampling = _build(SamplingParams, table.pop("sampling", {}), where + "sampling.")
        load = _build(LoadSettings, {**table, "model_path": key}, where)
        models[str(Path(key))] = ModelPrefs(load, sampling)
    return dataclasses.replace(base, models=models)


def secrets_from_toml(data: dict[str, Any]) -> dict[str, Secret]:
    """The credentials of `secrets.toml` by setting name (hf_token, server_api_key)."""
    _refuse_unknown(data, set(_SECRET_KEYS), "")
    return {k: Secret(_expect(v, str, k)) for k, v in data.items()}


def _plain(value: Any) -> Any:
    """Drop None (TOML has no null: an absent key reads back as the default, None), Paths →
    str, tuples → lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _refuse_unknown(data: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        keys = ", ".join(where + k for k in unknown)
        raise SettingsError(f"unknown key{'s' if len(unknown) > 1 else ''} {keys} "
                            f"(known: {', '.join(sorted(known))})")


def _build(cls: type, data: Any, where: str, skip: frozenset[str] | set[str] = frozenset()) -> Any:
    """An instance of dataclass `cls` from TOML data, checking every key and type."""
    if not isinstance(data, dict):
        raise SettingsError(f"{where[:-1] or 'the file'} must be a table, not {data!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init} - set(skip)
    _refuse_unknown(data, names, where)
    kwargs = {k: _coerce(v, hints[k], where + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except SettingsError as exc:
        raise SettingsError(f"{where[:-1]}: {exc}" if where else str(exc)) from None


_KIND = {bool: "true or false", int: "a whole number", float: "a number", str: "text",
         Path: "a path"}


def _expect(value: Any, tp: type, name: str) -> Any:
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        Path: isinstance(value, str) and bool(value),
    }[tp]
    if not ok:
        raise SettingsError(f"{name} must be {_KIND[tp]}, not {value!r}")
    if tp is float:
        return float(value)
    return Path(value) if tp is Path else value


def _coerce(value: Any, tp: Any, name: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return _coerce(value, options[0], name)
        problems = []
        for option in options:  # int | Literal["all", "auto"]: the first that takes it
            try:
                return _coerce(value, option, name)
            except SettingsError as exc:
                problems.append(str(exc).removeprefix(f"{name} must be ").split(", not ")[0])
        raise SettingsError(f"{name} must be {' or '.join(problems)}, not {value!r}")
    if origin is Literal:
        if value not in get_args(tp):
            allowed = ", ".join(str(a) for a in get_args(tp))
            raise SettingsError(f"{name} must be one of {allowed}, not {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise SettingsError(f"{name} must be a list, not {value!r}")
        item = get_args(tp)[0]
        return tuple(_coerce(v, item, f"{name}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, name + ".")  # type: ignore[arg-type]
    if tp in _KIND:
        return _expect(value, tp, name)
    raise SettingsError(f"{name}: unsupported setting type {tp}")  # pragma: no cover


# -- the files ------------------------------------------------------------------------------


class SettingsStore:
    """`settings.toml` and `secrets.toml` (mode 0600) in the config folder."""

    def __init__(self, path: Path | None = None, secrets_path: Path | None = None) -> None:
        if path is None:
            path = user_dirs().settings_file
        self.path = Path(path)
        self.secrets_path = Path(secrets_path or self.path.with_name("secrets.toml"))

    def __repr__(self) -> str:
        return f"SettingsStore({str(self.path)!r})"

    def load(self) -> AppSettings:
        """The saved settings (defaults where there is no file); SettingsError if invalid."""
        settings = self._load_settings()
        return _with_secrets(settings, self._load_secrets())

    def load_or_reset(self) -> tuple[AppSettings, str | None]:
        """`load()`, or, where a file is invalid, its defaults and a one-line message saying
        what was wrong and where the file was kept (`settings.toml.bad`)."""
        problems = []
        try:
            settings = self._load_settings()
        except SettingsError as exc:
            settings = AppSettings()
            problems.append(self._reset(self.path, exc))
        try:
            secrets = self._load_secrets()
        except SettingsError as exc:
            secrets = {}
            problems.append(self._reset(self.secrets_path, exc))
        return _with_secrets(settings, secrets), "; ".join(problems) or None

    def _load_settings(self) -> AppSettings:
        data = self._read(self.path)
        try:
            return settings_from_toml(data)
        except SettingsError as exc:
            raise SettingsError(f"{self.path.name}: {exc}") from None

    def _load_secrets(self) -> dict[str, Secret]:
        data = self._read(self.secrets_path)
        try:
            return secrets_from_toml(data)
        except SettingsError as exc:
            raise SettingsError(f"{self.secrets_path.name}: {exc}") from None

    def save(self, settings: AppSettings) -> None:
        """Write both files atomically (a temporary file renamed into place), with exact modes:
        a secret is never readable by others, not even briefly, whatever the umask."""
        text = tomli_w.dumps(settings_to_toml(settings))
        _write_settings_file(self.path, text, 0o644)
        secrets = {k: getattr(settings, k).reveal() for k in _SECRET_KEYS if getattr(settings, k)}
        if secrets:
            _write_settings_file(self.secrets_path, tomli_w.dumps(secrets), 0o600)
        else:
            self.secrets_path.unlink(missing_ok=True)

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{path.name} cannot be read: {exc}") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{path.name} is not valid TOML: {exc}") from None

    @staticmethod
    def _reset(path: Path, exc: SettingsError) -> str:
        """Keep a bad file aside (never overwritten by the next save); say so in one line."""
        if not path.exists():
            return str(exc)
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        return f"{exc} — kept aside as {bad.name}; using the defaults"


def _with_secrets(settings: AppSettings, secrets: dict[str, Secret]) -> AppSettings:
    return dataclasses.replace(settings, hf_token=secrets.get("hf_token"),
                               server_api_key=secrets.get("server_api_key"))


def _write_settings_file(path: Path, text: str, mode: int) -> None:
    # A unique temporary name per writer: a background save and the final save at exit never
    # share one. fsync: settings lost to a power cut cost the user their choices.
    write_text(path, text, mode=mode, fsync=True, prefix=f".{path.name}.", suffix=".tmp")


__all__ = ["QUANT_LEVELS", "THEMES", "AppSettings", "DraftSettings", "FitDefaults", "HubSettings",
           "LoadSettings", "ModelPrefs", "Secret", "ServerSettings", "SettingsStore",
           "secrets_from_toml", "settings_from_toml", "settings_to_toml"]
