"""Perplexity and KL divergence: the arithmetic against brute force, then real runs on the
tiny model (its byte-level vocabulary makes any English text long enough)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from runtime.errors import EvalError, KLDBaseMismatch, LoadError, TextTooShort
from runtime.quality.evaluate import EvalOptions, default_text, evaluate
from runtime.quality.kld import kld_rows, load_base, log_softmax, summarize
from tests.fixtures.reference_llama import model_params


def brute_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    p, q = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(p) * (p - q)).sum(axis=1)


def test_log_softmax_rows_are_distributions() -> None:
    rng = np.random.default_rng(0)
    lp = log_softmax(rng.normal(size=(5, 100)) * 10)
    assert np.allclose(np.exp(lp).sum(axis=1), 1.0)


def summary(lp: np.ndarray, k: int, m: int, seed: int = 0):
    return summarize(lp, k, m, np.random.default_rng(seed))


def test_the_summary_keeps_the_most_probable_in_order_and_the_tail_mass() -> None:
    lp = log_softmax(np.array([[0.0, 3.0, 1.0, 2.0, -1.0]]))
    ref = summary(lp, 2, 50)
    assert ref.ids.tolist() == [[1, 3]]
    assert np.exp(ref.logp[0]).sum() + np.exp(ref.rest[0]) == pytest.approx(1.0, abs=1e-6)
    assert set(ref.tail_ids[0].tolist()) <= {0, 2, 4}  # only tokens outside the top
    assert set(ref.tail_ids[0].tolist()) == {0, 2, 4}  # 50 draws reach all three
    assert np.allclose(ref.tail_logp[0], lp[0, ref.tail_ids[0]])


def test_kld_with_the_whole_vocabulary_is_the_exact_kl() -> None:
    rng = np.random.default_rng(1)
    p, q = rng.normal(size=(8, 50)) * 3, rng.normal(size=(8, 50)) * 3
    ref = summary(log_softmax(p), 50, 4)
    assert np.isneginf(ref.rest).all()
    assert np.allclose(kld_rows(ref, log_softmax(q)), brute_kl(p, q), rtol=1e-5)


def test_the_sampled_tail_makes_the_kld_unbiased() -> None:
    rng = np.random.default_rng(2)
    p, q = rng.normal(size=(400, 300)) * 2, rng.normal(size=(400, 300)) * 2
    lp, lq = log_softmax(p), log_softmax(q)
    exact = brute_kl(p, q).mean()
    head_only = kld_rows(summary(lp, 5, 0), lq).mean()  # no tail detail at all
    sampled = kld_rows(summary(lp, 5, 64), lq).mean()
    assert abs(sampled - exact) < 0.02 * exact
    assert abs(head_only - exact) > 5 * abs(sampled - exact)


def test_identical_distributions_have_zero_kld() -> None:
    lp = log_softmax(np.random.default_rng(3).normal(size=(4, 30)))
    assert np.allclose(kld_rows(summary(lp, 8, 16), lp), 0.0, atol=1e-5)


def test_the_shipped_text_is_there_and_long_enough() -> None:
    text = default_text()
    assert 25_000 <= len(text.encode()) <= 40_000
    assert "lighthouse" in text


@pytest.fixture(scope="module")
def text() -> str:
    return default_text()[:12_000]


OPTS = EvalOptions(n_ctx=64, max_chunks=6, n_threads=1)


def one_token_at_a_time_ppl(path: Path, text: str, n_ctx: int, n_chunks: int) -> float:
    """The method written out plainly: feed each chunk one token per decode, score the
    second half's next-token log-probabilities."""
    import llama_cpp.llama_cpp as L

    model = L.llama_model_load_from_file(str(path).encode(), model_params())
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    data = text.encode()
    buf = (L.llama_token * len(data))()
    n = L.llama_tokenize(vocab, data, len(data), buf, len(data), True, False)
    tokens = list(buf[:n])
    cparams = L.llama_context_default_params()
    cparams.n_ctx, cparams.n_threads, cparams.n_threads_batch = n_ctx, 1, 1
    ctx = L.llama_init_from_model(model, cparams)
    nll: list[float] = []
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        for pos, tok in enumerate(chunk[:-1]):
            one = (L.llama_token * 1)(tok)
            assert L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) == 0
            if pos >= n_ctx // 2:
                row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
                nll.append(-float(log_softmax(row[None, :])[0, chunk[pos + 1]]))
    L.llama_free(ctx)
    L.llama_model_free(model)
    return float(np.exp(np.mean(nll)))


def test_perplexity_scores_the_second_half_of_each_chunk(tiny_target: Path, text: str) -> None:
    result = evaluate(tiny_target, text, OPTS)
    assert result.n_chunks == 6
    assert result.n_scored == 6 * (64 - 32 - 1)
    assert result.ppl == pytest.approx(one_token_at_a_time_ppl(tiny_target, text, 64, 6), rel=1e-3)
    assert result.ppl_stderr > 0
    assert result.kld is None and result.delta_ppl_pct is None


