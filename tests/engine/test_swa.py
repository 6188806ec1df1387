"""Sliding-window caches at their true size (llama.cpp's `swa_full` off), still exact.

The fixture is a tiny `gemma3` model: 6 layers, layers 0-4 on a 32-token window. With a
64-token micro-batch and 1-4 slots its window layers keep 256 cells, so prompts of a few
hundred tokens make llama.cpp reuse window cells — the case where rolling back drafts and
reusing prefixes could read cells that are gone. Drafting uses the window cache too, each
decode one micro-batch (runtime.planner.plan.decode_batch says why that keeps it exact; with
n_batch 512 over n_ubatch 64 the distribution test below fails with p = 0).

llama-server is not built here: "what llama-server allocates" is the KV buffer the same
libllama logs when given llama-server's context parameters (tools/server: swa_full false,
kv_unified true as `-np auto` sets it, n_batch 2048, n_ubatch 512, f16 K/V).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as L
import numpy as np
import pytest

from runtime.engine.engine import Engine
from runtime.engine.kv_slots import KvSlots
from runtime.events import Finished, GenerationRequest, SamplingParams, StepStats, TokenEvent
from runtime.gguf.info import read_model_info
from runtime.llama.binding import LlamaContext, LlamaModel, llama_log
from runtime.llama.buffers import buffer_totals, parse_buffer_sizes
from runtime.llama.params import to_llama_params
from runtime.planner.devices import Device
from runtime.planner.plan import plan_memory
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.speculation import Speculation
from tests.conftest import tiny_model_path
from tests.engine.conftest import tiny_settings
from tests.engine.test_losslessness_engine import chi_square_p, exact_joint
from tests.fixtures.tiny_gguf import SWA_TARGET

# "llama_kv_cache: size =    0.50 MiB (  2048 cells,   1 layers,  4/1 seqs), K (f16): ..."
_CACHE_LINE = re.compile(r"llama_kv_cache: size = .*?\(\s*(\d+) cells,\s*(\d+) layers")
BYTES_PER_CELL_LAYER = 2 * 32 * 2 * 2  # 2 KV heads of 32, f16, K and V


@pytest.fixture(scope="module")
def swa_model() -> Path:
    return tiny_model_path(SWA_TARGET)


def swa_settings(path: Path, **kw: Any) -> LoadSettings:
    """An F32 cache (see test_losslessness_engine.settings_for) and a 64-token micro-batch:
    the window layers then keep 32·n_parallel + 64 cells, padded to 256."""
    base: dict[str, Any] = {"n_ctx": 1024, "n_ubatch": 64, "type_k": "f32", "type_v": "f32",
                            "flash_attn": "off"}
    base.update(kw)
    return tiny_settings(path, **base)


def cache_shapes(log: str) -> list[tuple[int, int]]:
    """(cells, layers) of each KV cache llama.cpp created (non-SWA first, then SWA)."""
    return [(int(c), int(n)) for c, n in _CACHE_LINE.findall(log)]


def server_style_kv_log(model: LlamaModel, n_ctx: int, n_parallel: int) -> str:
    """What llama.cpp logs for a context made with llama-server's parameters."""
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 2048, 512, n_parallel
    cp.n_threads = cp.n_threads_batch = 1
    cp.swa_full, cp.kv_unified = False, True
    cp.type_k = cp.type_v = 1  # f16
    with llama_log().capture() as captured:
        ptr = L.llama_init_from_model(model.ptr, cp)
    assert ptr
    L.llama_free(ptr)
    return "".join(captured)


# ---- the size -------------------------------------------------------------------------------

@pytest.mark.parametrize("n_ctx", [512, 2048, 8192])
def test_kv_bytes_equal_llama_servers_and_the_plan(swa_model: Path, n_ctx: int) -> None:
    settings = LoadSettings(model_path=swa_model, n_ctx=n_ctx, n_threads=1, n_parallel=4,
                            n_batch=2048)
    params = to_llama_params(settings, 0)
    model = LlamaModel.load(swa_model, params)
    try:
        ctx = LlamaContext(model, params)
        ours = ctx.init_log
        ctx.close()
        theirs = server_style_kv_log(model, n_ctx, 4)
    finally:
        model.close()
    swa_cells = min(n_ctx, 768)  # 32 · 4 slots + 512, padded to 256
    assert cache_shapes(ours) == cache_shapes(theirs) == [(n_ctx, 1), (swa_cells, 5)]
    logged = buffer_totals(parse_buffer_sizes(ours))["kv"]
    assert logged == buffer_totals(parse_buffer_sizes(theirs))["kv"]
    exact = (n_ctx + 5 * swa_cells) * BYTES_PER_CELL_LAYER
    assert abs(logged - exact) <= 2 * 5243  # two buffers logged in MiB with two decimals

    plan = plan_memory(read_model_info(swa_model), settings,
                       [Device("cpu", "test CPU", "cpu", 64 << 30, 64 << 30)])
    # Exact against the cells and layers llama.cpp logs (its MiB figures are rounded, by
    # more than 1% at these tiny sizes).
    assert plan.kv == exact
    assert (plan.swa_layers, plan.swa_cells, plan.n_blocks) == ((5, 768, 6) if n_ctx > 768
                                                               else (0, 0, 6))


