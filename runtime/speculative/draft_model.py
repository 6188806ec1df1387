"""Drafting with a second, smaller GGUF that shares the target's vocabulary.

`DraftContext` owns the draft model and its own llama context (on the engine thread, like
every llama.cpp object): one sequence slot per target slot (n_seq_max = n_parallel), over
one unified KV cache as large as the target's. `DraftModel` is the per-sequence drafter.
It keeps the draft's cache in step with the sequence's *accepted* tokens: each round it
decodes only what the draft has not seen and removes rejected drafts with seq_rm:

    round 1   sequence  … a b t          draft cache  … a b          → decode [t], draft x1 x2 x3
              (the draft evaluated t, x1, x2; x3 was sampled but never evaluated)
    verify    x1 accepted, y replaces x2 → sequence … a b t x1 y
    round 2   common prefix … a b t x1: seq_rm(x2), decode [y], draft again
    all k accepted + bonus z:  decode [x3, z] (x3 was never evaluated)

At temperature > 0 each draft token is *sampled* from q_i, the final sampling distribution
under the request's own settings (temperature, top-k, top-p, min-p; penalties from the
accepted history plus the drafts before it), and q_i is returned for the verifier's
min(1, p/q). At temperature 0 — and for llama.cpp's greedy-match verifier — the draft takes
the argmax. Drafting stops early when the draft's own top probability falls below p_min.

Under a constraint (structured output) the draft drafts under the sequence's own grammar
state: q_i is masked like the target's p_i, each draft token advances the constraint
tentatively, and every advance is rolled back before the proposal goes to the verifier.
Drafting stops once the grammar is complete (only the end of the text can follow).

    ctx = DraftContext.load(Path("SmolLM2-135M.Q4_0.gguf"), settings)
    drafter = DraftModel(ctx, seq.sampling, rng, Pacer(settings.draft))
    proposal = drafter.propose(seq.tokens, k=4)     # DraftProposal(tokens, q_rows)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from runtime.events import SamplingParams
from runtime.llama.binding import Batch, LlamaContext, LlamaModel, supports_gpu_offload
from runtime.llama.params import to_llama_params
from runtime.llama.stepper import Stepper
from runtime.sampling import native
from runtime.sampling.constraint import Constraint
from runtime.sampling.sampler import Sampler
from runtime.sampling.step_config import StepConfig, step_config, step_error
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.api import DraftProposal
from runtime.speculative.pacing import PacedDrafter, Pacer

logger = logging.getLogger("outrider.speculative")

_NO_DRAFT = DraftProposal(())
_NO_KV_SLOT = 1
_NATIVE_FEED = 2  # catch-up tokens decoded in the round's own native call (more: a prefill)

def _common_prefix(a: Sequence[int], b: Sequence[int], start: int) -> int:
    """Length of the common prefix of a and b, knowing the first `start` items agree."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftContext:
    """The draft model and its context, shared by the sequences of one loaded target.

    Each slot remembers the tokens its cells hold, so a new sequence takes the free slot
    with the longest common prefix (a chat's next turn, the same prompt again) and decodes
    only the rest."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext) -> None:
        self.model = model
        self.ctx = ctx
        self.batch = Batch(ctx.n_batch)
        self._seen: list[list[int]] = [[] for _ in range(ctx.n_seq_max)]
        self._busy = [False] * ctx.n_seq_max
        # A round of k draft steps in one C call (runtime.llama.stepper); None: in Python.
        self.stepper = Stepper.for_context(ctx)

    @classmethod
    def load(cls, path: Path, settings: LoadSettings) -> DraftContext:
        """Load `path` as a draft for a target loaded with `settings`: the same context
        length, slots, threads and cache types; on a GPU build every layer offloaded (a
        draft is small) unless the user keeps the target on the CPU (gpu_layers 0)."""
        on_gpu = supports_gpu_offload() and settings.gpu_layers != 0
        draft_settings = dataclasses.replace(settings, model_path=path, gpu_layers=None,
                                             draft=DraftSettings())
        params = to_llama_params(draft_settings, 999 if on_gpu else 0)
        model = LlamaModel.load(path, params)
        try:
            ctx = LlamaContext(model, params)
        except BaseException:
            model.close()
            raise
        return cls(model, ctx)

    @property
    def name(self) -> str:
        return self.model.path.stem

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    # ---- slots ------------------------------------------------------------------------

    def acquire(self, tokens: Sequence[int]) -> int | None:
        """A free slot for a sequence starting with `tokens` (the best cached prefix)."""
        best, best_len = None, -1
        for slot, busy in enumerate(self._busy):
            if busy:
                continue
            n = _common_prefix(self._seen[slot], tokens, 0)
            if n > best_len:
                best, best_len = slot, n
        if best is not None:
            self._busy[best] = True
        return best

    def release(self, slot: int) -> None:
        """The slot is free again; its cells stay as a prefix cache until space is needed."""
        self._busy[slot] = False

    def _evict_idle(self) -> bool:
        freed = False
        for slot, busy in enumerate(self._busy):
            if not busy and self._seen[slot]:
                self.ctx.seq_rm(slot, 0, -1)
                self._seen[slot] = []
                freed = True
        return freed

    # ---- decoding ---------------------------------------------------------------------

    def sync(self, slot: int, tokens: Sequence[int], known: int = 0) -> tuple[np.ndarray, int] | None:
        """Make the slot hold exactly `tokens` and return the logits after the last one,
        and how many tokens had to be decoded. `known`: the first `known` tokens are known
        to match what the slot holds. None when llama.cpp could not decode."""
        todo = self.pending(slot, tokens, known)
        row = self._decode(slot, todo, len(tokens) - len(todo))
        return None if row is None else (row, len(todo))

    def pending(self, slot: int, tokens: Sequence[int], known: int = 0) -> list[int]:
        """What the slot must still decode to hold exactly `tokens` (at least the last one,
        for its logits), after dropping the cells where it differs."""
        seen = self._seen[slot]
        m = min(_common_prefix(seen, tokens, known), len(tokens) - 1)
        if m < len(seen):
            self.ctx.seq_rm(slot, m, -1)
            del seen[m:]
        return list(tokens[m:])

    def draft(self, slot: int, feed: Sequence[int], k: int, cfg: StepConfig, greedy: bool,
              p_min: float, stop_on_eog: bool, q_out: np.ndarray | None) -> list[int] | None:
        """`sync` for a short `feed` (what `pending` returned) and DraftModel._draft's loop,
        in one native call (`self.stepper`, not None): up to k draft tokens after the
        slot's tokens and `feed`, each but the last evaluated into the slot; above
        temperature 0 their distributions go to q_out. None when `feed` could not be
        decoded (as `sync`)."""
        assert self.stepper is not None
        seen = self._seen[slot]
        feed = tuple(feed)
        for attempt in range(2):
            tokens, n_eval, rc, err = self.stepper.draft(slot, len(seen), k, cfg, greedy, p_min,
                                                         stop_on_eog, q_out, feed)
            seen.extend((*feed, *tokens)[:n_eval])
            if err:
                raise step_error(err)
            if rc == _NO_KV_SLOT:
                freed = self._evict_idle()  # room for this round, or for the next one
                if n_eval < len(feed) and attempt == 0 and freed:
                    continue  # as _decode_batch: once more after making room
            if rc:
                logger.debug("the draft context could not decode (code %d)", rc)
            return None if n_eval < len(feed) else list(tokens)
        return None

    def step(self, slot: int, token: int) -> np.ndarray | None:
        """Evaluate one drafted token; the logits after it. Runs once per drafted token, so
        it fills the batch with one scalar entry instead of `_decode`'s chunked runs."""
        seen = self._seen[slot]
        self.batch.clear()
        self.batch.add(token, len(seen), slot, True)
        if not self._decode_batch():
            return None
        seen.append(token)
        return self.ctx.logits(1)[0]

    def _decode(self, slot: int, tokens: list[int], pos0: int) -> np.ndarray | None:
        batch, seen = self.batch, self._seen[slot]
        cap = batch.capacity
        for start in range(0, len(tokens), cap):
            chunk = tokens[start:start + cap]
            batch.clear()
            batch.add_tokens(chunk, pos0 + start, slot, start + cap >= len(tokens))
            if not self._decode_batch():
                return None
            seen.extend(chunk)
        return self.ctx.logits(1)[0]

    def _decode_batch(self) -> bool:
        """Decode the filled batch; when the cache has no room, drop the idle slots' caches
        and try once more (llama_decode leaves the batch as it was)."""
        for attempt in range(2):
            rc = self.ctx.decode(self.batch)
            if rc == 0:
                return True
            if not (rc == _NO_KV_SLOT and attempt == 0 and self._evict_idle()):
                logger.debug("the draft context could not decode (code %d)", rc)
                return False
        return False


