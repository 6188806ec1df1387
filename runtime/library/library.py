"""The local library of GGUF models: `models/<owner>/<repo>/<file>.gguf` under the user data dir.

    lib = Library()                            # the user's own models folder
    [(m.id, m.quant, m.size) for m in lib.scan()]
    # [('bartowski/Qwen2.5-7B-Instruct-GGUF/Qwen2.5-7B-Instruct-Q4_K_M.gguf', 'Q4_K_M', 4683073952)]
    lib.import_file(Path("~/Downloads/x-Q8_0.gguf").expanduser(), mode="link")
    [m.id for m in lib.discover()]             # already on disk elsewhere: HF cache, LM Studio
    # ['Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q8_0.gguf']
    [d.name for d in compatible_drafts(lib.find("Qwen2.5-7B-Instruct-Q4_K_M"), lib.scan())]
    # ['qwen2.5-0.5b-instruct-q8_0']            (runtime.library.drafts: the draft pairing)

Reading a header costs a few MB of I/O for a big vocabulary, so what a scan learns is cached
(`<cache>/library-index.json`) keyed by path, size and mtime: a changed file is read again.
A split model (`…-00001-of-0000N.gguf`) is one entry, found by its first part. Only files
whose name ends in `.gguf` count: partial downloads and half-copied imports never do.

A vision model's projector (`mmproj*.gguf`) is no entry of its own: it is the `projector` of
the models in its folder (`runtime.library.projectors`, the one pairing rule), and they have
"vision" among their `capabilities`. A vision model without one says so (`projector_missing`).

    m = lib.find("gemma-3-4b-it-Q4_K_M"); m.projector.name, m.capabilities
    # ('mmproj-model-f16.gguf', ('vision',))
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from runtime.atomic_file import write_text
from runtime.errors import IncompleteSplit, ModelNotFound, OutriderError, shown
from runtime.gguf.info import read_model_info
from runtime.gguf.preflight import SPLIT_NAME
from runtime.gguf.verdicts import FILE_NAME as VERDICTS_FILE
from runtime.gguf.verdicts import VerdictStore
from runtime.library.projectors import (
    LMSTUDIO_DIRS,
    is_projector_name,
    projector_for,
    vision_capable,
)
from runtime.paths import user_dirs

Source = Literal["library", "hf-cache", "lmstudio"]
ImportMode = Literal["copy", "move", "link"]

# What the index keeps of a ModelInfo (small, JSON-friendly).
_INFO_KEYS = ("architecture", "name", "quant", "n_params", "n_ctx_train", "n_vocab", "n_tokens",
              "vocab_fingerprint", "tensor_bytes", "split_count")


@dataclass(frozen=True)
class LibraryModel:
    """A model on disk. `path` is the first part of a split model; `parts` lists them all."""

    path: Path
    source: Source
    size: int
    mtime: float
    parts: tuple[Path, ...]
    repo_id: str | None = None
    info: dict[str, Any] | None = None  # header facts (_INFO_KEYS); None if unreadable
    error: str | None = None
    failing: str | None = None  # llama.cpp crashed loading it (runtime.gguf.verdicts): why
    projector: Path | None = None  # a vision model's mmproj beside it (runtime.library.projectors)

    @property
    def name(self) -> str:
        """The file stem; for a split model, the common prefix of its parts."""
        m = SPLIT_NAME.match(self.path.name)
        return m["prefix"] if m else self.path.stem

    @property
    def id(self) -> str:
        """`owner/repo/file` where known, else the file name."""
        return f"{self.repo_id}/{self.path.name}" if self.repo_id else self.path.name

    @property
    def quant(self) -> str | None:
        return None if self.info is None else self.info.get("quant")

    @property
    def architecture(self) -> str | None:
        return None if self.info is None else self.info.get("architecture")

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the model can do beyond text, as loaded from the library: ("vision",) with
        its projector beside it."""
        return ("vision",) if self.projector is not None else ()

    @property
    def vision(self) -> bool:
        """A vision model: it has its projector, or its architecture reads images."""
        n_params = None if self.info is None else self.info.get("n_params")
        return self.projector is not None or vision_capable(
            self.architecture, n_params if isinstance(n_params, int) else None)

    @property
    def projector_missing(self) -> bool:
        """A vision model whose projector is not beside it: it reads text only until it is."""
        return self.vision and self.projector is None


ReadInfo = Callable[[Path], Any]


