"""The native kernels against their numpy references: same kept tokens, same probabilities
(to rounding: numpy's SIMD exp is not glibc's), same sampled tokens for the same draws,
same verify decisions; and the same errors. The comparisons are skipped where the extension
is not built; the fallback tests at the end run everywhere."""

from __future__ import annotations

import ctypes
import importlib
import types

import numpy as np
import pytest

from runtime.errors import SettingsError
from runtime.sampling import kernels, native
from runtime.sampling import verify as verify_mod
from runtime.speculative.prompt_lookup import ngram_lookup_reference

ext = native.native_kernels()
needs_native = pytest.mark.skipif(ext is None, reason=native.native_status())

SETTINGS = [  # temperature, top_k, top_p, min_p
    (0.8, 40, 0.95, 0.05),
    (0.8, 0, 0.95, 0.05),
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 0.9, 0.0),
    (1.3, 5, 1.0, 0.1),
    (0.5, 1, 1.0, 0.0),
    (2.0, 0, 0.5, 0.0),
    (1.0, 3, 0.3, 0.2),
    (0.0, 40, 0.95, 0.05),
]


def _native(logits: np.ndarray, t: float, k: int, p: float, m: float,
            dtype: type = np.float64) -> np.ndarray:
    out = np.empty(logits.size, dtype=dtype)
    return native.transform(logits, temperature=t, top_k=k, top_p=p, min_p=m, out=out)


def _reference(logits: np.ndarray, t: float, k: int, p: float, m: float) -> np.ndarray:
    return kernels.transform(logits, temperature=t, top_k=k, top_p=p, min_p=m)


def _assert_same(logits: np.ndarray, t: float, k: int, p: float, m: float,
                 draws: np.ndarray) -> None:
    want = _reference(logits, t, k, p, m)
    got = _native(logits, t, k, p, m)
    np.testing.assert_array_equal(got > 0, want > 0)  # the same tokens survive
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    for u in draws:
        assert native.sample(got, float(u)) == kernels.sample(want, float(u))


@needs_native
@pytest.mark.parametrize("setting", SETTINGS)
def test_random_rows_match_numpy(setting: tuple[float, int, float, float]) -> None:
    rng = np.random.default_rng(SETTINGS.index(setting))
    for _ in range(60):
        n = int(rng.choice([2, 7, 50, 300, 3000, 9000]))
        logits = (rng.standard_normal(n) * rng.choice([0.3, 1.0, 4.0])).astype(np.float32)
        if rng.random() < 0.3:
            logits[rng.random(n) < 0.5] = -np.inf  # masked tokens (grammar, bans)
            logits[0] = 0.0
        if rng.random() < 0.3:
            logits = np.round(logits).astype(np.float32)  # many exact ties
        _assert_same(logits, *setting, rng.random(8))


@needs_native
@pytest.mark.parametrize("n", [49_152, 151_936])
@pytest.mark.parametrize("setting", [(0.8, 40, 0.95, 0.05), (0.8, 0, 0.95, 0.05),
                                     (1.0, 0, 0.9, 0.0), (1.0, 0, 0.999, 0.0)])
def test_real_vocabulary_sizes_match_numpy(n: int, setting: tuple[float, int, float, float]) -> None:
    # a flat row (scale 0.5) puts thousands of tokens in the top-p nucleus: the native
    # code must take its quickselect path there and still agree
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal(n) * 0.5).astype(np.float32)
    _assert_same(logits, *setting, rng.random(16))


@needs_native
@pytest.mark.parametrize("setting", SETTINGS)
def test_all_but_one_minus_inf_is_a_point_mass(setting: tuple[float, int, float, float]) -> None:
    logits = np.full(1000, -np.inf, dtype=np.float32)
    logits[417] = -3.0
    got = _native(logits, *setting)
    assert got[417] == 1.0 and got.sum() == 1.0
    np.testing.assert_array_equal(got, _reference(logits, *setting))


@needs_native
def test_ties_break_toward_the_lower_id() -> None:
    logits = np.array([0.0, 2.0, 1.0, 2.0, 2.0, 1.0], dtype=np.float32)
    for k in (1, 2, 3, 4):
        got = _native(logits, 1.0, k, 1.0, 0.0)
        np.testing.assert_array_equal(got > 0, _reference(logits, 1.0, k, 1.0, 0.0) > 0)
    assert np.flatnonzero(_native(logits, 1.0, 2, 1.0, 0.0)).tolist() == [1, 3]
    assert np.flatnonzero(_native(logits, 0.0, 0, 1.0, 0.0)).tolist() == [1]  # greedy
    # top-p with equal probabilities: 4 tokens at 1/4 each, the nucleus of 0.5 is ids 0, 1
    flat = np.zeros(4, dtype=np.float32)
    assert np.flatnonzero(_native(flat, 1.0, 0, 0.5, 0.0)).tolist() == [0, 1]
    assert np.flatnonzero(_reference(flat, 1.0, 0, 0.5, 0.0)).tolist() == [0, 1]


@needs_native
def test_top_p_one_is_the_plain_softmax_and_top_k_one_the_argmax() -> None:
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(5000).astype(np.float32)
    x = logits.astype(np.float64) / 0.9
    e = np.exp(x - x.max())
    np.testing.assert_allclose(_native(logits, 0.9, 0, 1.0, 0.0), e / e.sum(), rtol=1e-12)
    top1 = _native(logits, 0.9, 1, 1.0, 0.0)
    assert top1[int(np.argmax(logits))] == 1.0 and top1.sum() == 1.0


