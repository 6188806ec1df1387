"""The verify step: lossless at the distribution level, with the acceptance it promises.

The losslessness tests run the verifier many times on fixed target distributions p and a
deliberately different draft q, and test the emitted tokens against p with a chi-square
test (seeded, so deterministic). The same harness must *reject* two biased verifiers —
accepting every draft, and drafting greedily but accepting with min(1, p/q) — which shows
the test has the power to catch a wrong rule. Runs on the numpy reference and, when built,
on the native kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from runtime.sampling import native
from runtime.sampling import verify as verify_mod
from runtime.sampling.verify import VerifyOutcome

VerifyFn = Callable[..., VerifyOutcome]

IMPLS = [pytest.param(verify_mod.verify, id="numpy")]
if native.native_kernels() is not None:
    IMPLS.append(pytest.param(native.verify, id="native"))

V = 8  # vocabulary of the synthetic distributions
N = 20_000  # rounds per test: enough to see a 2-point bias in a probability at p < 1e-6
ALPHA = 1e-3  # a correct verifier fails by chance one time in a thousand (fixed seeds: never)


# ---- chi-square without scipy ------------------------------------------------------------

def _upper_gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (series below a + 1, continued fraction
    above; Numerical Recipes 6.2). Q(df/2, chi2/2) is the chi-square p-value."""
    if x <= 0.0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of `counts` to `probs`; cells expecting fewer than 5 are pooled."""
    counts = counts.ravel().astype(np.float64)
    expected = probs.ravel() * counts.sum()
    small = expected < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    keep = expected > 0
    if (counts[~keep] > 0).any():
        return 0.0  # a token that must never appear did
    counts, expected = counts[keep], expected[keep]
    stat = float(((counts - expected) ** 2 / expected).sum())
    return _upper_gamma_q((counts.size - 1) / 2.0, stat / 2.0)


def test_chi_square_helper_matches_known_values() -> None:
    # chi2 = 3.841 at 1 df and 11.07 at 5 df are the textbook 5% points
    assert _upper_gamma_q(0.5, 3.841 / 2) == pytest.approx(0.05, abs=1e-4)
    assert _upper_gamma_q(2.5, 11.070 / 2) == pytest.approx(0.05, abs=1e-4)
    assert _upper_gamma_q(10.0, 0.5) == pytest.approx(1.0, abs=1e-9)


# ---- fixed distributions -----------------------------------------------------------------

def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _dists(seed: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-position target p and draft q (rows), q deliberately unlike p."""
    rng = np.random.default_rng(seed)
    p = np.stack([_softmax(rng.standard_normal(V) * 1.2) for _ in range(positions)])
    q = np.stack([_softmax(rng.standard_normal(V) * 1.6) for _ in range(positions)])
    return p, q


def _draws(rng: np.random.Generator, dist: np.ndarray, size: int) -> np.ndarray:
    """`size` samples from `dist`, vectorised (inverse CDF)."""
    cdf = np.cumsum(dist)
    return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"),
                      dist.size - 1)


def _round(kind: str, impl: VerifyFn, p: np.ndarray, q: np.ndarray, x: list[int],
           u: np.ndarray) -> VerifyOutcome:
    """One round of the verifier under test: correct, or one of the two biased ones."""
    if kind == "accept_always":
        return VerifyOutcome(len(x), (*x, int(np.argmax(p[len(x)]))))
    return impl(x, p, q, u, "leviathan")


def _drafts(kind: str, rng: np.random.Generator, q: np.ndarray) -> list[int]:
    if kind == "greedy_draft":  # biased: drafts argmax q but judges it as if sampled
        return [int(np.argmax(row)) for row in q]
    return [int(_draws(rng, row, 1)[0]) for row in q]