class Library:
    """The models directory and the models found elsewhere on this disk."""

    def __init__(self, models_dir: Path | None = None, cache_dir: Path | None = None,
                 read_info: ReadInfo | None = None) -> None:
        dirs = user_dirs()
        self.models_dir = Path(models_dir or dirs.models)
        self._index_path = Path(cache_dir or dirs.cache) / "library-index.json"
        self._verdicts = VerdictStore(Path(cache_dir or dirs.cache) / VERDICTS_FILE)
        self._read_info = read_info
        self._index: dict[str, Any] | None = None

    # -- listing -------------------------------------------------------------------------------

    def scan(self) -> list[LibraryModel]:
        """Every model in the models directory, sorted by id."""
        if not self.models_dir.is_dir():
            return []
        models = [self._describe(first, "library", self._repo_of(first))
                  for first in _first_parts(self.models_dir.rglob("*.gguf"))]
        self._save_index()
        return sorted(models, key=lambda m: m.id.lower())

    def discover(self, hf_cache_dir: Path | None = None,
                 lmstudio_dirs: Sequence[Path] | None = None) -> list[LibraryModel]:
        """GGUF models already on disk outside the library: the Hugging Face cache and LM
        Studio's models folders. Import one (`mode="link"` costs no space) to use it."""
        found: list[LibraryModel] = []
        for hf_repo, path in _hf_cache_ggufs(hf_cache_dir):
            found.append(self._describe(path, "hf-cache", hf_repo))
        roots = lmstudio_dirs if lmstudio_dirs is not None else [
            Path(d).expanduser() for d in LMSTUDIO_DIRS]
        for root in roots:
            if not root.is_dir():
                continue
            for first in _first_parts(root.rglob("*.gguf")):
                rel = first.relative_to(root).parts
                repo_id = f"{rel[0]}/{rel[1]}" if len(rel) >= 3 else None
                found.append(self._describe(first, "lmstudio", repo_id))
        self._save_index()
        return sorted(found, key=lambda m: (m.source, m.id.lower()))

    def find(self, query: str) -> LibraryModel:
        """A library model by id (`owner/repo/file`), file name, stem or path."""
        models = self.scan()
        q = query.strip()
        path = Path(q).expanduser()
        for test in (
            lambda m: m.id == q or str(m.path) == q or (path.is_absolute() and m.path == path),
            lambda m: m.path.name == q or m.name == q,
            lambda m: m.id.lower() == q.lower() or m.name.lower() == q.lower(),
        ):
            hits = [m for m in models if test(m)]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                ids = ", ".join(m.id for m in hits)
                raise OutriderError(f"{q!r} matches several models ({ids}); give the full id")
        hits = [m for m in models if q.lower() in m.id.lower()]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise OutriderError(f"{q!r} matches several models ({', '.join(m.id for m in hits)})")
        raise ModelNotFound(f"no model {q!r} in the library ({self.models_dir}); see `outrider ls`")

    # -- changing ------------------------------------------------------------------------------

    def import_file(self, path: Path, mode: ImportMode = "copy",
                    repo_id: str | None = None) -> LibraryModel:
        """Bring an existing GGUF (all parts, if split) into the library.

        `copy` leaves the original; `move` takes it; `link` makes a symbolic link (no space
        used; the file stays where it is). Lands in `<owner>/<repo>/` when `repo_id` is
        given, else `imported/<name>/`. The file is checked (a typed error if it is not a
        usable GGUF) before anything is written.
        """
        if mode not in ("copy", "move", "link"):
            raise OutriderError(f"import mode must be copy, move or link, not {mode!r}")
        source = Path(path).expanduser().absolute()  # not resolve(): a symlink keeps its name
        self._info(source)  # raises ModelNotFound / NotAGGUF / IncompleteSplit / ...
        parts = _parts_of(source)
        m = SPLIT_NAME.match(parts[0].name)
        stem = m["prefix"] if m else parts[0].stem
        folder = self.models_dir / (repo_id if repo_id else f"imported/{stem}")
        folder.mkdir(parents=True, exist_ok=True)
        for part in parts:
            dest = folder / part.name
            if dest.exists() or dest.is_symlink():
                raise OutriderError(f"{shown(dest)} already exists in the library")
        for part in parts:
            _place(part, folder / part.name, mode)
        first = folder / parts[0].name
        model = self._describe(first, "library", self._repo_of(first))
        self._save_index()
        return model

    def delete(self, model: LibraryModel | str) -> list[Path]:
        """Remove a library model (all parts; a linked model loses only its link). Returns the
        paths removed. Models outside the library are never deleted from here."""
        target = self.find(model) if isinstance(model, str) else model
        root = self.models_dir.absolute()
        removed: list[Path] = []
        for part in target.parts:
            if root not in part.absolute().parents:
                raise OutriderError(f"{shown(part)} is not in the library ({self.models_dir}); "
                                    "Outrider only deletes its own files")
        for part in target.parts:
            part.unlink(missing_ok=True)
            removed.append(part)
            self._index_data().pop(str(part), None)
        folder = target.path.parent
        removed += _orphaned_projectors(folder, root)
        while folder != self.models_dir and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # tidy empty <owner>/<repo> folders
            folder = folder.parent
        self._save_index()
        return removed

    # -- internals -----------------------------------------------------------------------------

    def _repo_of(self, path: Path) -> str | None:
        rel = path.relative_to(self.models_dir).parts
        return f"{rel[0]}/{rel[1]}" if len(rel) >= 3 else None

    def _describe(self, first: Path, source: Source, repo_id: str | None) -> LibraryModel:
        parts = _parts_of(first, strict=False)
        stats = [p.stat() for p in parts]
        size = sum(s.st_size for s in stats)
        mtime = max(s.st_mtime for s in stats)
        m = SPLIT_NAME.match(first.name)
        projector = projector_for(first)
        if m and len(parts) != int(m["count"]):
            return LibraryModel(first, source, size, mtime, parts, repo_id, None,
                                f"only {len(parts)} of {int(m['count'])} parts are present",
                                projector=projector)
        try:
            info = self._cached_info(first, size, mtime)
        except OutriderError as exc:
            return LibraryModel(first, source, size, mtime, parts, repo_id, None, str(exc),
                                projector=projector)
        return LibraryModel(first, source, size, mtime, parts, repo_id, info,
                            failing=self._verdicts.failing(first), projector=projector)

    def _cached_info(self, first: Path, size: int, mtime: float) -> dict[str, Any]:
        index = self._index_data()
        entry = index.get(str(first))
        if entry and entry.get("size") == size and entry.get("mtime") == mtime:
            return dict(entry["info"])
        info = self._info(first)
        facts = {k: _plain(getattr(info, k, None)) for k in _INFO_KEYS}
        index[str(first)] = {"size": size, "mtime": mtime, "info": facts}
        return facts

    def _info(self, path: Path) -> Any:
        if self._read_info is not None:
            return self._read_info(path)
        return read_model_info(path)

    def _index_data(self) -> dict[str, Any]:
        if self._index is None:
            try:
                self._index = json.loads(self._index_path.read_text())
            except (OSError, ValueError):
                self._index = {}
        return self._index

    def _save_index(self) -> None:
        if self._index is None:
            return
        # Without the index the next scan reads headers again; nothing is lost.
        with contextlib.suppress(OSError):
            write_text(self._index_path, json.dumps(self._index))


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _first_parts(paths: Iterable[Path]) -> list[Path]:
    """The files that stand for a model: single files and the first part of split sets
    (a projector is not a model: it belongs to the models beside it)."""
    out = []
    for p in paths:
        if p.name.startswith(".") or is_projector_name(p.name) or not p.is_file():
            continue
        m = SPLIT_NAME.match(p.name)
        if m is None or int(m["no"]) == 1:
            out.append(p)
    return out


