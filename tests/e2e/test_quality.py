"""Quantize and evaluate the real default model (SmolLM2-135M-Instruct Q4_1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.errors import RequantizeRefused
from runtime.quality.evaluate import EvalOptions, default_text, evaluate
from runtime.quality.quantize import QuantRecipe, RequantizeWarning, quantize, read_tensor_types

pytestmark = pytest.mark.e2e

# `llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f runtime/data/eval.txt -c 128
#  --chunks 4` (llama.cpp 0c1e570, CPU): "Final estimate: PPL = 26.2517 +/- 4.59084".
LLAMA_PERPLEXITY_Q4_1_CTX128_4 = 26.2517


def test_perplexity_matches_llama_perplexity(default_model: Path) -> None:
    result = evaluate(default_model, default_text(), EvalOptions(n_ctx=128, max_chunks=4))
    assert result.n_scored == 4 * 63
    assert result.ppl == pytest.approx(LLAMA_PERPLEXITY_Q4_1_CTX128_4, rel=0.005)


def test_requantizing_the_default_model(default_model: Path, tmp_path: Path) -> None:
    with pytest.raises(RequantizeRefused, match="Q4_1"):
        quantize(default_model, tmp_path / "x.gguf", QuantRecipe("Q8_0"))
    with pytest.warns(RequantizeWarning):
        out = quantize(default_model, tmp_path / "smol.Q4_K_M.gguf",
                       QuantRecipe("Q4_K_M", edge_layers=(2, "Q8_0"), allow_requantize=True))
    types = read_tensor_types(out)
    assert types["blk.0.attn_q.weight"] == types["blk.29.ffn_up.weight"] == "Q8_0"
    # 576-wide rows cannot hold 256-value k-quant blocks: llama.cpp falls back to Q5_0
    assert types["blk.10.attn_q.weight"] == "Q5_0"
    assert types["blk.10.ffn_down.weight"] in ("Q4_K", "Q6_K")  # 1536-wide rows can
