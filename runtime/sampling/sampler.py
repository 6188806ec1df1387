"""One `Sampler` per sequence: penalties from its accepted history, the distribution
transform of `runtime.sampling.kernels` (through `runtime.sampling.native`: the C kernel where it is built, the
numpy reference where not), and a seeded numpy Generator for the draw.

    >>> s = Sampler(SamplingParams(temperature=0.0), seed=None)
    >>> s.sample(np.array([0.1, 2.0, 0.3], np.float32), history=[])
    1

Greedy without penalties is `argmax` on the logits view itself: no copy, no softmax.

Speed: a 49k-token vocabulary makes a full transform cost milliseconds (the top-k and top-p
sorts), a real share of a 14 ms decode step. When top-k or min-p is on, the only tokens that
can survive are known cheaply beforehand (the k largest, ties included; or those within
log(min_p) of the maximum), so the transform runs on those candidates alone — in id order,
which keeps every tie-break and the inverse-CDF draw of `kernels.sample` identical to a
full-row run (tests/engine/test_sampling.py checks this). With top-k and min-p both off the
full row is transformed: about 1.6 ms per token with the native kernel, 10.7 ms in numpy
(49k vocabulary, this machine); default settings cost about 0.12 ms.

`distribution(logits, history)` returns the full final distribution p: the speculative
verifier compares it with the draft's q (DESIGN.md, "Speculative decoding").

Broken logits (NaN, +inf: a model with a RoPE base of 0, bad norms) are `InvalidLogits`,
found for free: the row's maximum (or argmax's pick, when greedy) is NaN exactly when any
element is — numpy's max and argmax propagate NaN — so the check reads one number the
sampling needs anyway, where `isnan(row).any()` made a second pass and a temporary per token.

Constrained decoding: a sampler made with a `Constraint` (runtime.sampling.constraint) sets
every token the grammar does not allow to -inf after the penalties and before top-k, top-p,
min-p and temperature, so `distribution` is the masked p (what the speculative verifier
compares) and greedy is the argmax of the masked row. The constraint's state is the
caller's to move (`advance`, `rollback`); without one the cost is a None check.

Logprobs (`logprobs`) come from the same final distribution the token was drawn from:

- temperature > 0: log p after penalties, the mask, top-k, top-p, min-p and temperature;
  tokens those filters removed have probability 0 and are never listed;
- temperature 0 (greedy; the final distribution is a point mass, log p = 0 or -inf, which
  says nothing): the log-softmax at temperature 1 of the penalised, masked logits.

    >>> s = Sampler(SamplingParams(temperature=0.0), seed=None)
    >>> lp, top = s.logprobs(np.log(np.array([0.2, 0.5, 0.3], np.float32)), [], 1, 2)
    >>> round(lp, 4), [(t, round(v, 4)) for t, v in top]
    (-0.6931, [(1, -0.6931), (2, -1.204)])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from runtime.errors import ConstraintError, InvalidLogits
from runtime.events import SamplingParams
from runtime.sampling import kernels, native
from runtime.sampling.constraint import Constraint

# Logits this far below the maximum rarely matter, so top-k looks there first (and falls
# back to the whole row when fewer than k tokens are that close). Exact either way.
_NEAR = 12.0
INVALID_LOGITS = "the model produced invalid numbers (NaN)"
NOTHING_ALLOWED = "no token the grammar allows here can be sampled"


def _check_top(value: float, constrained: bool = False) -> None:
    """`value` is the row's maximum: NaN there means NaN somewhere; +inf cannot be sampled;
    under a mask, -inf means every token the grammar allows is at -inf."""
    if math.isnan(value) or value == math.inf:
        raise InvalidLogits(INVALID_LOGITS)
    if constrained and value == -math.inf:
        raise ConstraintError(NOTHING_ALLOWED)


class Sampler:
    """Samples one sequence's tokens. `seed` None draws fresh entropy from the OS;
    `constraint` (None: free text) masks every row at its current state."""

    def __init__(self, params: SamplingParams, seed: int | None,
                 constraint: Constraint | None = None) -> None:
        self.params = params
        self.constraint = constraint
        self.rng = np.random.default_rng(seed)
        self.penalised = (params.repeat_penalty != 1.0 or params.frequency_penalty != 0.0
                          or params.presence_penalty != 0.0) and params.penalty_last_n > 0

    def uniform(self) -> float:
        """One draw in [0, 1) from this sequence's generator (the verifier uses it too)."""
        return float(self.rng.random())

    def penalise(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        if not self.penalised:
            return logits
        p = self.params
        return kernels.apply_penalties(
            logits, history, repeat_penalty=p.repeat_penalty,
            frequency_penalty=p.frequency_penalty, presence_penalty=p.presence_penalty,
            last_n=p.penalty_last_n)

    def prepared(self, logits: np.ndarray,
                 history: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None, bool]:
        """(row, ids, masked): what the transforms start from. Unconstrained, the penalised
        row, None and False. Under a mask that allows few tokens, the penalised logits of
        just those and their ids, ascending — the same distribution as the full row with
        the others at -inf (ties still break by id), and far less to sort (numpy's partition
        crawls over a row that is mostly -inf ties: 7 ms for 49k). Under a mask that allows
        most (inside a JSON string), a copy of the full row with the refused tokens at -inf
        and None: gathering 48k of 49k logits cost more than the copy. `masked` says a mask
        was applied (a row whose every allowed token is at -inf is then a ConstraintError)."""
        x = self.penalise(logits, history)
        constraint = self.constraint
        if constraint is None:
            return x, None, False
        mask = constraint.mask()
        if mask is None:
            return x, None, False
        ids = mask.ids
        if ids is not None:
            if ids.size and ids[-1] >= x.size:  # a draft model's vocabulary may be smaller
                ids = ids[:int(np.searchsorted(ids, x.size))]
            return x[ids], ids, True
        banned = mask.banned
        assert banned is not None
        if banned.size and banned[-1] >= x.size:
            banned = banned[:int(np.searchsorted(banned, x.size))]
        x = x.copy() if x is logits else x
        x[banned] = -math.inf
        if x.size > mask.n_vocab:  # a row wider than the grammar's vocabulary
            x[mask.n_vocab:] = -math.inf
        return x, None, True

    def _candidates(self, x: np.ndarray, top: float) -> np.ndarray | None:
        """Ids (ascending) that can survive top-k / min-p, or None for the whole row. `top`
        is the row's maximum."""
        p = self.params
        n = x.size
        if 0 < p.top_k < n:
            # The k-th largest value: every token at or above it (ties included) may be kept.
            # Partitioning only the logits near the maximum is ~4x cheaper than all 49k.
            near = np.flatnonzero(x >= top - _NEAR)
            pool = x[near] if near.size >= p.top_k else x
            bound = float(np.partition(pool, pool.size - p.top_k)[pool.size - p.top_k])
            return np.flatnonzero(x >= bound)
        if p.min_p > 0.0 and p.top_p >= 1.0:
            # probs >= min_p * max  <=>  logit >= max + log(min_p) (same softmax, T=1). Only
            # without top-p: top-p normalises over everything top-k kept, filtered or not.
            bound = top + math.log(p.min_p) - 1e-6
            return np.flatnonzero(x >= bound)
        return None

    def _reduced(self, logits: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray | None, np.ndarray]:
        """(candidate ids or None, their final probabilities)."""
        p = self.params
        x, allowed, masked = self.prepared(logits, history)
        top = float(x.max()) if x.size else -math.inf
        _check_top(top, masked)
        picked = self._candidates(x, top) if not p.greedy else None
        row = x[picked] if picked is not None else x
        ids = picked if allowed is None else allowed if picked is None else allowed[picked]
        # top_k at or over the row's size keeps everything: 0 (off) for the kernel, whose
        # argument is a C int (a top_k of 2**64 used to overflow it).
        top_k = p.top_k if p.top_k < row.size else 0
        probs = native.transform(row, temperature=p.temperature, top_k=top_k,
                                 top_p=p.top_p, min_p=p.min_p)
        return ids, probs

    def distribution(self, logits_row: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The final sampling distribution over the whole vocabulary (float64, sums to 1)."""
        ids, probs = self._reduced(logits_row, history)
        if ids is None:
            return probs
        full = np.zeros(logits_row.size)
        full[ids] = probs
        return full

    def sample(self, logits_row: np.ndarray, history: Sequence[int]) -> int:
        """The next token: argmax when greedy, else an inverse-CDF draw from p."""
        if self.params.greedy:
            x, allowed, masked = self.prepared(logits_row, history)
            if masked and not x.size:
                _check_top(-math.inf, True)
            best = int(np.argmax(x))
            _check_top(float(x[best]), masked)
            return best if allowed is None else int(allowed[best])
        ids, probs = self._reduced(logits_row, history)
        k = native.sample(probs, self.uniform())
        return int(ids[k]) if ids is not None else k

    def logprobs(self, logits_row: np.ndarray, history: Sequence[int], token: int,
                 top_n: int) -> tuple[float, list[tuple[int, float]]]:
        """(log p of `token`, the `top_n` most likely (id, log p), best first, ties by id)
        under the definition in the module docstring; same state as the `sample` call."""
        if self.params.greedy:
            row, ids, masked = self.prepared(logits_row, history)
            x = row.astype(np.float64)
            top = float(x.max()) if x.size else -math.inf
            _check_top(top, masked)
            logp = x - (top + math.log(float(np.exp(x - top).sum())))
        else:
            ids, probs = self._reduced(logits_row, history)
            with np.errstate(divide="ignore"):
                logp = np.log(probs)
        if ids is None:
            chosen = float(logp[token])
        else:  # the candidates' (or allowed tokens') distribution: ids ascending
            at = int(np.searchsorted(ids, token))
            chosen = float(logp[at]) if at < ids.size and ids[at] == token else -math.inf
        if top_n <= 0:
            return chosen, []
        where = np.flatnonzero(np.isfinite(logp))
        values = logp[where]
        if where.size > top_n:
            keep = np.argpartition(-values, top_n - 1)[:top_n]
            where, values = where[keep], values[keep]
        order = np.lexsort((where, -values))
        best = where[order] if ids is None else ids[where[order]]
        return chosen, [(int(t), float(v)) for t, v in zip(best, values[order], strict=True)]
