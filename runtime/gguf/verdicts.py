"""What llama.cpp did with a file, remembered per file: it loaded and ran, or it crashed.

    store = VerdictStore()                        # <user cache>/load-verdicts.json
    store.get(path)                               # None: never probed
    store.put(path, LoadVerdict(ok=False, reason="llama-model.cpp:1061: GGML_ASSERT(...) failed"))
    store.refuse_known_crash(path)                # LoadCrashed: llama.cpp crashed while loading …
    store.failing(path)                           # the crash text, for the library's mark

The engine's load probe (`runtime.engine.probe`) writes a verdict after loading a file in a
child process; a known-good file then loads directly and a known-bad one is refused at once.
The library reads the same store to mark a file as failing, the server to answer a known
crash with 400 before it streams anything.

A file is known by its path, size, modification time and a hash of its first MiB (the header
and the start of the vocabulary), and by the llama.cpp it was tried with: a re-downloaded or
edited file is a new file, an upgrade tries again, and a 10 GB file is never hashed whole. It lives here, below the engine and the library, because both
use it and the app may read it (the app never imports the engine).

Why a cache and not an index: losing it costs one probe per file, so two processes writing
it at once may drop each other's newest verdict; each write is still whole (atomic_file).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from runtime.atomic_file import write_text
from runtime.errors import LoadCrashed, shown
from runtime.paths import user_dirs

HEADER_BYTES = 1 << 20
FILE_NAME = "load-verdicts.json"
_VERSION = 1


@dataclass(frozen=True)
class LoadVerdict:
    ok: bool
    reason: str = ""  # a crash: llama.cpp's assertion text, one line


def file_key(path: Path) -> str:
    """The key of a file's verdict: sha256 over path, size, mtime, its first MiB and the
    llama-cpp-python version (a newer llama.cpp may load what an older one crashed on).

    file_key(Path("m.gguf")) -> "5c1f…" (64 hex digits); touching the file changes it.
    """
    resolved = Path(path).resolve()
    stat = resolved.stat()
    digest = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}\0"
                            f"{_llama_version()}\0".encode())
    with resolved.open("rb") as f:
        digest.update(f.read(HEADER_BYTES))
    return digest.hexdigest()


@cache
def _llama_version() -> str:
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return "?"


class VerdictStore:
    """The verdicts of one user (or of `path`, for tests)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else user_dirs().cache / FILE_NAME

    def get(self, model: Path) -> LoadVerdict | None:
        try:
            key = file_key(model)
        except OSError:
            return None
        entry = self._read().get(key)
        if not isinstance(entry, dict):
            return None
        return LoadVerdict(ok=bool(entry.get("ok")), reason=str(entry.get("reason", "")))

    def put(self, model: Path, verdict: LoadVerdict) -> None:
        files = self._read()
        files[file_key(model)] = {"ok": verdict.ok, "reason": verdict.reason,
                                  "name": Path(model).name, "checked": time.time()}
        write_text(self.path, json.dumps({"version": _VERSION, "files": files}, indent=1))

    def failing(self, model: Path) -> str | None:
        """The crash text when llama.cpp is known to crash on `model`, else None. Cheap for
        the usual answer (a library scan asks for every file): without a crash verdict for a
        file of that name, nothing is hashed."""
        name = Path(model).name
        if not any(isinstance(e, dict) and not e.get("ok") and e.get("name") == name
                   for e in self._read().values()):
            return None
        verdict = self.get(model)
        return verdict.reason if verdict is not None and not verdict.ok else None

    def refuse_known_crash(self, model: Path) -> None:
        """Raise `LoadCrashed` when llama.cpp is known to crash on `model`."""
        reason = self.failing(model)
        if reason is not None:
            raise crashed(model, reason)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # none yet, or unreadable: a cache starts over
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}


def crashed(model: Path, reason: str) -> LoadCrashed:
    """The one wording of a crash, for the probe and for a remembered verdict."""
    return LoadCrashed(f"llama.cpp crashed while loading {shown(Path(model).name)}: "
                       f"{shown(reason)}")
