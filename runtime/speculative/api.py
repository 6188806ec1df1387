"""The seam between the scheduler and speculative decoding (drafters, verifier).

The scheduler implements the mechanics of a speculative round; the speculative package
(another module) supplies the policy. One round for a decoding sequence whose last token
`t` sits at position n (not yet evaluated):

1. `drafter.propose(seq.tokens, k)` → `DraftProposal(tokens=(x1..xk), q_rows)`; the
   scheduler chooses k as min(draft k_max, tokens left to max_tokens − 1, room in the
   context and in the step's batch). An empty proposal means "plain decode this step".
2. The batch gets t, x1..xk at positions n..n+k, all with logits: k+1 rows p1..pk+1.
3. `verifier.verify(proposal, rows, seq.sampler, seq.tokens)` → `DraftVerdict(tokens, n_accepted,
   rollback)`: the accepted drafts then one token the target sampled (correction or bonus),
   and how many draft positions to drop.
4. The scheduler removes the rejected cells with `llama_memory_seq_rm(seq, n+1+n_accepted, -1)`,
   appends `verdict.tokens` one by one (stop strings, EOS and max_tokens apply to each, so a
   reply can end inside an accepted run), emits `TokenEvent(from_draft=True)` for accepted
   drafts and a `StepStats`, then calls `drafter.observe(drafted, accepted, seconds)`.

A `Drafter` is per sequence (`Sequence.drafter`), so its state — a draft model's own cache
position, an n-gram index — follows that sequence. `SpeculationPolicy.attach` is called once per
model load on the engine thread and returns the per-sequence factory and the verifier.

    class NoDraft:                                  # the smallest valid drafter
        cost_ratio = 0.0
        measured_speedup = 0.0
        off_reason = "no drafter"
        def propose(self, seq_tokens, k): return DraftProposal(())
        def observe(self, drafted, accepted, seconds): pass
        def close(self): pass

Worked example (greedy, k = 3): the target evaluates [t, x1, x2, x3]; its argmaxes are
[x1, x2, y, …], so x1 and x2 are accepted, x3 is rejected and y replaces it:
`DraftVerdict(tokens=(x1, x2, y), n_accepted=2, rollback=1)`; the cell of x3 (position n+3)
is removed and y becomes the next token to evaluate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from runtime.settings.load import LoadSettings

if TYPE_CHECKING:
    from runtime.sampling.sampler import Sampler


@dataclass(frozen=True)
class DraftProposal:
    """Draft tokens x1..xk and, for a sampling draft model, the distributions q1..qk they
    were drawn from (shape (k, n_vocab)). None means deterministic drafts (point masses)."""

    tokens: tuple[int, ...]
    q_rows: np.ndarray | None = None


@dataclass(frozen=True)
class DraftVerdict:
    """What the target keeps of one round: `tokens` = accepted drafts + one sampled by the
    target (so len(tokens) == n_accepted + 1); `rollback` = draft positions to remove
    (k − n_accepted)."""

    tokens: tuple[int, ...]
    n_accepted: int
    rollback: int


class Drafter(Protocol):
    """Proposes draft tokens for one sequence."""

    cost_ratio: float  # draft time per token / target step time (c); 0.0 while unknown
    measured_speedup: float  # tokens/s with drafting ÷ without; 0.0 while unknown
    off_reason: str | None  # why proposals are empty right now (None while drafting)

    def propose(self, seq_tokens: Sequence[int], k: int) -> DraftProposal:
        """Up to k draft tokens continuing `seq_tokens` (the whole accepted sequence, the
        last token not yet evaluated by the target). May return fewer, or none."""
        ...

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        """Feedback after each verified round (for adaptive k and switching off)."""
        ...

    def close(self) -> None:
        """The sequence is done (finished, cancelled or preempted): free its state."""
        ...


class Verifier(Protocol):
    def verify(self, proposal: DraftProposal, rows: np.ndarray, sampler: Sampler,
               history: Sequence[int]) -> DraftVerdict:
        """`rows` are the target's k+1 raw logit rows; `sampler.distribution(row, history)`
        gives p_i (history = the accepted tokens before that row's position) and
        `sampler.uniform()` the draws, so a seeded run is reproducible."""
        ...


@dataclass
class SpecSetup:
    """What speculation provides for one loaded model."""

    drafter_for: Callable[[Any], Drafter | None]  # called with the new runtime.engine.sequence.Sequence
    verifier: Verifier
    k_max: int
    draft_name: str | None = None  # shown as LoadedModel.draft
    refused: str | None = None  # why a requested draft model was refused
    notes: tuple[str, ...] = ()
    close: Callable[[], None] = field(default=lambda: None)
    stepper: Any = None  # the draft model's native step (runtime.llama.stepper), if any


class SpeculationPolicy(Protocol):
    def attach(self, model: Any, settings: LoadSettings) -> SpecSetup | None:
        """Called on the engine thread after the target loaded (`model` is a
        runtime.llama.binding.LlamaModel); None when settings.draft.kind is "none"."""
        ...
