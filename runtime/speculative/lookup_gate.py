"""Where prompt lookup drafts under a grammar: through structure always, through free text
only while such drafts are being accepted.

A grammar splits a reply into what it decides and what it leaves to the model. A JSON
schema's keys, quotes, colons and brackets are structure (a mask of 1 to ~120 tokens of
49k); a string's content is free text (a mask allowing nearly all of them — `TokenMask`
keeps it as `banned`). Prompt lookup predicts structure well, since records repeat their
keys. Free text it predicts only where the reply copies (an extraction task quoting its
document), and not where it invents: along the 8-record list of
benchmarks/constrained_speed.py, of the draft tokens lookup proposed (up to 8 a position)
9 of 227 inside strings were what plain decoding wrote, against 747 of 1,203 elsewhere —
and on a CPU each draft costs about half a decode step (SmolLM2-135M Q4_1 on 2 cores: a
batch of 2 tokens 1.75 steps, of 5 tokens 3.05), so those drafts cost more than they save.
Priced at those costs, that reply's rounds at k = 4 come to 1.19× plain decoding without
the gate and 1.24× with it; 1.35× is the ceiling (each round drafting exactly what will be
accepted, known in hindsight).

`grammar_prefix` walks a proposal through the grammar: it stops before the first token the
mask refuses and, when `free` is False, before the first position inside free text. The
`FreeTextGate` of each sequence decides `free`: it keeps the acceptance rate of the free-text
drafts it judged (an exponential average, prior 0.5) and opens while that rate is at least
`THRESHOLD` — a draft token must be accepted about half the time to pay for its slot in the
batch. Closed, it still opens for one round in `PROBE_EVERY`, so a reply that starts
copying is noticed.

    >>> gate = FreeTextGate()
    >>> gate.open()
    True
    >>> for _ in range(4):
    ...     gate.judge(drafted_free=[0, 1, 2], accepted=0)   # the first free draft refused
    >>> gate.open(), round(gate.alpha, 2)
    (False, 0.3)
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.sampling.constraint import Constraint

__all__ = ["PROBE_EVERY", "THRESHOLD", "FreeTextGate", "grammar_prefix"]

THRESHOLD = 0.5  # free-text drafts must be accepted this often to be drafted
PRIOR = 0.5
MEMORY = 0.88  # weight of the past in the average: ~8 judged drafts
PROBE_EVERY = 16  # closed, the gate still opens one round in this many


class FreeTextGate:
    """One sequence's judgement of its free-text drafts (see the module docstring)."""

    def __init__(self) -> None:
        self.alpha = PRIOR
        self._closed_rounds = 0

    def open(self) -> bool:
        """Whether this round may draft into free text (call once per round)."""
        if self.alpha >= THRESHOLD:
            self._closed_rounds = 0
            return True
        self._closed_rounds += 1
        if self._closed_rounds >= PROBE_EVERY:
            self._closed_rounds = 0
            return True
        return False

    def judge(self, drafted_free: Sequence[int], accepted: int) -> None:
        """A round's verdict: `drafted_free` are the indices of its drafts that were free
        text, `accepted` how many drafts were accepted. Drafts after the first refused one
        were never judged."""
        for j in drafted_free:
            if j > accepted:
                break
            self.alpha = MEMORY * self.alpha + (1.0 - MEMORY) * (1.0 if j < accepted else 0.0)


def grammar_prefix(constraint: Constraint, tokens: Sequence[int],
                   free: bool = True) -> tuple[list[int], list[int]]:
    """(the longest prefix of `tokens` the grammar allows from its current state — cut
    before free text unless `free` —, the indices in it that are free text). The state is
    left as it was; the masks met on the way stay cached for the verifier."""
    moved = 0
    free_at: list[int] = []
    try:
        for j, token in enumerate(tokens):
            mask = constraint.mask()
            if mask is not None:
                if not mask.allows(token):
                    break
                if mask.banned is not None:  # most tokens allowed: the model's own choice
                    if not free:
                        break
                    free_at.append(j)
            if not constraint.try_advance(token):
                break
            moved += 1
    finally:
        constraint.rollback(moved)
    return list(tokens[:moved]), free_at