def test_batch_size_does_not_change_the_answer(tiny_target: Path, text: str) -> None:
    whole = evaluate(tiny_target, text, OPTS)
    split = evaluate(tiny_target, text, EvalOptions(n_ctx=64, n_batch=16, max_chunks=6, n_threads=1))
    assert split.ppl == pytest.approx(whole.ppl, rel=1e-4)


def test_a_run_against_its_own_reference_has_no_divergence(tiny_target: Path, text: str,
                                                             tmp_path: Path) -> None:
    ref = tmp_path / "base.npz"
    first = evaluate(tiny_target, text, OPTS, save_kld_base=ref)
    base = load_base(ref)
    assert base.n_ctx == 64 and base.ref.ids.shape == (first.n_scored, 64)
    assert base.ref.tail_ids.shape == (first.n_scored, 64)
    again = evaluate(tiny_target, text, OPTS, kld_base=ref)
    assert again.kld == pytest.approx(0.0, abs=1e-5)
    assert again.same_top_pct == 100.0
    assert again.delta_ppl_pct == pytest.approx(0.0, abs=1e-3)
    assert again.ppl_base == pytest.approx(first.ppl, rel=1e-6)


def test_quantized_kv_cache_is_measured_against_f16(tiny_target: Path, text: str,
                                                    tmp_path: Path) -> None:
    ref = tmp_path / "base.npz"
    evaluate(tiny_target, text, OPTS, save_kld_base=ref)
    q8 = evaluate(tiny_target, text, EvalOptions(n_ctx=64, n_threads=1, type_k="q8_0",
                                                 type_v="q8_0"), kld_base=ref)
    q4 = evaluate(tiny_target, text, EvalOptions(n_ctx=64, n_threads=1, type_k="q4_0",
                                                 type_v="q4_0"), kld_base=ref)
    assert (q8.type_k, q8.type_v) == ("q8_0", "q8_0")
    assert q8.kld is not None and q4.kld is not None
    assert 0.0 < q8.kld < q4.kld  # coarser cache, larger divergence
    assert q8.same_top_pct is not None and q8.same_top_pct > 90.0


def test_the_reference_decides_the_context(tiny_target: Path, text: str, tmp_path: Path) -> None:
    ref = tmp_path / "base.npz"
    evaluate(tiny_target, text, OPTS, save_kld_base=ref)
    other = evaluate(tiny_target, text, EvalOptions(n_ctx=128, n_threads=1), kld_base=ref)
    assert (other.n_ctx, other.n_chunks) == (64, 6)


def test_a_reference_of_another_text_is_refused(tiny_target: Path, text: str,
                                                tmp_path: Path) -> None:
    ref = tmp_path / "base.npz"
    evaluate(tiny_target, text, OPTS, save_kld_base=ref)
    with pytest.raises(KLDBaseMismatch, match="another text"):
        evaluate(tiny_target, text[::-1], OPTS, kld_base=ref)


def test_a_short_text_is_refused_with_the_numbers(tiny_target: Path) -> None:
    with pytest.raises(TextTooShort, match="needs at least 128"):
        evaluate(tiny_target, "too short", OPTS)


def test_a_file_llama_cpp_refuses_is_a_load_error_with_its_reason(tmp_path: Path) -> None:
    """The evaluation loads as the engine does (runtime.llama.binding): the same typed error,
    the reason picked from llama.cpp's log by the same rule (runtime.llama.reason)."""
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"abcd" + bytes(64))
    with pytest.raises(LoadError, match=r"^llama.cpp could not load magic.gguf: invalid magic "
                                        r"characters: 'abcd', expected 'GGUF'$"):
        evaluate(bad, "text", OPTS)


def test_bad_options_are_refused() -> None:
    with pytest.raises(EvalError, match="even number"):
        EvalOptions(n_ctx=63)
    with pytest.raises(EvalError, match="cache type"):
        EvalOptions(type_k="q3_k")


def test_cli_eval_prints_and_saves(tiny_target: Path, text: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from runtime.cli.main import main

    source = tmp_path / "t.txt"
    source.write_text(text, encoding="utf-8")
    ref = tmp_path / "ref.npz"
    common = ["--text", str(source), "--ctx", "64", "--chunks", "3", "--threads", "1"]
    assert main(["eval", str(tiny_target), *common, "--save-kld-base", str(ref)]) == 0
    assert capsys.readouterr().out.startswith("PPL ")
    assert main(["eval", str(tiny_target), *common, "--kv-k", "q8_0", "--kld-base", str(ref),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["type_k"] == "q8_0" and data["n_chunks"] == 3 and data["kld"] is not None
    assert main(["eval", str(tiny_target), "--text", str(source), "--ctx", "8192"]) == 2
    assert "needs at least 16384" in capsys.readouterr().err


def test_evaluate_logs_as_the_engine_does(tiny_target: Path, text: str,
                                          caplog: pytest.LogCaptureFixture,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    """llama.cpp's log while evaluating reaches the engine's receiver
    (runtime.llama.binding.llama_log): the `outrider.llama` logger at debug level, never the
    terminal."""
    with caplog.at_level(logging.DEBUG, logger="outrider.llama"):
        evaluate(tiny_target, text, OPTS)
    assert any("llama_model_loader" in r.getMessage() for r in caplog.records)
    assert "llama_model_loader" not in capfd.readouterr().err