def _orphaned_projectors(folder: Path, root: Path) -> list[Path]:
    """Delete the projectors of a library folder no model is left in (the pair goes together);
    the paths deleted."""
    if root not in folder.absolute().parents:
        return []
    try:
        files = [p for p in folder.iterdir() if p.name.lower().endswith(".gguf")]
    except OSError:
        return []
    if any(not is_projector_name(p.name) for p in files):
        return []  # another model of the folder still uses them
    removed = []
    for p in files:
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


def _parts_of(first: Path, strict: bool = True) -> tuple[Path, ...]:
    """All parts of the model `first` belongs to (just itself when it is not split)."""
    m = SPLIT_NAME.match(first.name)
    if m is None:
        return (first,)
    count = int(m["count"])
    parts = [first.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    present = tuple(p for p in parts if p.is_file())
    if strict and len(present) != count:
        raise IncompleteSplit(f"{shown(first.name)}: only {len(present)} of {count} parts are present")
    return present


def _place(source: Path, dest: Path, mode: ImportMode) -> None:
    if mode == "link":
        try:
            dest.symlink_to(source)
        except OSError:  # no symlink rights (Windows without developer mode): a hard link
            try:
                os.link(source, dest)
            except OSError as exc:
                raise OutriderError(f"cannot link {shown(source.name)} into the library ({exc}); "
                                    "copy it instead") from exc
        return
    if mode == "move":
        try:
            os.replace(source, dest)
            return
        except OSError:
            pass  # another file system: copy, then remove the original below
    incoming = dest.with_name(f".{dest.name}.incoming")  # never seen by a scan (not *.gguf)
    try:
        shutil.copyfile(source, incoming)
        os.replace(incoming, dest)
    except OSError as exc:
        incoming.unlink(missing_ok=True)
        raise OutriderError(f"cannot copy {shown(source.name)} into the library: {exc}") from exc
    if mode == "move":
        source.unlink()


def _hf_cache_ggufs(cache_dir: Path | None) -> list[tuple[str, Path]]:
    """(repo_id, snapshot path) of each GGUF in the Hugging Face cache, newest revision first."""
    try:
        info = scan_cache_dir(cache_dir)
    except (CacheNotFound, OSError):
        return []
    out: list[tuple[str, Path]] = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        seen: set[str] = set()
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            for f in rev.files:
                if f.file_name.lower().endswith(".gguf") and f.file_name not in seen:
                    seen.add(f.file_name)
                    out.append((repo.repo_id, f.file_path))
    firsts = set(_first_parts(p for _, p in out))
    return [(r, p) for r, p in out if p in firsts]

