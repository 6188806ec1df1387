"""Speculative decoding for the engine: drafters per the load settings, and the verifier.

`Speculation.attach` runs once per model load on the engine thread and returns a
`SpecSetup` (runtime.speculative.api): a factory of per-sequence drafters and the verifier.

    engine = Engine(speculation=Speculation())
    engine.load(LoadSettings(model_path=target,
                             draft=DraftSettings(kind="model", model_path=draft)))

- kind "ngram": `NgramDrafter` (prompt lookup; deterministic, so q is a point mass);
- kind "model": `DraftModel` over a `DraftContext`, after the compatibility check — an
  incompatible draft is refused with its reasons and the target runs without it
  (`LoadedModel.draft_refused`, and a note);
- k: fixed when `draft.k` is set, else adaptive up to `draft.k_max` (auto-off included).

`SamplingVerifier` turns the target's k + 1 raw logit rows into final distributions with the
sequence's own `Sampler` (penalties from the accepted history: row i sees the accepted
tokens and the drafts x1..xi before its position), draws the uniforms from the sequence's
seeded generator and calls `runtime.sampling.native.verify`: "greedy" at temperature 0, "leviathan"
(min(1, p/q), residual resampling) above it — q = None for prompt lookup's point masses —
or llama.cpp's "greedy_match" when `draft.verifier` asks for it (the benchmark's baseline).

Under a constraint (structured output; `sampler.constraint`) row i's p is masked with the
grammar's state after x1..xi: the verifier advances the constraint through the drafts
tentatively and rolls it back afterwards (the scheduler then advances it over what was
accepted). A draft the grammar forbids has p = 0 and is rejected, so the rows past it are
never read. Drafters draft under the same constraint: the draft model samples from the
masked q, and prompt lookup's proposal is cut at the first token the grammar forbids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from runtime.gguf.preflight import check_gguf
from runtime.llama.vocab import tokenizer_facts
from runtime.sampling import native
from runtime.sampling.constraint import Constraint
from runtime.sampling.sampler import Sampler
from runtime.sampling.verify import VerifyMode
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.api import DraftProposal, DraftVerdict, SpecSetup
from runtime.speculative.compat import check_draft_compat
from runtime.speculative.draft_model import DraftContext, DraftModel
from runtime.speculative.lookup_gate import FreeTextGate, grammar_prefix
from runtime.speculative.pacing import CostMemory, PacedDrafter, Pacer
from runtime.speculative.prompt_lookup import PromptLookup

_NO_DRAFT = DraftProposal(())


class SamplingVerifier:
    """The verify step on the target's raw rows (implements speculative_api.Verifier).

        >>> from runtime.events import SamplingParams
        >>> v = SamplingVerifier()
        >>> rows = np.log(np.array([[0.1, 0.9], [0.5, 0.5]], np.float32))
        >>> v.verify(DraftProposal((1,)), rows, Sampler(SamplingParams(temperature=0), 0), [0])
        DraftVerdict(tokens=(1, 0), n_accepted=1, rollback=0)
    """

    def __init__(self, rule: Literal["leviathan", "greedy_match"] = "leviathan") -> None:
        self.rule = rule

    def mode(self, sampler: Sampler) -> VerifyMode:
        if sampler.params.greedy:
            return "greedy"
        return self.rule

    def verify(self, proposal: DraftProposal, rows: np.ndarray, sampler: Sampler,
               history: Sequence[int]) -> DraftVerdict:
        drafts = proposal.tokens
        k = len(drafts)
        mode = self.mode(sampler)
        if mode == "greedy":
            return _verify_greedy(drafts, rows, sampler, history)
        p = target_distributions(rows, sampler, history, drafts, proposal.q_rows)
        q = None
        if mode == "leviathan" and proposal.q_rows is not None:
            q = _padded(proposal.q_rows, p.shape[1])
        u = np.array([sampler.uniform() for _ in range(k + 1)])
        accepted, tokens = native.verify(drafts, p, q, u, mode)
        return DraftVerdict(tokens=tokens, n_accepted=accepted, rollback=k - accepted)


def _verify_greedy(drafts: Sequence[int], rows: np.ndarray, sampler: Sampler,
                   history: Sequence[int]) -> DraftVerdict:
    """Temperature 0: the verify kernel's "greedy" mode on one-hot rows over just the ids
    that occur (the drafts and the target's argmaxes), so no row as wide as the vocabulary
    is built: [x1 x2] vs argmaxes [x1 y z] → ids [x1 x2 y z], rows one-hot at 0, 2, 3.
    Rows after the first argmax that is not its draft are never read, so they are not
    sampled (under a constraint each sampled row costs a mask)."""
    k = len(drafts)
    params = sampler.params
    past = list(history[-params.penalty_last_n:]) if sampler.penalised else []
    constraint = sampler.constraint
    best: list[int] = []
    moved = 0
    try:
        for i in range(k + 1):
            best.append(sampler.sample(rows[i], [*past, *drafts[:i]] if sampler.penalised
                                       else past))
            if i < k and best[i] != drafts[i]:
                best.extend([best[i]] * (k - i))  # rejected at x(i+1): the rest unread
                break
            if constraint is not None and i < k:
                if not constraint.try_advance(drafts[i]):
                    best.extend([best[i]] * (k - i))  # x(i+1) is rejected: never read
                    break
                moved += 1
    finally:
        if constraint is not None and moved:
            constraint.rollback(moved)
    ids = sorted(set(drafts) | set(best))
    index = {t: j for j, t in enumerate(ids)}
    p = np.zeros((k + 1, len(ids)))
    p[np.arange(k + 1), [index[t] for t in best]] = 1.0
    accepted, tokens = native.verify([index[t] for t in drafts], p, None, None, "greedy")
    return DraftVerdict(tokens=tuple(ids[t] for t in tokens), n_accepted=accepted,
                   rollback=k - accepted)


def target_distributions(rows: np.ndarray, sampler: Sampler, history: Sequence[int],
                         drafts: Sequence[int], q_rows: np.ndarray | None = None) -> np.ndarray:
    """p1..pk+1 (float64, (k+1, width)): row i's final distribution given the accepted
    history and drafts x1..xi. At temperature 0 a one-hot on the (penalised) argmax. The
    width covers the draft's vocabulary and every draft id, so p and q line up; ids the
    target does not have get probability 0."""
    k = len(drafts)
    n = rows.shape[1]
    width = max(n, q_rows.shape[1] if q_rows is not None else 0, max(drafts, default=0) + 1)
    p = np.zeros((k + 1, width))
    params = sampler.params
    past = list(history[-params.penalty_last_n:]) if sampler.penalised else []
    constraint = sampler.constraint
    moved = 0
    try:
        for i in range(k + 1):
            hist = [*past, *drafts[:i]] if sampler.penalised else past
            if params.greedy:
                p[i, sampler.sample(rows[i], hist)] = 1.0
            else:
                p[i, :n] = sampler.distribution(rows[i], hist)
            if constraint is not None and i < k:
                if not constraint.try_advance(drafts[i]):
                    p[i + 1:] = p[i]  # p_i(x(i+1)) = 0: rejected there, later rows unread
                    break
                moved += 1
    finally:
        if constraint is not None and moved:
            constraint.rollback(moved)
    return p


def _padded(q: np.ndarray, width: int) -> np.ndarray:
    if q.shape[1] == width and q.dtype == np.float64 and q.flags.c_contiguous:
        return q
    out = np.zeros((q.shape[0], width))
    out[:, :q.shape[1]] = q
    return out


class NgramDrafter(PacedDrafter):
    """Prompt lookup for one sequence (implements speculative_api.Drafter). Keeps the
    sequence's tokens in a growing int32 buffer, so a lookup costs no list conversion.

    Under a constraint the draft begins with the tokens the grammar forces (`forced`: the
    keys of a schema's objects and the punctuation around them, which the text may not have
    shown yet — the first record of a list), the lookup continues from after them, and the
    proposal stops before the first token the grammar forbids — and before free text (a
    string's content) while the sequence's `FreeTextGate` says such drafts are not being
    accepted (runtime.speculative.lookup_gate).

        {"name": "Ann", ⟨"city": "⟩ ⟨Paris", "age⟩   forced, then looked up
    """

    def __init__(self, lookup: PromptLookup, pacer: Pacer,
                 constraint: Constraint | None = None) -> None:
        self.lookup = lookup
        self.constraint = constraint
        super().__init__(pacer)
        self._buf = np.zeros(256, dtype=np.int32)
        self._n = 0
        self.gate = FreeTextGate()
        self._free_at: list[int] = []  # the last proposal's free-text drafts

    def propose(self, seq_tokens: Sequence[int], k: int) -> DraftProposal:
        k = self.pacer.start(k)
        tokens: list[int] = []
        if k > 0:
            buf = self._tokens(seq_tokens)
            forced = self.constraint.forced()[:k] if self.constraint is not None else []
            if forced:
                buf = np.concatenate([buf, np.asarray(forced, dtype=np.int32)])
            tokens = forced + (self.lookup.propose(buf, k - len(forced))
                               if len(forced) < k else [])
        self._free_at = []
        if self.constraint is not None and tokens:
            tokens, self._free_at = grammar_prefix(self.constraint, tokens, self.gate.open())
        self.pacer.proposed(len(tokens))
        self._publish()
        return DraftProposal(tuple(tokens)) if tokens else _NO_DRAFT

    def _tokens(self, seq_tokens: Sequence[int]) -> np.ndarray:
        n = len(seq_tokens)
        if n < self._n:  # never within one sequence's life; be safe
            self._n = 0
        if n > self._buf.size:
            grown = np.zeros(max(n, 2 * self._buf.size), dtype=np.int32)
            grown[:self._n] = self._buf[:self._n]
            self._buf = grown
        self._buf[self._n:n] = seq_tokens[self._n:n]
        self._n = n
        return self._buf[:n]

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        self.pacer.observe(drafted, accepted)
        if self._free_at:
            self.gate.judge(self._free_at, accepted)
            self._free_at = []
        self._publish()

    def close(self) -> None:
        self.pacer.reset()


def allowed_prefix(constraint: Constraint, tokens: Sequence[int]) -> list[int]:
    """The longest prefix of `tokens` the grammar allows from its current state (which is
    left as it was). The masks met on the way stay cached for the verifier."""
    return grammar_prefix(constraint, tokens)[0]


class Speculation:
    """Implements runtime.speculative.api.SpeculationPolicy. `clock` times the rounds (tests
    pass a fake one)."""

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock

    def attach(self, model: Any, settings: LoadSettings) -> SpecSetup | None:
        draft = settings.draft
        if draft.kind == "none":
            return None
        verifier = SamplingVerifier(draft.verifier)
        memory = CostMemory()
        k_max = draft.k if draft.k is not None else draft.k_max
        k_text = f"k {draft.k}" if draft.k is not None else f"adaptive k up to {draft.k_max}"
        if draft.kind == "ngram":
            lookup = PromptLookup(draft.ngram_min, draft.ngram_max)
            return SpecSetup(
                drafter_for=lambda seq: NgramDrafter(lookup, self._pacer(draft, memory),
                                                     seq.constraint),
                verifier=verifier, k_max=k_max, draft_name="ngram",
                notes=(f"drafting by prompt lookup ({draft.ngram_min}- to "
                       f"{draft.ngram_max}-grams, {k_text}, {draft.verifier} verifier)",))
        if draft.model_path is None:  # DraftSettings refuses this; keeps mypy sure
            return SpecSetup(drafter_for=lambda seq: None, verifier=verifier, k_max=0,
                             refused="a draft model needs its file")
        check_gguf(draft.model_path)
        context = DraftContext.load(draft.model_path, settings)
        try:
            reasons = check_draft_compat(tokenizer_facts(model), tokenizer_facts(context.model))
        except BaseException:
            context.close()
            raise
        if reasons:
            context.close()
            return SpecSetup(
                drafter_for=lambda seq: None, verifier=verifier, k_max=0,
                refused=(f"{draft.model_path.name} cannot draft for "
                         f"{settings.model_path.name}: {'; '.join(reasons)}"))
        greedy = draft.verifier == "greedy_match"

        def drafter_for(seq: Any) -> DraftModel:
            # A child of the sequence's generator: seeded replies stay reproducible, and the
            # draft's draws never shift the target's own stream.
            rng = seq.sampler.rng.spawn(1)[0]
            return DraftModel(context, seq.sampling, rng, self._pacer(draft, memory),
                              greedy=greedy, constraint=seq.constraint)

        return SpecSetup(
            drafter_for=drafter_for, verifier=verifier, k_max=k_max, draft_name=context.name,
            notes=(f"drafting with {context.name} ({context.model.quant()}, {k_text}, "
                   f"p_min {draft.p_min}, {draft.verifier} verifier)",),
            close=context.close, stepper=context.stepper)

    def _pacer(self, draft: DraftSettings, memory: CostMemory) -> Pacer:
        return Pacer(draft, clock=self.clock, memory=memory)
