"""Measured quality: perplexity on a text, and KL divergence against a reference run.

Perplexity follows llama.cpp's `llama-perplexity` exactly (tools/perplexity/perplexity.cpp,
`perplexity()`), so the two agree to rounding on the same model, text and context:

- the whole text is tokenized once, with the model's BOS if it adds one (`add_special`);
- it is cut into non-overlapping chunks of n_ctx tokens (a trailing partial chunk is
  dropped; at least two chunks are needed); each chunk starts from an empty KV cache, and
  its first token is replaced by BOS when the model adds one;
- only the second half of each chunk is scored (the first n_ctx/2 tokens are context):
  the logits at positions n_ctx/2 .. n_ctx-2 predict tokens n_ctx/2+1 .. n_ctx-1, so a
  chunk scores n_ctx - n_ctx/2 - 1 tokens; PPL = exp(mean negative log-likelihood).

For a 512-token context and a 4,096-token text: 8 chunks × 255 scored tokens.

The KL divergence against a reference run is `runtime.quality.kld`'s: the reference's top-k
log-probabilities exactly plus an importance sample of its tail, 1 KB per position.

    result = evaluate(Path("m.F16.gguf"), text, EvalOptions(n_ctx=256),
                      save_kld_base=Path("f16.npz"))
    quant = evaluate(Path("m.Q4_K_M.gguf"), text, kld_base=Path("f16.npz"))
    quant.ppl, quant.delta_ppl_pct, quant.kld, quant.same_top_pct
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import EvalError, KLDBaseMismatch, LoadError, ModelNotFound, TextTooShort
from runtime.gguf.constants import type_id
from runtime.llama.binding import Batch, LlamaContext, LlamaModel, llama_log
from runtime.llama.params import (
    FLASH_ATTN_AUTO,
    FLASH_ATTN_ON,
    GPU_LAYERS_ALL,
    LOAD_MODE_AUTO,
    LlamaParams,
    default_threads,
    repack_is_safe,
)
from runtime.llama.reason import first_reason
from runtime.quality.kld import (
    KLDBase,
    RefDist,
    kld_rows,
    load_base,
    log_softmax,
    save_base,
    summarize,
)
from runtime.settings.load import KV_CACHE_TYPES


def default_text() -> str:
    """The shipped evaluation text (runtime/data/eval.txt, original prose, CC0)."""
    return resources.files("runtime").joinpath("data/eval.txt").read_text(encoding="utf-8")


@dataclass(frozen=True)
class EvalOptions:
    """How to run the model for an evaluation. K/V types as in `LoadSettings`."""

    n_ctx: int = 512
    n_batch: int = 512
    type_k: str = "f16"
    type_v: str = "f16"
    n_threads: int | None = None  # None = one per physical core, as the engine (default_threads)
    gpu_layers: int | None = None  # None = llama.cpp's default
    max_chunks: int | None = None
    top_k: int = 64  # reference log-probs kept exactly per position, for the KLD
    tail_samples: int = 64  # and tokens sampled from the rest of the reference distribution

    def __post_init__(self) -> None:
        if self.n_ctx < 8 or self.n_ctx % 2:
            raise EvalError(f"the context must be an even number of tokens >= 8, not {self.n_ctx}")
        if self.n_batch < 1:
            raise EvalError(f"the batch must be at least 1 token, not {self.n_batch}")
        for name, value in (("K", self.type_k), ("V", self.type_v)):
            if value not in KV_CACHE_TYPES:
                raise EvalError(f"{name} cache type {value!r} is not one of {', '.join(KV_CACHE_TYPES)}")
        if self.max_chunks is not None and self.max_chunks < 2:
            raise EvalError("at least 2 chunks are needed (max_chunks >= 2)")
        if self.top_k < 1 or self.tail_samples < 0:
            raise EvalError("top_k must be at least 1 and tail_samples 0 or more")


@dataclass(frozen=True)
class EvalResult:
    """What one evaluation measured. KLD fields are None without a reference."""

    model: str
    n_ctx: int
    type_k: str
    type_v: str
    n_chunks: int
    n_scored: int
    ppl: float
    ppl_stderr: float
    seconds: float
    ppl_base: float | None = None
    delta_ppl_pct: float | None = None
    kld: float | None = None
    kld_stderr: float | None = None
    kld_p99: float | None = None
    same_top_pct: float | None = None
    same_top_stderr: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------
# Running the model (runtime.llama.binding, one sequence, one thread).


def eval_params(opts: EvalOptions) -> LlamaParams:
    """What llama.cpp is given for an evaluation: llama.cpp's own defaults (every layer on
    the GPU of a GPU build, its load mode, the whole sliding window) but for the context,
    one sequence, the batch as the micro-batch, the threads (`default_threads`, as the
    engine), the cache types (a quantized V needs flash attention) and weight repacking off
    where it crashes (`repack_is_safe`)."""
    n_batch = min(opts.n_batch, opts.n_ctx)
    threads = opts.n_threads if opts.n_threads is not None else default_threads()
    quantized_v = opts.type_v not in ("f16", "bf16", "f32")
    return LlamaParams(
        n_gpu_layers=opts.gpu_layers if opts.gpu_layers is not None else GPU_LAYERS_ALL,
        load_mode=LOAD_MODE_AUTO, n_ctx=opts.n_ctx, n_batch=n_batch, n_ubatch=n_batch,
        n_seq_max=1, n_threads=threads, n_threads_batch=threads,
        type_k=type_id(opts.type_k), type_v=type_id(opts.type_v),
        flash_attn=FLASH_ATTN_ON if quantized_v else FLASH_ATTN_AUTO,
        kv_unified=False, offload_kqv=True, no_perf=True, swa_full=True,
        repack=repack_is_safe())


def evaluate(model: Path, text: str, options: EvalOptions | None = None, *,
             kld_base: Path | None = None, save_kld_base: Path | None = None,
             on_progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """Perplexity of `model` on `text` (and KLD against `kld_base`, if given).

    With `kld_base`, the context size and the chunks come from the reference (as
    llama-perplexity's --kl-divergence does), and the text must tokenize to the same tokens.
    """
    opts = options or EvalOptions()
    base = load_base(kld_base) if kld_base is not None else None
    if base is not None and base.n_ctx != opts.n_ctx:
        opts = replace(opts, n_ctx=base.n_ctx)
    model = Path(model)
    if not model.is_file():
        raise ModelNotFound(f"No model file at {model}")
    started = time.perf_counter()
    params = eval_params(opts)
    loaded = LlamaModel.load(model, params)
    try:
        return _evaluate_loaded(loaded, params, text, opts, base, save_kld_base, on_progress,
                                started)
    finally:
        loaded.close()


def _evaluate_loaded(model: LlamaModel, params: LlamaParams, text: str, opts: EvalOptions,
                     base: KLDBase | None, save_to: Path | None,
                     on_progress: Callable[[int, int], None] | None,
                     started: float) -> EvalResult:
    tokens = np.array(model.tokenize(text, add_special=True, parse_special=False),
                      dtype=np.int32)
    n_ctx = opts.n_ctx
    if len(tokens) < 2 * n_ctx:
        raise TextTooShort(f"the text is {len(tokens)} tokens; a {n_ctx}-token context needs "
                           f"at least {2 * n_ctx} (use a longer text or a smaller --ctx)")
    n_chunk = len(tokens) // n_ctx
    if opts.max_chunks is not None:
        n_chunk = min(n_chunk, opts.max_chunks)
    if base is not None:
        n_chunk = len(base.tokens) // n_ctx
        if len(tokens) < n_chunk * n_ctx or not np.array_equal(tokens[:n_chunk * n_ctx], base.tokens):
            raise KLDBaseMismatch("the reference was made from another text or tokenizer; "
                                  "run both evaluations on the same text")
    try:
        ctx = LlamaContext(model, params)
    except LoadError as exc:
        raise LoadError(f"{exc} (K {opts.type_k}, V {opts.type_v})") from None
    batch = Batch(params.n_batch)
    first = n_ctx // 2
    nll: list[np.ndarray] = []
    klds: list[np.ndarray] = []
    same: list[np.ndarray] = []
    saved: list[RefDist] = []
    try:
        for c in range(n_chunk):
            chunk = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
            if model.add_bos:
                chunk[0] = model.bos
            rows = _chunk_logits(ctx, batch, chunk, first)
            logp = log_softmax(rows[:-1])  # position n_ctx-1 predicts beyond the chunk
            target = tokens[c * n_ctx + first + 1:(c + 1) * n_ctx]
            nll.append(-logp[np.arange(len(target)), target])
            if save_to is not None:
                # seeded per chunk: the same model and text give the same reference file
                saved.append(summarize(logp, opts.top_k, opts.tail_samples,
                                       np.random.default_rng(c)))
            if base is not None:
                lo, hi = c * len(target), (c + 1) * len(target)
                part = base.ref.rows(lo, hi)
                klds.append(kld_rows(part, logp))
                same.append(logp.argmax(axis=1) == part.ids[:, 0])
            if on_progress is not None:
                on_progress(c + 1, n_chunk)
    finally:
        ctx.close()

    all_nll = np.concatenate(nll)
    ppl, ppl_err = _ppl(all_nll)
    result = EvalResult(model=model.path.name, n_ctx=n_ctx, type_k=opts.type_k,
                        type_v=opts.type_v, n_chunks=n_chunk, n_scored=int(all_nll.size),
                        ppl=ppl, ppl_stderr=ppl_err, seconds=time.perf_counter() - started)
    if save_to is not None:
        save_base(save_to, tokens[:n_chunk * n_ctx], n_ctx, RefDist.concat(saved), -all_nll,
                  {"model": model.path.name, "type_k": opts.type_k, "type_v": opts.type_v,
                   "top_k": opts.top_k, "tail_samples": opts.tail_samples, "ppl": ppl,
                   "text_sha256": hashlib.sha256(text.encode()).hexdigest()})
    if base is not None:
        return _with_kld(result, base, all_nll, np.concatenate(klds), np.concatenate(same))
    return result


def _chunk_logits(ctx: LlamaContext, batch: Batch, chunk: np.ndarray, first: int) -> np.ndarray:
    """Decode one chunk from an empty cache; the logits of positions first..n_ctx-1."""
    ctx.clear()
    out: list[np.ndarray] = []
    for start in range(0, len(chunk), batch.capacity):
        end = min(start + batch.capacity, len(chunk))
        batch.clear()
        unscored = min(max(first, start), end)  # positions before `first` are context only
        batch.add_tokens(chunk[start:unscored], start, 0, logits_last=False)
        batch.add_tokens_all_logits(chunk[unscored:end], unscored, 0)
        with llama_log().capture() as captured:
            rc = ctx.decode(batch)
        if rc != 0:
            raise EvalError(f"llama_decode failed ({rc}): {first_reason(''.join(captured))}")
        if batch.n_outputs:
            out.append(ctx.logits(batch.n_outputs).copy())
    return np.concatenate(out)


def _ppl(nll: np.ndarray) -> tuple[float, float]:
    """exp(mean NLL) and its standard error, as llama-perplexity estimates it."""
    mean = float(nll.mean())
    var = float((nll.astype(np.float64) ** 2).mean()) - mean * mean
    ppl = float(np.exp(mean))
    err = float(np.sqrt(var / (nll.size - 1))) * ppl if var > 0 and nll.size > 1 else 0.0
    return ppl, err


def _with_kld(result: EvalResult, base: KLDBase, nll: np.ndarray, kld: np.ndarray,
              same: np.ndarray) -> EvalResult:
    ppl_base, _ = _ppl(-base.target_logp.astype(np.float64))
    n = kld.size
    frac = float(same.mean())
    return replace(
        result,
        ppl_base=ppl_base,
        delta_ppl_pct=100.0 * (result.ppl / ppl_base - 1.0),
        kld=float(kld.mean()),
        kld_stderr=float(kld.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
        kld_p99=float(np.percentile(kld, 99)),
        same_top_pct=100.0 * frac,
        same_top_stderr=100.0 * float(np.sqrt(frac * (1 - frac) / n)),
    )
