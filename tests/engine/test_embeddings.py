"""Embeddings through the engine: a tiny BERT (encoder, its own pooling), the tiny llama
(decoder, mean pooling), the default model against llama-cpp-python's own `Llama.embed`, and
an embedding request beside a running stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from llama_cpp import LLAMA_POOLING_TYPE_MEAN

from runtime.engine.embeddings import Embedder
from runtime.engine.engine import Engine
from runtime.engine.scheduler import Scheduler
from runtime.errors import ContextOverflow, EmbeddingsUnsupported, SettingsError
from runtime.events import ChatMessage, GenerationRequest, SamplingParams, TokenEvent
from tests.engine.conftest import tiny_settings
from tests.fixtures.reference_llama import reference_llama
from tests.fixtures.tiny_bert_gguf import BERT, CLS, SEP, write_tiny_bert_gguf

TEXTS = ["hello world", "the cat sat on the mat", "a kitten is a small cat", "tax form"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert_gguf(tmp_path_factory.mktemp("bert") / "tiny-bert.gguf")


@pytest.fixture(scope="module")
def bert_engine(bert: Path) -> Iterator[Engine]:
    eng = Engine()
    eng.load(tiny_settings(bert))
    yield eng
    eng.stop()


def reference(path: Path, texts: list[str], **kw: object) -> list[np.ndarray]:
    """llama-cpp-python's high-level embeddings of `texts`, one at a time, normalised."""
    llm = reference_llama(path, embedding=True, verbose=False, n_ctx=512, n_batch=512,
                          n_ubatch=512, n_threads=1, **kw)
    try:
        return [np.asarray(llm.embed(t, normalize=True), dtype=np.float64) for t in texts]
    finally:
        llm.close()


def cosines(a: tuple[np.ndarray, ...] | list[np.ndarray], b: list[np.ndarray]) -> list[float]:
    return [float(np.dot(x, y) / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b, strict=True)]


def test_bert_embeds_unit_vectors_of_its_width(bert_engine: Engine) -> None:
    result = bert_engine.embed(TEXTS)
    assert result.pooling == "mean"  # what the file says (bert.pooling_type)
    assert len(result.vectors) == len(TEXTS)
    for v in result.vectors:
        assert v.dtype == np.float32 and v.shape == (BERT.n_embd,)
        assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    # [CLS] hello world [SEP]: the specials count as prompt tokens
    assert result.n_tokens[0] == 4 and result.prompt_tokens == sum(result.n_tokens)
    distinct = {tuple(np.round(v, 5)) for v in result.vectors}
    assert len(distinct) == len(TEXTS)


def test_bert_is_deterministic_and_independent_of_its_batch(bert_engine: Engine) -> None:
    together = bert_engine.embed(TEXTS)
    again = bert_engine.embed(TEXTS)
    alone = [bert_engine.embed([t]).vectors[0] for t in TEXTS]
    for a, b, c in zip(together.vectors, again.vectors, alone, strict=True):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(a, c, atol=1e-5)


def test_token_ids_are_embedded_as_given(bert_engine: Engine) -> None:
    text = bert_engine.embed(["hello world"])
    ids = bert_engine.embed([[CLS, 11, 12, SEP]])  # the tokens of "hello world" (the fixture's)
    assert ids.n_tokens == (4,)
    np.testing.assert_allclose(ids.vectors[0], text.vectors[0], atol=1e-6)


def test_bert_matches_llama_cpp_python(bert: Path, bert_engine: Engine) -> None:
    ours = bert_engine.embed(TEXTS).vectors
    assert min(cosines(ours, reference(bert, TEXTS))) > 0.99999


def test_cls_pooling_from_the_file(tmp_path: Path) -> None:
    path = write_tiny_bert_gguf(tmp_path / "cls.gguf", replace(BERT, pooling=gguf.PoolingType.CLS))
    eng = Engine()
    try:
        eng.load(tiny_settings(path))
        result = eng.embed(TEXTS[:2])
        assert result.pooling == "cls"
        assert min(cosines(result.vectors, reference(path, TEXTS[:2]))) > 0.99999
    finally:
        eng.stop()


def test_a_reranker_is_refused_and_the_engine_goes_on(tmp_path: Path,
                                                     tiny_target: Path) -> None:
    path = write_tiny_bert_gguf(tmp_path / "rank.gguf", replace(BERT, pooling=gguf.PoolingType.RANK))
    eng = Engine()
    try:
        eng.load(tiny_settings(path))
        with pytest.raises(EmbeddingsUnsupported, match="reranker"):
            eng.embed(["hello"])
        eng.load(tiny_settings(tiny_target))
        assert len(eng.embed(["hello"]).vectors) == 1
    finally:
        eng.stop()


