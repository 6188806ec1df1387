"""What one server instance knows besides its engine: limits, the key, where models may live,
and whether a load is under way.

Paths in requests are confined to the models library. `confine` resolves a path (following
symlinks, so a link out of the library does not count as inside) and refuses anything outside:

    >>> from pathlib import Path
    >>> state = ServerState(None, api_key=None, models_dir=Path("/library"), limits=ServerLimits())
    >>> state.confine("owner/repo/m.gguf")          # relative: inside the library
    PosixPath('/library/owner/repo/m.gguf')
    >>> state.confine("/library/../etc/passwd")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    runtime.errors.PathNotAllowed: /etc/passwd is outside the models library (/library)...
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.engine.api import EngineAPI
from runtime.errors import EngineBusy, PathNotAllowed
from runtime.server.models.names import ModelNames

if TYPE_CHECKING:
    from runtime.server.models.router import ModelRouter


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what one request may ask for.

    `max_tokens` caps a request's `max_tokens` (asking for more is a 400); a request without
    one gets `default_max_tokens`, cut to the loaded context.
    """

    max_body_bytes: int = 32 * 1024 * 1024  # room for an image as a data: URI
    max_tokens: int = 8192
    default_max_tokens: int = 2048
    max_n: int = 8
    max_stop: int = 8
    metrics_interval_s: float = 1.0
    poll_interval_s: float = 0.2  # how long a bridge thread blocks in handle.get()
    allow_remote_images: bool = False  # fetch http(s) image URLs (`--allow-remote-images`)


@dataclass
class ServerState:
    """`router` decides which engine serves a request's model (`runtime.server.models.router`);
    `engine` is its primary one: the start-up model's, what /api/load loads."""

    router: ModelRouter
    api_key: str | None
    models_dir: Path
    limits: ServerLimits
    allowed_models: frozenset[Path] = frozenset()  # resolved; models the server was started with
    allow_any_path: bool = False
    _busy: threading.Lock = field(default_factory=threading.Lock)
    _loading: bool = False

    @classmethod
    def create(cls, router: ModelRouter, *, api_key: str | None, models_dir: Path,
               limits: ServerLimits, allowed_models: Iterable[Path] = (),
               allow_any_path: bool = False) -> ServerState:
        return cls(router, api_key, models_dir.expanduser().resolve(), limits,
                   frozenset(Path(p).expanduser().resolve() for p in allowed_models),
                   allow_any_path)

    @property
    def engine(self) -> EngineAPI:
        return self.router.primary

    @property
    def names(self) -> ModelNames:
        """The names requests may give, resident models first (`runtime.server.models.names`)."""
        return ModelNames(self.models_dir, self.router.named)

    @property
    def plan(self) -> Any:
        """The memory plan of the primary engine's model, JSON-ready (None: no model, or
        none could be made)."""
        slot = self.router.primary_slot()
        return None if slot is None else slot.plan

    @plan.setter
    def plan(self, plan: Any) -> None:
        slot = self.router.primary_slot()
        if slot is not None:
            slot.plan = plan

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