def test_drafting_keeps_the_window_cache_with_one_micro_batch_per_decode(
        swa_model: Path) -> None:
    """Drafting loads the window cache at its true size, its batch cut to the micro-batch
    (runtime.planner.plan.decode_batch); the planner says the same."""
    settings = LoadSettings(model_path=swa_model, n_ctx=8192, n_threads=1, n_batch=2048,
                            n_ubatch=512, draft=DraftSettings(kind="ngram"))
    params = to_llama_params(settings, 0)
    assert not params.swa_full and (params.n_batch, params.n_ubatch) == (512, 512)
    assert any("batch size 512 (the micro-batch) instead of 2048 while drafting" in note
               for note in params.notes)
    plain = to_llama_params(dataclasses.replace(settings, draft=DraftSettings()), 0,
                            repack=True)  # an AMX machine adds its own note
    assert (plain.n_batch, plain.notes) == (2048, ())
    model = LlamaModel.load(swa_model, params)
    try:
        ctx = LlamaContext(model, params)
        assert (ctx.swa_window, ctx.n_batch) == (32, 512)
        assert cache_shapes(ctx.init_log) == [(8192, 1), (768, 5)]  # 32 + 512, padded
        ctx.close()
    finally:
        model.close()
    plan = plan_memory(read_model_info(swa_model), settings,
                       [Device("cpu", "test CPU", "cpu", 64 << 30, 64 << 30)])
    assert plan.kv == (8192 + 5 * 768) * BYTES_PER_CELL_LAYER and plan.swa_layers == 5


# ---- the slot table's window check ------------------------------------------------------------

class _Memory:
    def __init__(self, pos_min: int) -> None:
        self.pos_min = pos_min

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        pass

    def seq_pos_min(self, seq_id: int) -> int:
        return self.pos_min


def test_a_prefix_is_shared_only_while_its_window_is_held() -> None:
    memory = _Memory(pos_min=240)  # slot 0 holds 0..299, its window layers 240..299
    kv = KvSlots(memory, 2, 1024, window=32)
    held = list(range(300))
    kv.append(0, held)
    kv.release(0, keep=True)
    assert kv.best_match([*held[:280], 7, 7]) == (0, 280)  # needs 249..279
    assert kv.best_match([*held[:271], 7]) == (0, 271)  # needs exactly 240..270
    assert kv.best_match([*held[:270], 7]) == (-1, 0)  # needs 239: dropped
    assert kv.acquire([*held[:100], 7]) == (1, 0)  # computed again, in the empty slot
    assert KvSlots(memory, 2, 1024).window_held(0, 100)  # no window: everything is held


# ---- through the engine -----------------------------------------------------------------------

def _generate(engine: Engine, prompt: Sequence[int], sampling: SamplingParams,
              ) -> tuple[list[int], Finished]:
    tokens: list[int] = []
    finished = None
    for event in engine.submit(GenerationRequest(prompt=tuple(prompt), sampling=sampling)
                               ).events(timeout=120):
        if isinstance(event, TokenEvent):
            tokens.append(event.token_id)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return tokens, finished


def _prompt(seed: int, n: int) -> list[int]:
    """Byte tokens of a text with repeats (prompt lookup finds n-grams in it)."""
    words = [b"the cat ", b"sat on ", b"a mat ", b"and then ", b"it ran "]
    rng = np.random.default_rng(seed)
    text = b"".join(words[i] for i in rng.integers(0, len(words), n))
    return [3 + b for b in text[:n]]  # byte b is token 3 + b (specials first)


GREEDY = SamplingParams(temperature=0.0, max_tokens=160, ignore_eos=True)
LOOKUP = DraftSettings(kind="ngram", k=4, ngram_min=1, ngram_max=3)


def test_speculative_decoding_is_token_identical_at_t0(swa_model: Path) -> None:
    """Two requests at once (one in its prompt while the other verifies drafts), each
    ending ~200 tokens past the 256 cells the window layers keep: drafting (one micro-batch
    per decode) gives the same tokens as plain decoding (n_batch 512)."""
    prompts = [_prompt(1, 220), _prompt(2, 180)]
    results: dict[bool, list[list[int]]] = {}
    drafted = accepted = 0
    for speculate in (False, True):
        engine = Engine(speculation=Speculation() if speculate else None)
        try:
            engine.load(swa_settings(swa_model, n_parallel=2,
                                     draft=LOOKUP if speculate else DraftSettings()))
            handles = [engine.submit(GenerationRequest(prompt=tuple(p), sampling=GREEDY))
                       for p in prompts]
            outs = []
            for handle in handles:
                tokens = []
                for event in handle.events(timeout=120):
                    if isinstance(event, TokenEvent):
                        tokens.append(event.token_id)
                    elif isinstance(event, Finished) and event.speculative is not None:
                        drafted += event.speculative.drafted
                        accepted += event.speculative.accepted
                outs.append(tokens)
            results[speculate] = outs
        finally:
            engine.stop()
    assert results[True] == results[False]
    assert all(len(t) == GREEDY.max_tokens for t in results[True])
    assert 0 < accepted < drafted  # drafts were accepted and rolled back