def test_bad_inputs_are_typed_errors(bert_engine: Engine) -> None:
    with pytest.raises(SettingsError, match="at least one"):
        bert_engine.embed([])
    with pytest.raises(SettingsError, match="input 1 is empty"):
        bert_engine.embed([[CLS], []])
    with pytest.raises(SettingsError, match="token id 99999"):
        bert_engine.embed([[CLS, 99999]])
    long = " ".join(["cat"] * 600)
    with pytest.raises(ContextOverflow, match=r"input 1 has 602 tokens.*at most 512"):
        bert_engine.embed(["hello", long])
    assert len(bert_engine.embed(["still serving"]).vectors) == 1


def test_many_inputs_span_several_decodes(bert_engine: Engine) -> None:
    texts = [f"the cat {'sat ' * (i % 7)}on mat {i}" for i in range(150)]  # > 64 per decode
    together = bert_engine.embed(texts)
    assert len(together.vectors) == 150
    for i in (0, 63, 64, 149):
        np.testing.assert_allclose(together.vectors[i], bert_engine.embed([texts[i]]).vectors[0],
                                   atol=1e-5)


def test_the_tiny_decoder_mean_pools(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    result = engine.embed(TEXTS)
    assert result.pooling == "mean"  # the file says nothing: a decoder's hidden states, averaged
    assert all(v.shape == (128,) for v in result.vectors)
    ref = reference(tiny_target, TEXTS, pooling_type=LLAMA_POOLING_TYPE_MEAN)
    assert min(cosines(result.vectors, ref)) > 0.9999


def test_unload_frees_the_embedding_context(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    engine.embed(["x"])
    engine.unload()
    with pytest.raises(Exception, match="no model is loaded"):
        engine.embed(["x"])


def test_an_embedding_request_beside_a_stream(engine: Engine, tiny_target: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream's tokens at T=0 are those it makes alone, and the engine interleaves: a
    generation step runs between two embedding decodes of one request."""
    engine.load(tiny_settings(tiny_target, n_ctx=2048))
    sampling = SamplingParams(temperature=0.0, max_tokens=600, ignore_eos=True)

    def request() -> GenerationRequest:
        return GenerationRequest(messages=(ChatMessage("user", "Tell me a story"),),
                                 sampling=sampling)

    def tokens(handle: object, on_first: object = None) -> list[int]:
        out: list[int] = []
        for event in handle.events(timeout=120):  # type: ignore[attr-defined]
            if isinstance(event, TokenEvent):
                out.append(event.token_id)
                if len(out) == 1 and on_first is not None:
                    on_first()  # type: ignore[operator]
        return out

    alone = tokens(engine.submit(request()))

    log: list[str] = []
    step, embed_step = Scheduler.step, Embedder.step

    def logged_step(self: Scheduler) -> object:
        log.append("gen")
        return step(self)

    def logged_embed_step(self: Embedder) -> int:
        log.append("embed")
        return embed_step(self)

    monkeypatch.setattr(Scheduler, "step", logged_step)
    monkeypatch.setattr(Embedder, "step", logged_embed_step)
    texts = [f"story number {i} " * 4 for i in range(60)]  # ~50 tokens each: 6 decodes
    results: list[object] = []
    embedder = threading.Thread(target=lambda: results.append(engine.embed(texts)))
    beside = tokens(engine.submit(request()), on_first=embedder.start)
    embedder.join(timeout=120)

    assert beside == alone
    assert len(results) == 1 and len(results[0].vectors) == 60  # type: ignore[attr-defined]
    first, last = log.index("embed"), len(log) - 1 - log[::-1].index("embed")
    assert "gen" in log[first:last]


@pytest.mark.e2e
def test_the_default_model_matches_llama_cpp_python(engine: Engine, default_model: Path) -> None:
    """SmolLM2 (a chat model, no pooling in its file) mean-pools as llama-cpp-python's
    `Llama(embedding=True, pooling_type=MEAN)` does on the same file."""
    engine.load(tiny_settings(default_model, n_ctx=1024))
    texts = ["cat", "kitten", "tax form", "The quick brown fox jumps over the lazy dog."]
    result = engine.embed(texts)
    assert result.pooling == "mean" and result.vectors[0].shape == (576,)
    ref = reference(default_model, texts, pooling_type=LLAMA_POOLING_TYPE_MEAN)
    assert min(cosines(result.vectors, ref)) >= 0.9999
