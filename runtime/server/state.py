"""What one server instance knows besides its engine: limits, the key, where models may live,
and whether a load is under way.

Paths in requests are confined to the models library. `confine` resolves a path (following
symlinks, so a link out of the library does not count as inside) and refuses anything outside:

    >>> state = ServerState(engine, api_key=None, models_dir=Path("/lib"), limits=ServerLimits())
    >>> state.confine("owner/repo/m.gguf")          # relative: inside the library
    PosixPath('/lib/owner/repo/m.gguf')
    >>> state.confine("/lib/../etc/passwd")
    Traceback (most recent call last):
    runtime.errors.PathNotAllowed: /etc/passwd is outside the models library (/lib) ...
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.engine.api import EngineAPI, LoadedModel
from runtime.errors import EngineBusy, NoModelLoaded, PathNotAllowed


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what one request may ask for.

    `max_tokens` caps a request's `max_tokens` (asking for more is a 400); a request without
    one gets `default_max_tokens`, cut to the loaded context.
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens: int = 8192
    default_max_tokens: int = 2048
    max_n: int = 8
    max_stop: int = 8
    metrics_interval_s: float = 1.0
    poll_interval_s: float = 0.2  # how long a bridge thread blocks in handle.get()


@dataclass
class ServerState:
    engine: EngineAPI
    api_key: str | None
    models_dir: Path
    limits: ServerLimits
    allowed_models: frozenset[Path] = frozenset()  # resolved; models the server was started with
    allow_any_path: bool = False
    plan: Any = None  # the memory plan of the loaded model, JSON-ready
    _busy: threading.Lock = field(default_factory=threading.Lock)
    _loading: bool = False

    @classmethod
    def create(cls, engine: EngineAPI, *, api_key: str | None, models_dir: Path,
               limits: ServerLimits, allowed_models: Iterable[Path] = (),
               allow_any_path: bool = False) -> ServerState:
        return cls(engine, api_key, models_dir.expanduser().resolve(), limits,
                   frozenset(Path(p).expanduser().resolve() for p in allowed_models),
                   allow_any_path)

    def confine(self, path: str | Path) -> Path:
        """The resolved path if a request may load it, else `PathNotAllowed`.

        Relative paths are taken relative to the library. Only the resolved result is checked,
        so `..` segments and symlinks cannot lead out of it.
        """
        raw = Path(path).expanduser()
        if "\x00" in str(raw):
            raise PathNotAllowed("a model path may not contain a NUL character")
        resolved = (raw if raw.is_absolute() else self.models_dir / raw).resolve()
        if (self.allow_any_path or resolved in self.allowed_models
                or resolved.is_relative_to(self.models_dir)):
            return resolved
        raise PathNotAllowed(
            f"{resolved} is outside the models library ({self.models_dir}); "
            "the server loads only models inside it (or starts with --allow-any-path)")

    # A load or unload holds the lock; everything that needs a stable model checks it.
    def begin_exclusive(self, what: str) -> None:
        if not self._busy.acquire(blocking=False):
            raise EngineBusy(f"cannot {what} now: a model is being loaded or unloaded")
        self._loading = what == "load"

    def end_exclusive(self) -> None:
        self._loading = False
        self._busy.release()

    @property
    def loading(self) -> bool:
        return self._loading

    def loaded_model(self) -> LoadedModel:
        """The model generation requests run on; 503s while none is ready."""
        if self._loading:
            raise NoModelLoaded("a model is loading; try again when /api/status says ready")
        model = self.engine.status().model
        if model is None:
            raise NoModelLoaded(
                "no model is loaded: load one with POST /api/load or start the server with a MODEL")
        return model