@needs_native
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_logits_raise_the_same_settings_error(temperature: float) -> None:
    logits = np.zeros(100, dtype=np.float32)
    logits[57] = np.nan
    with pytest.raises(SettingsError) as from_numpy:
        _reference(logits, temperature, 40, 0.95, 0.05)
    with pytest.raises(SettingsError) as from_native:
        _native(logits, temperature, 40, 0.95, 0.05)
    assert str(from_native.value) == str(from_numpy.value)


@needs_native
def test_nothing_finite_raises_at_temperature_above_zero() -> None:
    logits = np.full(10, -np.inf, dtype=np.float32)
    with pytest.raises(SettingsError, match="every logit is -inf"):
        _native(logits, 0.8, 0, 1.0, 0.0)
    with pytest.raises(SettingsError, match="every logit is -inf"):
        _reference(logits, 0.8, 0, 1.0, 0.0)
    # greedy takes np.argmax, which answers id 0 for an all -inf row: both agree
    np.testing.assert_array_equal(_native(logits, 0.0, 0, 1.0, 0.0),
                                  _reference(logits, 0.0, 0, 1.0, 0.0))


@needs_native
def test_float32_output_and_in_place_view_of_a_c_buffer() -> None:
    # llama_get_logits_ith hands out a float*: a numpy view over it must do, no copy
    n = 2048
    rng = np.random.default_rng(9)
    buffer = (ctypes.c_float * n)(*rng.standard_normal(n).astype(np.float32).tolist())
    view = np.ctypeslib.as_array(ctypes.cast(buffer, ctypes.POINTER(ctypes.c_float)), (n,))
    assert view.ctypes.data == ctypes.addressof(buffer)
    want = _reference(view, 0.8, 40, 0.95, 0.05)
    np.testing.assert_allclose(_native(view, 0.8, 40, 0.95, 0.05, np.float32), want,
                               rtol=1e-6, atol=1e-9)


@needs_native
def test_sample_matches_kernels_for_both_dtypes_and_edge_draws() -> None:
    rng = np.random.default_rng(12)
    for dtype in (np.float64, np.float32):
        for _ in range(50):
            probs = rng.dirichlet(np.full(40, 0.3)).astype(dtype)
            probs[rng.random(40) < 0.3] = 0  # filtered tokens must never be drawn
            for u in [0.0, 1e-12, 0.5, 0.999999, *rng.random(10)]:
                got = native.sample(probs, float(u))
                assert got == kernels.sample(probs, float(u))
                assert probs[got] > 0 or not probs.any()


@needs_native
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["leviathan", "greedy", "greedy_match"])
def test_verify_matches_numpy(dtype: type, mode: str) -> None:
    rng = np.random.default_rng(len(mode) * 7 + (dtype == np.float32))
    for _ in range(300):
        n, k = int(rng.integers(2, 60)), int(rng.integers(0, 7))
        alpha = rng.choice([0.1, 1.0, 5.0])
        p = rng.dirichlet(np.full(n, alpha), size=k + 1).astype(dtype)
        q = rng.dirichlet(np.full(n, alpha), size=k).astype(dtype) if rng.random() < 0.7 \
            else None
        # drafts sampled from q where it is given (so q(x) > 0), otherwise anything
        if q is None:
            x = [int(t) for t in rng.integers(n, size=k)]
        else:
            x = [kernels.sample(row.astype(np.float64), float(rng.random())) for row in q]
        u = rng.random(k + 1)
        want = verify_mod.verify(x, p, q, u, mode)  # type: ignore[arg-type]
        got = native.verify(x, p, q, u, mode)  # type: ignore[arg-type]
        assert got == want


@needs_native
def test_ngram_lookup_matches_reference() -> None:
    rng = np.random.default_rng(5)
    for _ in range(400):
        size = int(rng.integers(0, 120))
        tokens = rng.integers(0, int(rng.choice([2, 3, 8, 50])), size).astype(np.int32)
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 3))
        k = int(rng.integers(0, 9))
        assert ext is not None
        assert ext.ngram_lookup(tokens, lo, hi, k) == ngram_lookup_reference(tokens, lo, hi, k)


@needs_native
def test_native_status_names_the_kernels() -> None:
    assert native.native_status().startswith("native kernels")


# ---- the numpy fallback ------------------------------------------------------------------

def test_missing_or_stale_extension_means_numpy_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> types.ModuleType:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", missing)
    kernels_, status = native._load()
    assert kernels_ is None and status.startswith("numpy fallback (runtime._native not built")

    stale = types.ModuleType("runtime._native")
    stale.version = lambda: 1  # type: ignore[attr-defined]
    monkeypatch.setattr(importlib, "import_module", lambda name: stale)
    kernels_, status = native._load()
    assert kernels_ is None and "ABI 1" in status and "rebuild" in status


def test_dispatch_falls_back_to_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_NATIVE", None)
    rng = np.random.default_rng(8)
    logits = rng.standard_normal(500).astype(np.float32)
    out = np.empty(500, dtype=np.float32)
    got = native.transform(logits, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, out=out)
    want = _reference(logits, 0.8, 40, 0.95, 0.05)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert native.sample(want, 0.3) == kernels.sample(want, 0.3)
    p = rng.dirichlet(np.ones(6), size=3)
    q = rng.dirichlet(np.ones(6), size=2)
    assert native.verify([1, 2], p, q, [0.2, 0.9, 0.5]) == \
        verify_mod.verify([1, 2], p, q, [0.2, 0.9, 0.5])
    logits[3] = np.nan
    with pytest.raises(SettingsError, match="NaN"):
        native.transform(logits, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
