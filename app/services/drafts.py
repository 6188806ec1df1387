"""Which library models can draft for which: the speculative compatibility check, with reasons.

Runs on a worker thread (it reads token lists from disk). Pure Python, no Qt. Reading a big
vocabulary takes a while, so each pair's verdict is kept (`DraftVerdicts`, keyed by both
files' path, size and modification time) and each file's tokenizer is read at most once per
call, however many pairs it takes part in.

    >>> verdicts = DraftVerdicts()
    >>> [(c.model.name, c.reasons) for c in judge_drafts(target, library_models, verdicts)]
    [('tiny-draft', ()), ('tiny-alien', ('vocabulary sizes differ by ...',))]
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import OutriderError
from runtime.library.library import LibraryModel

NOT_SMALLER = "it is not smaller than the model (a draft must be cheaper to run)"
_Key = tuple[str, int, float]


@dataclass(frozen=True)
class DraftCandidate:
    model: LibraryModel
    reasons: tuple[str, ...]  # empty: it can draft

    @property
    def compatible(self) -> bool:
        return not self.reasons


class DraftVerdicts:
    """Remembered verdicts per (target file, draft file) as they were on disk when judged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: dict[tuple[_Key, _Key], tuple[str, ...]] = {}

    def get(self, target: LibraryModel, draft: LibraryModel) -> tuple[str, ...] | None:
        with self._lock:
            return self._verdicts.get((_key(target), _key(draft)))

    def put(self, target: LibraryModel, draft: LibraryModel, reasons: tuple[str, ...]) -> None:
        with self._lock:
            self._verdicts[(_key(target), _key(draft))] = reasons


def _key(model: LibraryModel) -> _Key:
    return (str(model.path), model.size, model.mtime)


class _Facts:
    """TokenizerFacts per file for one call, read on first use."""

    def __init__(self) -> None:
        self._cache: dict[Path, Any] = {}
        self.compat: Any = None
        try:
            from runtime.speculative import compat
        except ImportError:  # pragma: no cover - the speculative package ships with the app
            return
        self.compat = compat

    def of(self, path: Path) -> Any:
        if path not in self._cache:
            self._cache[path] = self.compat.TokenizerFacts.from_gguf(path)
        return self._cache[path]


def judge_drafts(target: LibraryModel, candidates: Iterable[LibraryModel],
                 verdicts: DraftVerdicts | None = None,
                 facts: _Facts | None = None) -> list[DraftCandidate]:
    """Every other candidate with the reasons it cannot draft for `target` (none: it can),
    compatible ones first, then by size."""
    verdicts = verdicts if verdicts is not None else DraftVerdicts()
    facts = facts or _Facts()
    out = []
    for c in candidates:
        if c.path == target.path:
            continue
        reasons = verdicts.get(target, c)
        if reasons is None:
            reasons = tuple(_reasons(target, c, facts))
            verdicts.put(target, c, reasons)
        out.append(DraftCandidate(c, reasons))
    return sorted(out, key=lambda d: (not d.compatible, d.model.size, d.model.id))


def compatible_drafts(models: Sequence[LibraryModel],
                      verdicts: DraftVerdicts | None = None) -> dict[Path, list[LibraryModel]]:
    """For each model, the library models that can draft for it (smallest first)."""
    facts = _Facts()
    return {m.path: [d.model for d in judge_drafts(m, models, verdicts, facts) if d.compatible]
            for m in models}


def _reasons(target: LibraryModel, draft: LibraryModel, facts: _Facts) -> list[str]:
    if target.error or target.info is None:
        return [f"the model itself cannot be read ({target.error or 'no header'})"]
    if draft.error or draft.info is None:
        return [f"it cannot be read ({draft.error or 'no header'})"]
    if draft.size >= target.size:
        return [NOT_SMALLER]
    if facts.compat is None:  # pragma: no cover - see _Facts
        same = target.info.get("vocab_fingerprint") == draft.info.get("vocab_fingerprint")
        return [] if same else ["the vocabularies differ"]
    try:
        return list(facts.compat.check_draft_compat(facts.of(target.path), facts.of(draft.path)))
    except OutriderError as exc:
        return [str(exc)]
