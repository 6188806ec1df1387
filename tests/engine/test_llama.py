"""The thin llama.cpp wrapper (runtime.llama.binding) on the tiny generated GGUFs."""

from __future__ import annotations

from pathlib import Path

import llama_cpp.llama_cpp as L
import numpy as np
import pytest

from runtime.errors import LoadError
from runtime.gguf.constants import GGML_TYPE_IDS
from runtime.llama.binding import Batch, LlamaContext, LlamaModel, Utf8Stream
from runtime.llama.buffers import parse_buffer_sizes
from runtime.llama.params import (
    FLASH_ATTN_AUTO,
    FLASH_ATTN_OFF,
    FLASH_ATTN_ON,
    to_llama_params,
)
from tests.engine.conftest import tiny_settings


def open_model(path: Path, **kw: object) -> tuple[LlamaModel, LlamaContext]:
    params = to_llama_params(tiny_settings(path, **kw))
    model = LlamaModel.load(path, params)
    return model, LlamaContext(model, params)


def greedy(model: LlamaModel, ctx: LlamaContext, prompt: list[int], n: int, seq: int = 0) -> list[int]:
    batch = Batch(256)
    row = batch.add_tokens(prompt, 0, seq, True)
    assert ctx.decode(batch) == 0
    out, pos = [], len(prompt)
    for _ in range(n):
        token = int(np.argmax(ctx.logits(batch.n_outputs)[row]))
        out.append(token)
        batch.clear()
        row = batch.add(token, pos, seq, True)
        pos += 1
        assert ctx.decode(batch) == 0
    return out


def test_constants_match_the_binding() -> None:
    named = 0
    for name, value in GGML_TYPE_IDS.items():  # the one table of ggml types
        attr = f"GGML_TYPE_{name}"
        if hasattr(L, attr):  # the binding lacks a few (bf16); ggml.h fixes them
            assert getattr(L, attr) == value
            named += 1
    assert named >= 20
    assert (FLASH_ATTN_AUTO, FLASH_ATTN_OFF, FLASH_ATTN_ON) == (
        L.LLAMA_FLASH_ATTN_TYPE_AUTO, L.LLAMA_FLASH_ATTN_TYPE_DISABLED, L.LLAMA_FLASH_ATTN_TYPE_ENABLED)