def _exact_joint(path: Path, prompt: Sequence[int], params: SamplingParams,
                 n_tokens: int) -> dict[tuple[int, ...], float]:
    """P(t1..tn) under plain sampling, every prefix evaluated alone in a full-size cache."""
    lp = dataclasses.replace(to_llama_params(swa_settings(path), 0), swa_full=True)
    return exact_joint(path, prompt, params, n_tokens, lp=lp, batch_size=1024)


def test_speculative_sampling_keeps_the_distribution(swa_model: Path) -> None:
    """T > 0, a 300-token prompt, 4 slots, the window cache: the samples follow the exact
    joint distribution. (With n_batch 512 over the 64-token micro-batch instead of one
    micro-batch per decode, it draws samples of probability 0: see decode_batch.)"""
    n, n_tokens = 250, 4
    sampling = SamplingParams(temperature=0.9, top_k=3, top_p=0.95, max_tokens=n_tokens,
                              ignore_eos=True, seed=7)
    # The model's own greedy text quoted after the prompt: prompt lookup guesses from it.
    base = _prompt(3, 250)
    (greedy,) = _exact_joint(swa_model, base, SamplingParams(temperature=0.0), 50)
    prompt = [*base, *greedy]
    exact = _exact_joint(swa_model, prompt, sampling, n_tokens)
    engine = Engine(speculation=Speculation())
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    try:
        engine.load(swa_settings(swa_model, n_parallel=4,
                                 draft=DraftSettings(kind="ngram", k=2, ngram_min=1,
                                                     ngram_max=3)))
        tokens: dict[int, list[int]] = {i: [] for i in range(n)}
        request = GenerationRequest(prompt=tuple(prompt), sampling=sampling, n=n)
        for event in engine.submit(request).events(timeout=300):
            if isinstance(event, TokenEvent):
                tokens[event.index].append(event.token_id)
            elif isinstance(event, Finished):
                if event.speculative is not None:
                    drafted += event.speculative.drafted
                    accepted += event.speculative.accepted
            else:
                assert isinstance(event, StepStats), event
        counts.update(tuple(t) for t in tokens.values())
    finally:
        engine.stop()
    assert 0 < accepted < drafted
    assert chi_square_p(counts, exact) > 1e-3


def test_plain_sampling_in_the_window_cache_keeps_the_distribution(swa_model: Path) -> None:
    """The window cache itself at T > 0: 4 slots through 256 window cells (an idle slot's
    prefix reused only where its window is held), against the full-size exact distribution."""
    n, n_tokens = 250, 4
    sampling = SamplingParams(temperature=0.9, top_k=3, top_p=0.95, max_tokens=n_tokens,
                              ignore_eos=True, seed=8)
    prompt = _prompt(7, 300)
    exact = _exact_joint(swa_model, prompt, sampling, n_tokens)
    engine = Engine()
    tokens: dict[int, list[int]] = {i: [] for i in range(n)}
    try:
        engine.load(swa_settings(swa_model, n_parallel=4))
        request = GenerationRequest(prompt=tuple(prompt), sampling=sampling, n=n)
        for event in engine.submit(request).events(timeout=300):
            if isinstance(event, TokenEvent):
                tokens[event.index].append(event.token_id)
    finally:
        engine.stop()
    assert chi_square_p(Counter(tuple(t) for t in tokens.values()), exact) > 1e-3


def test_prefix_sharing_reuses_held_windows_and_recomputes_dropped_ones(swa_model: Path) -> None:
    first = _prompt(4, 200)
    short = [*first[:100], *_prompt(5, 20)]  # shares 100 tokens whose window is long gone
    engine = Engine()
    try:
        engine.load(swa_settings(swa_model))
        out, _ = _generate(engine, first, GREEDY)  # 360 tokens through 256 window cells
        longer = [*first, *out, *_prompt(6, 20)]  # shares all 360: the window is held
        warm_long, done_long = _generate(engine, longer, GREEDY)
        warm_short, done_short = _generate(engine, short, GREEDY)
    finally:
        engine.stop()
    assert done_long.usage.cached_tokens == len(first) + len(out) - 1  # the last one is redone
    assert done_short.usage.cached_tokens == 0
    cold = Engine()
    try:
        cold.load(swa_settings(swa_model))
        assert _generate(cold, longer, GREEDY)[0] == warm_long
        cold.unload()
        cold.load(swa_settings(swa_model))
        assert _generate(cold, short, GREEDY)[0] == warm_short
    finally:
        cold.stop()
