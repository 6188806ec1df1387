"""The app's memory of draft verdicts: the pairing itself is `runtime.library.drafts`.

Judging reads token lists from disk, so the pages run these functions on a worker thread
(`ModelServices.on_disk`). Pure Python, no Qt. Reading a big vocabulary takes a while, so
each pair's verdict is kept across library scans (`DraftVerdicts`, keyed by both files'
path, size and modification time: a file changed on disk is judged again).

    >>> verdicts = DraftVerdicts()
    >>> [(c.model.name, c.reasons) for c in judge_drafts(target, library_models, verdicts)]
    [('tiny-draft', ()), ('tiny-alien', ("the target's BOS token ...",))]
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from runtime.library import drafts as pairing
from runtime.library.drafts import DraftCandidate, DraftJudge, Refusals
from runtime.library.library import LibraryModel

_Key = tuple[str, int, float]


class DraftVerdicts:
    """Remembered verdicts per (target file, draft file) as they were on disk when judged.
    Thread-safe: the Library page and the Settings page judge on worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: dict[tuple[_Key, _Key], tuple[str, ...]] = {}

    def get(self, target: LibraryModel, draft: LibraryModel) -> tuple[str, ...] | None:
        with self._lock:
            return self._verdicts.get((_key(target), _key(draft)))

    def put(self, target: LibraryModel, draft: LibraryModel, reasons: tuple[str, ...]) -> None:
        with self._lock:
            self._verdicts[(_key(target), _key(draft))] = reasons

    def remembering(self, judge: Refusals) -> Refusals:
        """`judge`, asked only about pairs not judged before; its answers are kept."""
        def refusals(target: LibraryModel, draft: LibraryModel) -> tuple[str, ...]:
            reasons = self.get(target, draft)
            if reasons is None:
                reasons = judge(target, draft)
                self.put(target, draft, reasons)
            return reasons

        return refusals


def _key(model: LibraryModel) -> _Key:
    return (str(model.path), model.size, model.mtime)


def judge_drafts(target: LibraryModel, candidates: Iterable[LibraryModel],
                 verdicts: DraftVerdicts | None = None) -> list[DraftCandidate]:
    """Every other candidate with the reasons it cannot draft for `target` (none: it can),
    compatible ones first, then by size; verdicts already in `verdicts` are not judged again."""
    verdicts = verdicts if verdicts is not None else DraftVerdicts()
    return pairing.judge_drafts(target, candidates, verdicts.remembering(DraftJudge().refusals))


def compatible_drafts(models: Sequence[LibraryModel],
                      verdicts: DraftVerdicts | None = None) -> dict[Path, list[LibraryModel]]:
    """For each model, the library models that can draft for it (smallest first); each
    file's tokenizer is read at most once, however many pairs it takes part in."""
    verdicts = verdicts if verdicts is not None else DraftVerdicts()
    refusals = verdicts.remembering(DraftJudge().refusals)
    return {m.path: pairing.compatible_drafts(m, models, refusals) for m in models}