@pytest.mark.parametrize("fixture", ["tiny_target", "tiny_draft", "alien_draft"])
def test_tiny_fixtures_load_in_llama_cpp_and_generate_tokens(fixture: str,
                                                             request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    model, ctx = open_model(path)
    try:
        prompt = model.tokenize("<|im_start|>user\nhello there<|im_end|>\n")
        out = greedy(model, ctx, prompt, 16)
        assert len(out) == 16 and all(0 <= t < model.n_vocab for t in out)
        assert model.meta("general.architecture") == "llama"
    finally:
        ctx.close()
        model.close()


def test_metadata_and_tokens(tiny_target: Path) -> None:
    model, ctx = open_model(tiny_target)
    try:
        assert model.n_vocab == 271 and model.n_layer == 4 and model.n_embd == 128
        assert model.quant() == "all F32"
        assert model.chat_template() is not None and "im_start" in model.chat_template()  # type: ignore[operator]
        assert model.token_text(1) == "<|im_start|>"
        assert model.is_eog(2) and not model.is_eog(100)
        assert model.tokenize("<|im_start|>") == [1]
        assert len(model.tokenize("<|im_start|>", parse_special=False)) > 1
        for text in ("the cat sat", "héllo wörld ✓ 你好"):
            assert model.detokenize(model.tokenize(text)) == text
        assert ctx.n_ctx == 512 and ctx.n_seq_max == 1
    finally:
        ctx.close()
        model.close()


def test_multibyte_characters_split_over_tokens_come_out_whole(tiny_target: Path) -> None:
    model, ctx = open_model(tiny_target)
    try:
        tokens = model.tokenize("é✓")  # byte-level vocabulary: one token per byte here
        assert len(tokens) == 5
        stream = Utf8Stream()
        pieces = [stream.push(model.piece(t)) for t in tokens]
        assert pieces == ["", "é", "", "", "✓"]
        assert stream.flush() == ""
        assert model.piece(1) == b""  # control tokens render as nothing
    finally:
        ctx.close()
        model.close()


def test_a_runs_texts_from_the_cache_match_pushing_each_piece(tiny_target: Path) -> None:
    model, ctx = open_model(tiny_target)
    try:
        tokens = model.tokenize("ab é✓ cd", add_special=False)
        one_by_one = Utf8Stream()
        expected = [one_by_one.push(model.piece(t)) for t in tokens]
        assert model.texts(tokens) is None  # pieces of "é" and "✓" are parts of characters
        assert model.texts(tokens[:2]) == ["a", "b"]  # whole characters, seen before
        for split in range(len(tokens) + 1):
            at_once = Utf8Stream()
            assert at_once.push_run(model, tokens[:split]) + at_once.push_run(
                model, tokens[split:]) == expected, split
    finally:
        ctx.close()
        model.close()


def test_logits_are_a_zero_copy_view(tiny_target: Path) -> None:
    model, ctx = open_model(tiny_target)
    try:
        batch = Batch(16)
        batch.add_tokens([10, 20, 30], 0, 0, True)
        assert ctx.decode(batch) == 0
        view = ctx.logits(1)
        assert view.shape == (1, model.n_vocab) and view.dtype == np.float32
        assert not view.flags.owndata
        np.testing.assert_array_equal(view[0], ctx.logits_ith(2))
        assert np.shares_memory(view, ctx.logits(1))  # the same buffer, cached view
    finally:
        ctx.close()
        model.close()


def test_seq_cp_shares_a_prefix_and_seq_rm_rolls_back(tiny_target: Path) -> None:
    model, ctx = open_model(tiny_target, n_parallel=2)
    try:
        prompt = [5, 6, 7, 8, 9, 10]
        solo = greedy(model, ctx, prompt, 4, seq=0)
        # Share the first five positions with sequence 1, then evaluate only the last token.
        ctx.seq_rm(0, 5, -1)
        assert ctx.seq_pos_max(0) == 4
        ctx.seq_cp(0, 1, 0, 5)
        assert ctx.seq_pos_max(1) == 4
        ctx.seq_rm(0)
        assert ctx.seq_pos_max(0) == -1 and ctx.seq_pos_max(1) == 4  # shared cells survive
        batch = Batch(16)
        row = batch.add(prompt[-1], 5, 1, True)
        assert ctx.decode(batch) == 0
        first = int(np.argmax(ctx.logits(batch.n_outputs)[row]))
        assert first == solo[0]
    finally:
        ctx.close()
        model.close()


def test_batch_overflow_is_refused() -> None:
    batch = Batch(4)
    with pytest.raises(ValueError, match="overflow"):
        batch.add_tokens([1, 2, 3, 4, 5], 0, 0, True)


def test_load_reports_progress_and_buffer_sizes_without_stderr(
        tiny_target: Path, capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[float] = []
    params = to_llama_params(tiny_settings(tiny_target))
    model = LlamaModel.load(tiny_target, params, on_progress=lambda f: seen.append(f) or True)
    ctx = LlamaContext(model, params)
    try:
        assert seen and seen[-1] == 1.0 and seen == sorted(seen)
        sizes = parse_buffer_sizes(model.load_log + ctx.init_log)
        assert any(k.endswith(" KV") for k in sizes) and any(k.endswith(" model") for k in sizes)
    finally:
        ctx.close()
        model.close()
    assert capfd.readouterr().err == ""  # llama.cpp's chatter goes to the log, not stderr


def test_progress_listener_can_abort_the_load(tiny_target: Path) -> None:
    params = to_llama_params(tiny_settings(tiny_target))
    with pytest.raises(LoadError):
        LlamaModel.load(tiny_target, params, on_progress=lambda f: False)


def test_a_file_llama_cpp_refuses_is_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model")
    with pytest.raises(LoadError, match=r"notes\.gguf"):
        LlamaModel.load(bad, to_llama_params(tiny_settings(bad)))
