"""The other quants of a model's repository: those in the library and those on the Hub.

Pure functions; the Hub part runs on the network thread. A vision model's Hub choices bring
its projector (the repository's mmproj file, F16 if there is one) among their `files`.

    >>> [c.label for c in merge(local_choices(model, library), remote_choices(details))]
    ['F32 — tiny-F32.gguf (in library)', 'F16 — tiny-Q4_K_M.gguf (download 2.52 MiB)', ...]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.hub.client import RepoDetails, RepoFile
from runtime.hub.quants import choose_projector, group_gguf_files, quant_from_name
from runtime.library.library import LibraryModel
from runtime.library.projectors import is_projector_name
from runtime.units import fmt_bytes


@dataclass(frozen=True)
class QuantChoice:
    """One quant of the repository. `path` is set when it is in the library; `files` are what
    to download when it is not."""

    name: str  # the (first part's) file name: the identity across library and Hub
    quant: str
    size: int
    path: Path | None = None
    files: tuple[RepoFile, ...] = ()  # the model's, then its projector's
    projector: RepoFile | None = None  # a vision model's, downloaded with it

    @property
    def local(self) -> bool:
        return self.path is not None

    @property
    def label(self) -> str:
        where = "in library" if self.local else f"download {fmt_bytes(self.size)}"
        if not self.local and self.projector is not None:
            where += f" + vision projector {fmt_bytes(self.projector.size)}"
        return f"{self.quant} — {self.name} ({where})"


def siblings(model: LibraryModel, library: Iterable[LibraryModel]) -> list[LibraryModel]:
    """Library models of the same repository (the same folder when the repo is unknown)."""
    if model.repo_id:
        return [m for m in library if m.repo_id == model.repo_id]
    return [m for m in library if m.path.parent == model.path.parent]


def local_choices(model: LibraryModel, library: Iterable[LibraryModel]) -> list[QuantChoice]:
    out = [QuantChoice(m.path.name, m.quant or quant_from_name(m.path.name) or "?", m.size,
                       path=m.path)
           for m in siblings(model, library) if m.error is None]
    if not any(c.path == model.path for c in out):
        out.append(QuantChoice(model.path.name, model.quant or "?", model.size, path=model.path))
    return out


def remote_choices(details: RepoDetails) -> list[QuantChoice]:
    """The repository's chat models (split parts together), quant from the file name, each
    with the repository's projector when it has one."""
    chosen = choose_projector(details)
    projector = chosen.file if chosen is not None else None
    out = []
    for group in group_gguf_files(details.gguf_files):
        first = group[0].name
        if is_projector_name(first) or "imatrix" in first.lower():
            continue
        files = tuple(group) + ((projector,) if projector is not None else ())
        out.append(QuantChoice(first, quant_from_name(first) or first,
                               sum(f.size or 0 for f in group), files=files,
                               projector=projector))
    return out


def merge(local: Sequence[QuantChoice], remote: Sequence[QuantChoice]) -> list[QuantChoice]:
    """Library entries win over Hub entries of the same file; sorted by size, largest first."""
    by_name = {c.name: c for c in remote}
    by_name.update({c.name: c for c in local})
    return sorted(by_name.values(), key=lambda c: (-c.size, c.name))
