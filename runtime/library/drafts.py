"""Which library models can draft for which: the one draft pairing, with reasons.

A pair is judged in order of cost, cheapest first: can both headers be read (the scan knows);
is the draft smaller (a draft must be cheaper to run than the model); are the vocabulary
sizes within llama.cpp's limit (the scan knows the token counts); and only then the full
compatibility check (`runtime.speculative.compat`), which reads both token lists. A
`DraftJudge` reads each file's tokenizer at most once, however many pairs it takes part in.

    judge = DraftJudge()                     # target, library_models: from Library.scan()
    [(c.model.name, c.reasons) for c in judge_drafts(target, library_models, judge.refusals)]
    # [('tiny-draft', ()), ('tiny-alien', ("the target's BOS token '<|endoftext|>' (id 0) ...",))]
    [m.name for m in compatible_drafts(target, library_models)]
    # ['tiny-draft']

Why not a method of `Library`: pairing needs no directory, and the app remembers verdicts
across scans (`app.services.drafts`) by passing its own `refusals`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import OutriderError
from runtime.gguf.vocab import TokenizerFacts, read_tokenizer_facts
from runtime.library.library import LibraryModel
from runtime.speculative.compat import check_draft_compat, vocab_size_refusal

NOT_SMALLER = "it is not smaller than the model (a draft must be cheaper to run)"

# (target, draft) → the reasons the draft cannot draft for the target; empty: it can.
Refusals = Callable[[LibraryModel, LibraryModel], tuple[str, ...]]


@dataclass(frozen=True)
class DraftCandidate:
    model: LibraryModel
    reasons: tuple[str, ...]  # empty: it can draft

    @property
    def compatible(self) -> bool:
        return not self.reasons


class DraftJudge:
    """Judges pairs, reading each file's tokenizer at most once (one judge per library look:
    a file changed on disk since is only seen by a new judge)."""

    def __init__(self) -> None:
        self._facts: dict[Path, TokenizerFacts] = {}

    def refusals(self, target: LibraryModel, draft: LibraryModel) -> tuple[str, ...]:
        """Why `draft` cannot draft for `target`, in words; empty if it can."""
        if target.error or target.info is None:
            return (f"the model itself cannot be read ({target.error or 'no header'})",)
        if draft.error or draft.info is None:
            return (f"it cannot be read ({draft.error or 'no header'})",)
        if draft.size >= target.size:
            return (NOT_SMALLER,)
        n_target, n_draft = target.info.get("n_tokens"), draft.info.get("n_tokens")
        if isinstance(n_target, int) and isinstance(n_draft, int):
            too_far = vocab_size_refusal(n_target, n_draft)
            if too_far:
                return (too_far,)  # the check would say so too; skip reading two vocabularies
        try:
            return tuple(check_draft_compat(self._read(target.path), self._read(draft.path)))
        except OutriderError as exc:
            return (str(exc),)

    def _read(self, path: Path) -> TokenizerFacts:
        if path not in self._facts:
            self._facts[path] = read_tokenizer_facts(path)
        return self._facts[path]


def judge_drafts(target: LibraryModel, candidates: Iterable[LibraryModel],
                 refusals: Refusals | None = None) -> list[DraftCandidate]:
    """Every other candidate with the reasons it cannot draft for `target` (none: it can),
    compatible ones first, then by size."""
    refusals = refusals or DraftJudge().refusals
    judged = [DraftCandidate(c, refusals(target, c)) for c in candidates if c.path != target.path]
    return sorted(judged, key=lambda d: (not d.compatible, d.model.size, d.model.id))


def compatible_drafts(target: LibraryModel, candidates: Iterable[LibraryModel],
                      refusals: Refusals | None = None) -> list[LibraryModel]:
    """The candidates that can draft for `target`, smallest first."""
    return [d.model for d in judge_drafts(target, candidates, refusals) if d.compatible]
