"""KL divergence against a reference run, from a compact summary of the reference.

The KL divergence needs a reference: `save_kld_base` stores, per scored position, the
reference's top-k tokens with their log-probabilities (exact), the log of the remaining
mass, and m tokens drawn from that remainder in proportion to their probability. Then

    KLD(P ‖ Q) = Σ_top p·(log p − log q) + P_rest · mean over the samples of (log p − log q)

— exact over the head, an unbiased Monte-Carlo estimate over the tail. (Dropping the tail
detail altogether, i.e. the KL over k + 1 outcomes, reads about 16% low for Q4_0 of
SmolLM2-135M at k = 64 and still 3% low at k = 1024: a small model's tail is fat.) The
file costs 8 bytes (an int32 id and a float32 log-prob) per kept token: 1 KB per position
at k = m = 64, where llama.cpp stores every log-probability as 16 bits (98 KB per position
for a 49k vocabulary).

    ref = summarize(log_softmax(ref_logits), k=64, m=64, rng=np.random.default_rng(0))
    kld_rows(ref, log_softmax(quant_logits)).mean()      # mean KLD over the positions
    save_base(path, tokens, n_ctx, ref, target_logp, meta); load_base(path)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.atomic_file import atomic_output
from runtime.errors import KLDBaseMismatch

KLD_BASE_VERSION = 2


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-probabilities in float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


@dataclass(frozen=True)
class RefDist:
    """A reference distribution per position, in O(k + m) numbers instead of the vocabulary.

    ids/logp: the k most probable tokens and their log-probabilities, most probable first.
    rest: log of the probability outside them (-inf when nothing is left).
    tail_ids/tail_logp: m tokens drawn from that remainder in proportion to probability
    (with replacement), and their log-probabilities — an importance sample of the tail.
    """

    ids: np.ndarray  # int32 [n, k]
    logp: np.ndarray  # float32 [n, k]
    rest: np.ndarray  # float32 [n]
    tail_ids: np.ndarray  # int32 [n, m]
    tail_logp: np.ndarray  # float32 [n, m]

    def rows(self, lo: int, hi: int) -> RefDist:
        return RefDist(self.ids[lo:hi], self.logp[lo:hi], self.rest[lo:hi],
                       self.tail_ids[lo:hi], self.tail_logp[lo:hi])

    @staticmethod
    def concat(parts: list[RefDist]) -> RefDist:
        return RefDist(*(np.concatenate([getattr(p, f) for p in parts])
                         for f in ("ids", "logp", "rest", "tail_ids", "tail_logp")))


def summarize(logp: np.ndarray, k: int, m: int, rng: np.random.Generator) -> RefDist:
    """Keep the top k of each row of log-probabilities exactly and sample m from the rest."""
    n, vocab = logp.shape
    k = min(k, vocab)
    part = np.argpartition(-logp, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(logp, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    ids = np.take_along_axis(part, order, axis=1)
    top = np.take_along_axis(vals, order, axis=1)
    tail = np.exp(logp)
    np.put_along_axis(tail, ids, 0.0, axis=1)
    cdf = np.cumsum(tail, axis=1)
    mass = cdf[:, -1]  # summed from the tail itself: no 1 - x cancellation
    tail_ids = np.zeros((n, m), dtype=np.int64)
    u = rng.random((n, m)) * mass[:, None]
    for r in range(n):
        if mass[r] > 0:
            tail_ids[r] = np.minimum(np.searchsorted(cdf[r], u[r], side="right"), vocab - 1)
    tail_logp = np.take_along_axis(logp, tail_ids, axis=1)
    with np.errstate(divide="ignore"):
        rest = np.log(mass)
    return RefDist(ids.astype(np.int32), top.astype(np.float32), rest.astype(np.float32),
                   tail_ids.astype(np.int32), tail_logp.astype(np.float32))


def kld_rows(ref: RefDist, logq: np.ndarray) -> np.ndarray:
    """KL(P_ref ‖ Q) per row: exact over the top k, importance-sampled over the tail.

    KL = Σ_top p·(log p − log q) + P_rest · E_{i ~ P|tail}[log p_i − log q_i]; the second
    term is estimated by the mean over the m stored tail samples. Unbiased, so a row may
    come out slightly negative; the mean over thousands of positions is what to read.

    >>> p = log_softmax(np.array([[2.0, 1.0, 0.0, -1.0]]))
    >>> kl = kld_rows(summarize(p, 2, 8, np.random.default_rng(0)), p)   # identical: 0
    >>> round(float(kl[0]), 6)                  # up to the float32 the reference is kept in
    0.0
    """
    lp = ref.logp.astype(np.float64)
    lq = np.take_along_axis(logq, ref.ids.astype(np.intp), axis=1)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    rest = ref.rest.astype(np.float64)
    has_rest = np.isfinite(rest)
    if has_rest.any() and ref.tail_ids.shape[1]:
        tq = np.take_along_axis(logq[has_rest], ref.tail_ids[has_rest].astype(np.intp), axis=1)
        tp = ref.tail_logp[has_rest].astype(np.float64)
        kl[has_rest] += np.exp(rest[has_rest]) * (tp - tq).mean(axis=1)
    return kl


# ---------------------------------------------------------------------------------------
# The reference file.


def save_base(path: Path, tokens: np.ndarray, n_ctx: int, ref: RefDist,
              target_logp: np.ndarray, meta: dict[str, Any]) -> Path:
    """Write a KLD reference (npz) atomically: temporary name, then rename."""
    path = Path(path)
    with atomic_output(path) as tmp, tmp.open("wb") as f:
        np.savez_compressed(f, version=KLD_BASE_VERSION, tokens=tokens.astype(np.int32),
                            n_ctx=n_ctx, ids=ref.ids, logp=ref.logp, rest=ref.rest,
                            tail_ids=ref.tail_ids, tail_logp=ref.tail_logp,
                            target_logp=target_logp.astype(np.float32), meta=json.dumps(meta))
    return path


@dataclass(frozen=True)
class KLDBase:
    tokens: np.ndarray
    n_ctx: int
    ref: RefDist
    target_logp: np.ndarray
    meta: dict[str, Any]


def load_base(path: Path) -> KLDBase:
    path = Path(path)
    if not path.is_file():
        raise KLDBaseMismatch(f"No KL-divergence reference at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != KLD_BASE_VERSION:
                raise KLDBaseMismatch(f"{path.name} is a reference of another format version")
            ref = RefDist(z["ids"], z["logp"], z["rest"], z["tail_ids"], z["tail_logp"])
            return KLDBase(z["tokens"], int(z["n_ctx"]), ref, z["target_logp"],
                           json.loads(str(z["meta"])))
    except (OSError, KeyError, ValueError) as exc:
        raise KLDBaseMismatch(f"{path.name} is not a KL-divergence reference: {exc}") from exc