def _first_token_counts(kind: str, impl: VerifyFn, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    p, q = _dists(seed, k + 1)
    rng = np.random.default_rng(seed + 100)
    # draft all rounds at once: row i of x is the k drafts of round i
    x = np.stack([_draws(rng, q[j], N) for j in range(k)], axis=1) if kind == "sampled" \
        else np.tile([int(np.argmax(q[j])) for j in range(k)], (N, 1))
    u = rng.random((N, k + 1))
    counts = np.zeros(V, dtype=np.int64)
    for i in range(N):
        verdict = _round("correct" if kind != "accept_always" else kind, impl, p,
                         q[:k], [int(t) for t in x[i]], u[i])
        counts[verdict.tokens[0]] += 1
    return counts, p[0]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("k", [1, 3])
def test_first_token_follows_p(impl: VerifyFn, k: int) -> None:
    counts, p1 = _first_token_counts("sampled", impl, k, seed=7)
    assert chi_square_p_value(counts, p1) > ALPHA


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", ["accept_always", "greedy_draft"])
def test_biased_verifiers_are_caught(impl: VerifyFn, kind: str) -> None:
    counts, p1 = _first_token_counts(kind, impl, 1, seed=7)
    assert chi_square_p_value(counts, p1) < 1e-6


def _first_two_tokens(kind: str, impl: VerifyFn, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Generate until two tokens are out, rounds of k = 3 with fixed per-position p and q,
    and count the pair. Lossless means the pair is distributed as p1 ⊗ p2."""
    k = 3
    p, q = _dists(seed, k + 3)
    rng = np.random.default_rng(seed + 200)
    counts = np.zeros((V, V), dtype=np.int64)
    for _ in range(N):
        out: list[int] = []
        while len(out) < 2:
            pos = len(out)
            x = _drafts(kind, rng, q[pos:pos + k])
            verdict = _round(kind, impl, p[pos:pos + k + 1], q[pos:pos + k], x,
                             rng.random(k + 1))
            out.extend(verdict.tokens)
        counts[out[0], out[1]] += 1
    return counts, np.outer(p[0], p[1])


@pytest.mark.parametrize("impl", IMPLS)
def test_first_two_tokens_follow_p1_p2(impl: VerifyFn) -> None:
    counts, joint = _first_two_tokens("sampled", impl, seed=11)
    assert chi_square_p_value(counts, joint) > ALPHA


@pytest.mark.parametrize("kind", ["accept_always", "greedy_draft"])
def test_biased_verifiers_fail_the_two_token_test(kind: str) -> None:
    counts, joint = _first_two_tokens(kind, verify_mod.verify, seed=11)
    assert chi_square_p_value(counts, joint) < 1e-6


@pytest.mark.parametrize("impl", IMPLS)
def test_point_mass_draft_is_lossless_and_accepts_with_p_of_x(impl: VerifyFn) -> None:
    # a deterministic drafter (prompt lookup) always proposes the same token: q = δ_x
    p, _ = _dists(3, 2)
    x = 5
    rng = np.random.default_rng(4)
    u = rng.random((N, 2))
    counts = np.zeros(V, dtype=np.int64)
    accepted = 0
    for i in range(N):
        verdict = impl([x], p, None, u[i], "leviathan")
        counts[verdict.tokens[0]] += 1
        accepted += verdict.accepted
    assert chi_square_p_value(counts, p[0]) > ALPHA
    assert accepted / N == pytest.approx(p[0, x], abs=4.5 * math.sqrt(p[0, x] / N))


@pytest.mark.parametrize("impl", IMPLS)
def test_acceptance_is_sum_of_min_p_q_versus_p_of_argmax_q(impl: VerifyFn) -> None:
    p, q = _dists(21, 2)
    rng = np.random.default_rng(22)
    x = _draws(rng, q[0], N)
    u = rng.random((N, 2))
    greedy = int(np.argmax(q[0]))
    lev = sum(impl([int(x[i])], p, q[:1], u[i], "leviathan").accepted for i in range(N))
    match = sum(impl([greedy], p, q[:1], u[i], "greedy_match").accepted for i in range(N))
    expect_lev = float(np.minimum(p[0], q[0]).sum())
    expect_match = float(p[0, greedy])
    for got, want in ((lev / N, expect_lev), (match / N, expect_match)):
        assert got == pytest.approx(want, abs=4.5 * math.sqrt(want * (1 - want) / N))
    assert expect_lev > expect_match  # the point of the Leviathan rule


@pytest.mark.parametrize("impl", IMPLS)
def test_greedy_match_is_lossless(impl: VerifyFn) -> None:
    p, q = _dists(5, 2)
    greedy = int(np.argmax(q[0]))
    u = np.random.default_rng(6).random((N, 2))
    counts = np.zeros(V, dtype=np.int64)
    for i in range(N):
        counts[impl([greedy], p, q[:1], u[i], "greedy_match").tokens[0]] += 1
    assert chi_square_p_value(counts, p[0]) > ALPHA


# ---- exact behaviour on small cases ------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_docstring_rounds(impl: VerifyFn) -> None:
    p = np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = np.array([[0.25, 0.75, 0.0]])
    assert impl([1], p, q, [0.5, 0.3]) == VerifyOutcome(1, (1, 2))
    assert impl([1], p, q, [0.9, 0.3]) == VerifyOutcome(0, (0,))


@pytest.mark.parametrize("impl", IMPLS)
def test_greedy_mode_accepts_while_argmax_agrees(impl: VerifyFn) -> None:
    eye = np.eye(4)
    p = eye[[2, 3, 1, 0]]  # T = 0: point masses on 2, 3, 1, then 0
    assert impl([2, 3, 1], p, None, None, "greedy") == VerifyOutcome(3, (2, 3, 1, 0))
    assert impl([2, 0, 1], p, None, None, "greedy") == VerifyOutcome(1, (2, 3))
    assert impl([], p[:1], None, None, "greedy") == VerifyOutcome(0, (2,))


@pytest.mark.parametrize("impl", IMPLS)
def test_rejection_draws_from_the_residual_only(impl: VerifyFn) -> None:
    p = np.array([[0.3, 0.3, 0.4, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[0.0, 0.6, 0.4, 0.0]])  # residual max(0, p - q) = [0.3, 0, 0, 0]
    for u in np.linspace(0.0, 0.99, 12):
        verdict = impl([1], p, q, [0.9999, float(u)])
        assert verdict == VerifyOutcome(0, (0,))


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_inputs_raise(impl: VerifyFn) -> None:
    p = np.full((2, 4), 0.25)
    q = np.array([[0.0, 0.5, 0.5, 0.0]])
    with pytest.raises(ValueError, match="zero probability"):
        impl([0], p, q, [0.5, 0.5])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        impl([7], p, None, [0.5, 0.5])
    with pytest.raises(ValueError, match="k \\+ 1"):
        impl([0, 1], p, None, [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="unknown verify mode"):
        impl([0], p, None, [0.5, 0.5], "accept_all")
    with pytest.raises(ValueError, match="uniform draws"):
        impl([0], p, None, None, "leviathan")
