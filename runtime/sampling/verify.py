"""The speculative verify step, in numpy: the reference the native kernel is tested against.

One round at position n with draft length k. The caller supplies everything random — the
k + 1 uniform draws `u` — so a round is a pure function of its inputs, and the numpy and
native paths (and a replay) make the same decisions.

- `drafts` x1..xk: the drafter's proposals.
- `p`: k + 1 rows, the target's *final* sampling distributions (after penalties, top-k,
  top-p, min-p and temperature: `runtime.sampling.kernels.transform`) at each drafted position and
  one past the last.
- `q`: k rows, the drafter's final distributions, or None for a deterministic drafter
  (prompt lookup), whose q is a point mass on its proposal.

Modes:

- "leviathan" (Leviathan et al. 2023; Chen et al. 2023): accept xi iff ui < min(1, pi(xi) /
  qi(xi)). At the first rejection draw the correction from norm(max(0, pi − qi)) with u[k]
  and stop; if all k are accepted draw the bonus token from p(k+1) with u[k]. Lossless: every
  emitted token is distributed exactly as plain sampling from p. With q = None the rule
  reads: accept with probability pi(xi); the residual is pi without xi.
- "greedy": temperature 0. Accept iff argmax pi == xi; the correction is argmax pi.
- "greedy_match": llama.cpp's rule, kept for comparison. The draft is argmax q; the target
  draws its own yi ~ pi with ui; accept iff yi == xi, else emit yi. Also lossless, but it
  accepts with probability p(argmax q) instead of Σ min(p, q).

    >>> p = np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    >>> q = np.array([[0.25, 0.75, 0.0]])
    >>> verify([1], p, q, [0.5, 0.3])          # 0.5 < 0.5/0.75: x1 = 1 accepted, bonus 2
    VerifyOutcome(accepted=1, tokens=(1, 2))
    >>> verify([1], p, q, [0.9, 0.3])          # rejected: residual max(0, p - q) = [0.25, 0, 0]
    VerifyOutcome(accepted=0, tokens=(0,))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from runtime.sampling.kernels import sample

VerifyMode = Literal["leviathan", "greedy", "greedy_match"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("leviathan", "greedy", "greedy_match")


class VerifyOutcome(NamedTuple):
    """What a round yields: how many drafts were accepted, and the tokens to emit (the
    accepted drafts, then one correction or bonus token: always `accepted + 1` of them)."""

    accepted: int
    tokens: tuple[int, ...]


def verify(
    drafts: Sequence[int] | np.ndarray,
    p: np.ndarray,
    q: np.ndarray | None,
    u: Sequence[float] | np.ndarray | None,
    mode: VerifyMode = "leviathan",
) -> VerifyOutcome:
    """One verify round (see the module docstring). `p` is (k+1, n); `q` is (k, n) of the
    same dtype or None; `u` holds k + 1 uniforms in [0, 1) (may be None for "greedy")."""
    x = [int(t) for t in drafts]
    k = len(x)
    _check(x, p, q, u, mode)
    draws = [float(v) for v in u] if u is not None else []
    out: list[int] = []
    for i in range(k):
        pi = p[i]
        if mode == "greedy":
            a = int(np.argmax(pi))
            if a != x[i]:
                return VerifyOutcome(i, (*out, a))
        elif mode == "greedy_match":
            y = sample(pi, draws[i])
            if y != x[i]:
                return VerifyOutcome(i, (*out, y))
        else:
            qi = None if q is None else q[i]
            ratio = float(pi[x[i]])
            if qi is not None:
                qx = float(qi[x[i]])
                if not qx > 0.0:
                    raise ValueError("a draft token has zero probability under its draft "
                                     "distribution q")
                ratio /= qx
            if not draws[i] < min(1.0, ratio):
                return VerifyOutcome(i, (*out, _residual_sample(pi, qi, x[i], draws[k])))
        out.append(x[i])
    bonus = int(np.argmax(p[k])) if mode == "greedy" else sample(p[k], draws[k])
    return VerifyOutcome(k, (*out, bonus))


def _residual_sample(p: np.ndarray, q: np.ndarray | None, x: int, u: float) -> int:
    """Draw from norm(max(0, p − q)); for a point-mass q, from p without x. If p == q a
    rejection is impossible; guard anyway by drawing from p (so does the native kernel)."""
    if q is None:
        r = p.copy()
        r[x] = 0
    else:
        r = np.maximum(p - q, 0)
    if not r.any():
        return sample(p, u)
    return sample(r, u)


def _check(x: list[int], p: np.ndarray, q: np.ndarray | None,
           u: Sequence[float] | np.ndarray | None, mode: str) -> None:
    k = len(x)
    if mode not in VERIFY_MODES:
        raise ValueError(f"unknown verify mode {mode!r} (leviathan, greedy, greedy_match)")
    if p.ndim != 2 or p.shape[0] != k + 1 or p.shape[1] == 0:
        raise ValueError(f"p must have k + 1 = {k + 1} non-empty rows")
    if q is not None and q.shape != (k, p.shape[1]):
        raise ValueError(f"q must be k = {k} rows as wide as p")
    if u is None:
        if mode != "greedy":
            raise ValueError("u (k + 1 uniform draws) is needed unless greedy")
    elif len(u) < k + 1:
        raise ValueError(f"u needs k + 1 = {k + 1} uniform draws")
    n = p.shape[1]
    for t in x:
        if not 0 <= t < n:
            raise ValueError(f"draft token {t} is outside the vocabulary ({n})")
