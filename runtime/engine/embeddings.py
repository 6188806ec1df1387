"""Embeddings: one vector per input text, pooled by llama.cpp, L2-normalised as OpenAI's are.

    embedder = Embedder(model, params)                  # at load; no llama.cpp object yet
    job = embedder.prepare(["a cat", "a kitten"])       # any thread: tokenized and checked
    embedder.add(job)                                   # the engine thread, from here on:
    while embedder.has_work():                          # (between two scheduler steps)
        embedder.step()                                 # one decode of up to `window` tokens
    job.future.result().vectors[0]                      # float32, unit length, n_embd_out

Pooling comes from the GGUF (`<arch>.pooling_type`): a file that says mean, cls or last gets
that; one that says none or nothing — a chat model such as SmolLM2, or an encoder converted
without its sentence-transformers pooling — gets mean pooling over the input's tokens. A
reranker (`rank`: its head makes scores, not vectors) and an encoder-decoder model (T5,
which llama.cpp decodes only after an encoder pass the engine never makes) are refused with
`EmbeddingsUnsupported`. Every other architecture llama.cpp builds gives its final hidden
states to the pooling layer (`llm_graph_context::build_pooling`), encoders (BERT: no KV cache,
`llama_decode` runs `llama_encode`) and decoders alike.

Where the vectors are computed: a second llama.cpp context on the same weights, made with
`embeddings = true` and the pooling above, the first time a model is asked for embeddings
(`_EmbeddingContext`). Its size: `embedding_window(n_batch, n_ctx_train)` tokens of cache,
batch and micro-batch (the load's `n_batch`, 512 by default, at most what the model was
trained on); up to 64 inputs (8 for recurrent state, which costs one state per input) and
256 tokens are packed into one decode. llama.cpp pools only within one micro-batch, so an input must fit in it whole: a
longer one is a `ContextOverflow` naming the limit, before anything runs. After each decode
the cache is emptied; nothing is kept between requests, so its K/V are always f16. Flash
attention is off in it: ggml's CPU kernel accumulates V in f16, which left SmolLM2's vector
of a 10-token input at cosine 0.9995 to llama-cpp-python's (flash attention off there);
without it, 0.99999997.

The other way — `llama_set_embeddings` toggled on the chat context between steps — was
measured against this one on SmolLM2-135M Q4_1 (64 inputs, 822 tokens, 1 thread, a busy
2-core machine; a throwaway script over `runtime.llama.binding`): the second context takes
33 ms to make, 12 MB of KV cache and ~105 MB of compute buffer (at 512 tokens; llama.cpp
also grows its output buffer to 512 rows of logits, ~100 MB, on the first full batch), and
embedded at 65 tokens/s against 57 for the toggled chat context (whose inputs had to share
the chat's 4 slots). Throughput is a wash; what decides is that the toggled way needs spare
sequence ids and free cells in the chat's cache (owned by the scheduler's slots and prefix
cache), pools in Python (the chat context was made without pooling, and pooling is fixed
when a context is made), and makes every token of a chat prefill decoded meanwhile an output
row. The separate context shares nothing with the chat but the weights.

Fairness: the engine thread runs one scheduler step, then one embedding decode (at most 256
tokens, or one input of up to `window`), then the next step, so a chat stream waits at most one embedding batch
per token while a large embeddings request is processed.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from runtime.engine.api import EmbeddingInput, Embeddings
from runtime.errors import (
    ContextOverflow,
    EmbeddingsUnsupported,
    EngineError,
    NoModelLoaded,
    OutriderError,
    SettingsError,
    shown,
)
from runtime.gguf.constants import type_id
from runtime.llama.binding import (
    POOLING_CLS,
    POOLING_LAST,
    POOLING_MEAN,
    POOLING_NONE,
    POOLING_RANK,
    Batch,
    LlamaContext,
    LlamaModel,
)
from runtime.llama.params import FLASH_ATTN_OFF, LlamaParams

logger = logging.getLogger("outrider.engine")

POOLING_NAMES = {POOLING_NONE: "none", POOLING_MEAN: "mean", POOLING_CLS: "cls",
                 POOLING_LAST: "last", POOLING_RANK: "rank"}
MAX_INPUTS = 2048  # OpenAI's own cap on one request's inputs
_SEQS_PER_DECODE = 64
_SEQS_PER_DECODE_RECURRENT = 8
# Inputs are packed into one decode up to this many tokens (one longer input goes alone):
# every token attends over every cell of the decode, its own sequence's or not (masked), so
# the attention grows with the square of the pack. SmolLM2, 1 thread, inputs of 12-45
# tokens: 110 tokens/s packing 512, 124 packing 256.
_PACK_TOKENS = 256


def pooling_for(model: LlamaModel) -> int:
    """The pooling `model`'s embeddings use (POOLING_*), or `EmbeddingsUnsupported`.

        file says mean / cls / last  → that
        file says none, or nothing   → mean (a chat model's hidden states, averaged)
        file says rank               → refused: a reranker's head scores, it does not embed
        T5-style encoder-decoder     → refused
    """
    arch = model.meta("general.architecture") or "?"
    if model.has_encoder:
        raise EmbeddingsUnsupported(
            f"{shown(arch)} models cannot make embeddings here: llama.cpp runs them as an "
            "encoder and a decoder, and Outrider pools only encoder-only (BERT-style) and "
            "decoder models")
    said = model.meta(f"{arch}.pooling_type")
    try:
        pooling = int(said) if said is not None else POOLING_NONE
    except ValueError:
        pooling = POOLING_NONE
    if pooling == POOLING_RANK:
        raise EmbeddingsUnsupported(
            f"{shown(model.path.name)} is a reranker ({shown(arch)}.pooling_type = rank): it "
            "scores query-document pairs and makes no embeddings")
    return pooling if pooling in (POOLING_MEAN, POOLING_CLS, POOLING_LAST) else POOLING_MEAN


def embedding_window(n_batch: int, n_ctx_train: int) -> int:
    """Tokens one input may have: the embedding context's cache, batch and micro-batch.

        >>> embedding_window(512, 8192), embedding_window(2048, 512), embedding_window(512, 0)
        (512, 512, 512)
    """
    return max(1, min(n_batch, n_ctx_train) if n_ctx_train > 0 else n_batch)


@dataclass
class EmbeddingJob:
    """One request on its way through the embedder; `future` gets its `Embeddings`."""

    tokens: list[list[int]]
    future: concurrent.futures.Future[Embeddings] = field(
        default_factory=concurrent.futures.Future)
    vectors: list[np.ndarray | None] = field(default_factory=list)
    next: int = 0  # the first input not yet in a decode

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.tokens)

    @property
    def queued(self) -> bool:
        return self.next < len(self.tokens)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class _EmbeddingContext:
    """The llama.cpp context embeddings are computed in, and its reusable batch."""

    def __init__(self, model: LlamaModel, params: LlamaParams, pooling: int, window: int) -> None:
        seqs = _SEQS_PER_DECODE if model.shares_prefixes else _SEQS_PER_DECODE_RECURRENT
        # The cache is emptied after every decode, so it is never worth quantizing; flash
        # attention off: ggml's CPU kernel accumulates V in f16 (cosine 0.9995 to the exact
        # vector for a 10-token input on SmolLM2, 0.99999997 without it).
        own = replace(params, n_ctx=window, n_batch=window, n_ubatch=window, n_seq_max=seqs,
                      kv_unified=True, swa_full=True, type_k=type_id("f16"),
                      type_v=type_id("f16"), flash_attn=FLASH_ATTN_OFF, notes=())
        self.ctx = LlamaContext(model, own, embeddings=True, pooling=pooling)
        self.batch = Batch(window)
        self.max_seqs = seqs

    def close(self) -> None:
        self.ctx.close()


class Embedder:
    """Embeddings for one loaded model. `prepare` runs on any thread (tokenizing only reads
    the vocabulary); `add`, `step` and `close` only on the engine thread."""

    def __init__(self, model: LlamaModel, params: LlamaParams) -> None:
        self._model = model
        self._params = params
        self._pooling: int | None = None
        self._refusal: EmbeddingsUnsupported | None = None
        try:
            self._pooling = pooling_for(model)
        except EmbeddingsUnsupported as exc:  # said to each request, the load goes on
            self._refusal = exc
        self.window = embedding_window(params.n_batch, model.n_ctx_train)
        self._jobs: deque[EmbeddingJob] = deque()
        self._context: _EmbeddingContext | None = None
        self._closed = False

    # ---- any thread ------------------------------------------------------------------------

    def prepare(self, inputs: Sequence[EmbeddingInput]) -> EmbeddingJob:
        """The job for `inputs` (texts, or token id lists used as they are), or a typed
        error: none at all, too many, an empty or too long input, a token beyond the
        vocabulary, a model that cannot embed."""
        if self._refusal is not None:
            raise self._refusal
        if not inputs:
            raise SettingsError("input: give at least one text to embed")
        if len(inputs) > MAX_INPUTS:
            raise SettingsError(f"input: at most {MAX_INPUTS} inputs per request, not {len(inputs)}")
        n_vocab = self._model.n_vocab
        tokens: list[list[int]] = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                text = item.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates
                ids = self._model.tokenize(text, add_special=True, parse_special=False)
            else:
                ids = [int(t) for t in item]
                bad = next((t for t in ids if not 0 <= t < n_vocab), None)
                if bad is not None:
                    raise SettingsError(f"input {i}: token id {bad} is not in the vocabulary "
                                        f"(0..{n_vocab - 1})")
            if not ids:
                raise SettingsError(f"input {i} is empty: there is nothing to embed")
            if len(ids) > self.window:
                raise ContextOverflow(
                    f"input {i} has {len(ids)} tokens; this model embeds at most {self.window} "
                    "tokens per input (the embedding batch: the load's n_batch, at most the "
                    "trained context)")
            tokens.append(ids)
        return EmbeddingJob(tokens)

    # ---- the engine thread -----------------------------------------------------------------

    def add(self, job: EmbeddingJob) -> None:
        if self._closed:
            job.fail(NoModelLoaded("the model was unloaded"))
            return
        self._jobs.append(job)

    def has_work(self) -> bool:
        return bool(self._jobs)

    def step(self) -> int:
        """One decode of as many queued inputs as fit; returns the tokens it embedded. Never
        raises: a failure fails the jobs whose inputs were in the decode."""
        if not self._jobs:
            return 0
        try:
            context = self._open()
        except OutriderError as exc:
            for job in self._jobs:
                job.fail(exc)
            self._jobs.clear()
            return 0
        batch = context.batch
        batch.clear()
        budget = min(self.window, _PACK_TOKENS)
        placed: list[tuple[EmbeddingJob, int]] = []
        for job in self._jobs:
            while job.queued and len(placed) < context.max_seqs:
                ids = job.tokens[job.next]
                if placed and batch.n_tokens + len(ids) > budget:
                    break
                batch.add_tokens_all_logits(ids, 0, len(placed))
                placed.append((job, job.next))
                job.next += 1
            if job.queued:
                break
        try:
            self._decode(context, placed)
        except Exception as exc:  # a llama.cpp failure: these requests end, the engine goes on
            logger.exception("embedding decode failed")
            error = exc if isinstance(exc, OutriderError) else EngineError(
                f"the engine failed computing embeddings: {type(exc).__name__}: {exc}")
            for job in {id(j): j for j, _ in placed}.values():
                job.fail(error)
        finally:
            context.ctx.clear()
        self._finish_done()
        return batch.n_tokens

    def close(self) -> None:
        """Fail what is queued and free the context (the model is being unloaded)."""
        self._closed = True
        for job in self._jobs:
            job.fail(NoModelLoaded("the model was unloaded"))
        self._jobs.clear()
        if self._context is not None:
            self._context.close()
            self._context = None

    def _open(self) -> _EmbeddingContext:
        if self._context is None:
            assert self._pooling is not None  # prepare() refused the job otherwise
            self._context = _EmbeddingContext(self._model, self._params, self._pooling,
                                              self.window)
        return self._context

    def _decode(self, context: _EmbeddingContext, placed: list[tuple[EmbeddingJob, int]]) -> None:
        rc = context.ctx.decode(context.batch)
        if rc != 0:
            raise EngineError(f"llama.cpp could not compute the embeddings (llama_decode "
                              f"returned {rc})")
        for seq_id, (job, index) in enumerate(placed):
            vector = context.ctx.embedding_seq(seq_id)
            if vector is None:
                raise EngineError("llama.cpp returned no pooled embedding")
            job.vectors[index] = normalized(vector)

    def _finish_done(self) -> None:
        while self._jobs and not self._jobs[0].queued:
            job = self._jobs.popleft()
            if job.future.done():  # failed meanwhile
                continue
            vectors = tuple(v for v in job.vectors if v is not None)
            if len(vectors) != len(job.tokens):
                job.fail(EngineError("an embedding went missing"))
                continue
            job.future.set_result(Embeddings(vectors, tuple(len(t) for t in job.tokens),
                                             POOLING_NAMES[self._pooling or POOLING_MEAN]))
        # A job failed mid-way may sit behind a running one; drop it once it is done.
        self._jobs = deque(j for j in self._jobs if not j.future.done())


def normalized(vector: np.ndarray) -> np.ndarray:
    """`vector` scaled to unit L2 length, as float32 (a zero vector stays zero).

        >>> normalized(np.array([3.0, 4.0])).tolist()
        [0.6000000238418579, 0.800000011920929]
    """
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v.astype(np.float64)))
    return v / np.float32(norm) if norm > 0 else v