class DraftModel(PacedDrafter):
    """The per-sequence drafter over a shared `DraftContext` (see the module doc).

    `rng` draws the draft's own samples (a child of the sequence's seeded generator, so a
    seeded reply is reproducible); `greedy` drafts the argmax even at temperature > 0 (for
    llama.cpp's greedy-match verifier); `constraint` is the sequence's own (None: free)."""

    def __init__(self, context: DraftContext, params: SamplingParams, rng: np.random.Generator,
                 pacer: Pacer, *, greedy: bool = False,
                 constraint: Constraint | None = None) -> None:
        self.context = context
        self.params = params
        self.constraint = constraint
        self.sampler = Sampler(params, None, constraint)
        self.sampler.rng = rng
        super().__init__(pacer)
        self.greedy = greedy or params.greedy
        self._q: np.ndarray | None = None  # the native round's q rows (k_max, n_vocab)
        # How the native step samples the draft (None: in Python: a constraint, penalties,
        # or no native step).
        self._cfg = (step_config(self.sampler, "leviathan")
                     if context.stepper is not None else None)
        self._slot: int | None = None
        self._known = 0  # tokens of the sequence the draft's cache is known to hold

    def propose(self, seq_tokens: Sequence[int], k: int) -> DraftProposal:
        proposal = self._propose(seq_tokens, k)
        self._publish()
        return proposal

    def _propose(self, seq_tokens: Sequence[int], k: int) -> DraftProposal:
        k = self.pacer.start(k)
        if k <= 0:
            self.pacer.proposed(0)
            return _NO_DRAFT
        ctx = self.context
        if self._slot is None:
            self._slot = ctx.acquire(seq_tokens)
            self._known = 0
        if self._slot is None:
            self.pacer.proposed(0)
            return _NO_DRAFT
        t0 = self.pacer.clock()
        if self._cfg is not None:
            todo = ctx.pending(self._slot, seq_tokens, self._known)
            if len(todo) <= _NATIVE_FEED:  # a round's catch-up: decoded in the same call
                drafted = self._draft_native(self._cfg, k, todo)
                if drafted is None:
                    self.pacer.proposed(0)
                    return _NO_DRAFT
                self._known = len(seq_tokens)
                tokens, q = drafted
                self.pacer.proposed(len(tokens))
                return DraftProposal(tuple(tokens), q) if tokens else _NO_DRAFT
        synced = ctx.sync(self._slot, seq_tokens, self._known)
        if synced is None:
            self.pacer.proposed(0)
            return _NO_DRAFT
        logits, n_decoded = synced
        # A round's own catch-up is one or two tokens; more is a prompt (or a stretch of
        # plain steps) being prefilled once, not the price of drafting.
        one_off = self.pacer.clock() - t0 if n_decoded > 2 else 0.0
        self._known = len(seq_tokens)
        tokens, q_rows = self._draft(seq_tokens, logits, k)
        self.pacer.proposed(len(tokens), one_off)
        if not tokens:
            return _NO_DRAFT
        return DraftProposal(tuple(tokens), q_rows)

    def _draft(self, seq_tokens: Sequence[int], logits: np.ndarray,
               k: int) -> tuple[list[int], np.ndarray | None]:
        """Up to k draft tokens from `logits` (after the sequence's last token) and, above
        temperature 0, the distributions they were drawn from."""
        if self._cfg is not None:  # a long catch-up was decoded first (`sync`)
            drafted = self._draft_native(self._cfg, k, ())
            return drafted if drafted is not None else ([], None)
        params, sampler = self.params, self.sampler
        history = list(seq_tokens[-params.penalty_last_n:]) if sampler.penalised else []
        tokens: list[int] = []
        q_rows: list[np.ndarray] = []
        model = self.context.model
        check = self.pacer.controller.p_min > 0.0
        constraint = self.constraint
        assert self._slot is not None
        try:
            for i in range(k):
                if params.greedy:
                    x = sampler.sample(logits, history)
                    top = (_top_probability(sampler.prepared(logits, history)[0])
                           if check else 1.0)
                    q = None
                else:
                    q = sampler.distribution(logits, history)
                    x = int(np.argmax(q)) if self.greedy else native.sample(q, sampler.uniform())
                    top = float(q.max())
                if not self.pacer.keep_drafting(top):
                    break
                if constraint is not None and not constraint.try_advance(x):
                    break  # a lazy trigger followed by text the grammar refuses
                tokens.append(x)
                if q is not None:
                    q_rows.append(q)
                if (i == k - 1 or (model.is_eog(x) and not params.ignore_eos)
                        or (constraint is not None and constraint.done)):
                    break
                if sampler.penalised:
                    history.append(x)
                row = self.context.step(self._slot, x)
                if row is None:
                    break
                logits = row
        finally:
            if constraint is not None and tokens:
                constraint.rollback(len(tokens))
        return tokens, np.stack(q_rows) if q_rows else None

    def _draft_native(self, cfg: StepConfig, k: int,
                      feed: Sequence[int]) -> tuple[list[int], np.ndarray | None] | None:
        """`_draft` for a sampler the native step takes, after decoding `feed`: the same
        tokens, draws and stops (the draft's generator is read through its BitGenerator, as
        `Sampler.uniform` reads it). None when `feed` could not be decoded."""
        assert self._slot is not None
        q_out = None
        n_vocab = self.context.ctx.n_vocab
        if cfg[0] != 0:  # above temperature 0: the draft's distributions, for the verifier
            if self._q is None or self._q.shape[0] < k:
                self._q = np.empty((max(k, self.pacer.controller.k_max), n_vocab))
            q_out = self._q
        tokens = self.context.draft(self._slot, feed, k, cfg, self.greedy,
                                    self.pacer.controller.p_min, not self.params.ignore_eos, q_out)
        if tokens is None:
            return None
        return tokens, q_out[:len(tokens)] if q_out is not None and tokens else None

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        self.pacer.observe(drafted, accepted)
        self._publish()

    def close(self) -> None:
        if self._slot is not None:
            self.context.release(self._slot)
            self._slot = None
        self._known = 0
        self.pacer.reset()


def _top_probability(logits: np.ndarray) -> float:
    """The largest probability of softmax(logits) at temperature 1 (the draft's confidence
    when it drafts greedily): 1 / Σ exp(l − max).

    It runs once per drafted token (T = 0, p_min > 0), so the exp stays in the logits'
    float32 over the whole row, summed in float64: about 55 µs for 49k logits here, within
    ~1e-7 of the float64 value. (Skipping logits far below the maximum saved nothing: real
    rows have 30-45k of 49k within 20 of it, and the mask and gather cost 4× the exp.)

        >>> round(_top_probability(np.log(np.array([0.5, 0.3, 0.2], np.float32))), 6)
        0.5
    """
    m = logits.max()
    if not np.isfinite(m):
        return 0.0
    return 1.0 / float(np.exp(logits - m).sum(dtype=np.float64))
