"""Quantizing the tiny F32 fixture for real: the types land where the recipe says, the
result loads and generates, requantizing needs the flag, cancel and failure leave nothing.

k-quants need rows divisible by 256 and the tiny model is 128 wide, so llama.cpp would
fall back; only the 32-block types are asserted here (k-quant recipes are measured on
SmolLM2 in benchmarks/quality_table.py).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from runtime.errors import ImatrixError, QuantizeCancelled, QuantizeError, RequantizeRefused
from runtime.quality.imatrix import load_imatrix, write_imatrix
from runtime.quality.quantize import (
    QuantProgress,
    QuantRecipe,
    RequantizeWarning,
    quantize,
    read_tensor_types,
)
from tests.fixtures.reference_llama import model_params

WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    """Load with llama.cpp's low-level API and generate n tokens greedily."""
    import llama_cpp.llama_cpp as L

    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), model_params())
    assert model, f"llama.cpp could not load {path}"
    cparams = L.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_threads, cparams.n_threads_batch = 64, 64, 1, 1
    ctx = L.llama_init_from_model(model, cparams)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out: list[int] = []
    try:
        tokens = list(prompt)
        for _ in range(n):
            arr = (L.llama_token * len(tokens))(*tokens)
            batch = L.llama_batch_get_one(arr, len(tokens))
            assert L.llama_decode(ctx, batch) == 0
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            assert np.isfinite(logits).all()
            tokens = [int(logits.argmax())]
            out.append(tokens[0])
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)
    return out


@pytest.fixture(scope="module")
def made(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Q8_0, Q4_0 and a mixed recipe, made once for the module."""
    folder = tmp_path_factory.mktemp("quants")
    return {
        "Q8_0": quantize(tiny_target, folder / "t.Q8_0.gguf", QuantRecipe("Q8_0")),
        "Q4_0": quantize(tiny_target, folder / "t.Q4_0.gguf", QuantRecipe("Q4_0")),
        "mixed": quantize(tiny_target, folder / "t.Q4_0-mixed.gguf", QuantRecipe(
            "Q4_0", embeddings="Q8_0", output="F16", edge_layers=(1, "Q5_1"),
            overrides=(("attn_v", "Q5_0"),))),
    }


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_every_block_weight_gets_the_type(made: dict[str, Path], kind: str) -> None:
    types = read_tensor_types(made[kind])
    for i in range(4):
        for w in WEIGHTS:
            assert types[f"blk.{i}.{w}.weight"] == kind
        assert types[f"blk.{i}.attn_norm.weight"] == "F32"  # 1-D tensors stay F32
    assert types["token_embd.weight"] == kind
    # llama.cpp's mixture keeps output at Q6_K, which 128-wide rows cannot hold -> Q8_0
    assert types["output.weight"] == "Q8_0"


def test_recipe_types_land_where_asked(made: dict[str, Path]) -> None:
    types = read_tensor_types(made["mixed"])
    assert types["token_embd.weight"] == "Q8_0"
    assert types["output.weight"] == "F16"
    for i in range(4):
        assert types[f"blk.{i}.attn_v.weight"] == "Q5_0"  # the override wins everywhere
        rest = "Q5_1" if i in (0, 3) else "Q4_0"  # first and last block higher
        for w in WEIGHTS:
            if w != "attn_v":
                assert types[f"blk.{i}.{w}.weight"] == rest, (i, w)


def test_quantized_files_load_and_generate(made: dict[str, Path], tiny_target: Path) -> None:
    prompt = [3 + b for b in b"the cat sat"]  # byte tokens follow the 3 specials
    reference = greedy(tiny_target, prompt, 8)
    for path in made.values():
        out = greedy(path, prompt, 8)
        assert len(out) == 8
    # Q8_0 of a random model is close enough to F32 to start the same way
    assert greedy(made["Q8_0"], prompt, 1) == reference[:1]


def test_smaller_types_make_smaller_files(made: dict[str, Path], tiny_target: Path) -> None:
    sizes = {k: p.stat().st_size for k, p in made.items()}
    assert sizes["Q4_0"] < sizes["Q8_0"] < tiny_target.stat().st_size


def test_progress_counts_every_tensor(tiny_target: Path, tmp_path: Path) -> None:
    seen: list[QuantProgress] = []
    quantize(tiny_target, tmp_path / "p.gguf", QuantRecipe("Q5_0"), on_progress=seen.append)
    n = len(read_tensor_types(tiny_target))
    assert [p.done for p in seen] == list(range(1, n + 1))
    assert {p.total for p in seen} == {n} and seen[-1].fraction == 1.0
    assert {p.tensor for p in seen} == set(read_tensor_types(tiny_target))


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_result_has_the_users_normal_file_mode(tiny_target: Path, tmp_path: Path,
                                                   umask: int) -> None:
    """0o666 & ~umask, like any file the user makes — not a temporary file's private 0o600."""
    old = os.umask(umask)
    try:
        out = quantize(tiny_target, tmp_path / "m.gguf", QuantRecipe("Q8_0"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_requantize_is_refused_without_the_flag(made: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(RequantizeRefused, match=r"already quantized .*--allow-requantize"):
        quantize(made["Q8_0"], tmp_path / "again.gguf", QuantRecipe("Q4_0"))
    assert list(tmp_path.iterdir()) == []


def test_requantize_with_the_flag_warns_and_works(made: dict[str, Path], tmp_path: Path) -> None:
    with pytest.warns(RequantizeWarning, match="already quantized"):
        out = quantize(made["Q8_0"], tmp_path / "again.gguf",
                       QuantRecipe("Q4_0", allow_requantize=True))
    assert read_tensor_types(out)["blk.1.attn_q.weight"] == "Q4_0"


def test_cancel_mid_run_leaves_nothing(tiny_target: Path, tmp_path: Path) -> None:
    cancel = threading.Event()

    def on_progress(p: QuantProgress) -> None:
        cancel.set()  # at the first tensor

    with pytest.raises(QuantizeCancelled):
        quantize(tiny_target, tmp_path / "c.gguf", QuantRecipe("Q4_0"),
                 on_progress=on_progress, cancel_event=cancel)
    assert list(tmp_path.iterdir()) == []


def test_llama_cpp_failure_is_typed_and_leaves_nothing(tiny_target: Path, tmp_path: Path) -> None:
    with pytest.raises(ImatrixError, match="requires an imatrix"):
        quantize(tiny_target, tmp_path / "iq.gguf", QuantRecipe("IQ2_XXS"))
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_not_overwritten(tiny_target: Path, tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"keep me")
    with pytest.raises(QuantizeError, match="already exists"):
        quantize(tiny_target, tmp_path / "x.gguf", QuantRecipe("Q4_0"))
    assert (tmp_path / "x.gguf").read_bytes() == b"keep me"


def _tensor_bytes(path: Path, name: str) -> bytes:
    import gguf

    reader = gguf.GGUFReader(str(path))
    return next(bytes(t.data.tobytes()) for t in reader.tensors if t.name == name)


def test_imatrix_is_handed_to_llama_cpp(tiny_target: Path, tmp_path: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(str(tiny_target))
    rng = np.random.default_rng(0)
    # importance per input column (ne[0]) of every 2-D weight
    entries = {t.name: rng.uniform(0.01, 100.0, int(t.shape[0])).astype(np.float32)
               for t in reader.tensors if len(t.shape) == 2 and t.name.startswith("blk.")}
    imatrix = write_imatrix(tmp_path / "imatrix.gguf", entries, counts=10.0)
    assert np.allclose(load_imatrix(imatrix).entries["blk.0.attn_q.weight"],
                       entries["blk.0.attn_q.weight"])

    plain = quantize(tiny_target, tmp_path / "plain.gguf", QuantRecipe("Q4_0"))
    weighted = quantize(tiny_target, tmp_path / "weighted.gguf",
                        QuantRecipe("Q4_0", imatrix=imatrix))
    name = "blk.0.attn_q.weight"
    assert _tensor_bytes(plain, name) != _tensor_bytes(weighted, name)
    fields = gguf.GGUFReader(str(weighted)).fields
    assert fields["quantize.imatrix.entries_count"].contents() == len(entries)


def test_imatrix_of_another_model_is_refused(tiny_target: Path, tmp_path: Path) -> None:
    wrong = write_imatrix(tmp_path / "wrong.gguf", {"blk.0.attn_q.weight": np.ones(7, np.float32)})
    with pytest.raises(ImatrixError, match="imatrix size"):
        quantize(tiny_target, tmp_path / "w.gguf", QuantRecipe("Q4_0", imatrix=wrong))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wrong.gguf"]


def test_worker_protocol_round_trips_a_plan(tmp_path: Path) -> None:
    from runtime.quality.quantize import plan_from_json, plan_quantization, plan_to_json

    plan = plan_quantization(QuantRecipe("Q4_0", embeddings="Q8_0", edge_layers=(1, "Q8_0"),
                                         imatrix=tmp_path / "m.gguf"), ["blk.0.x", "blk.3.x"])
    src, dst, back = plan_from_json(plan_to_json(Path("/a.gguf"), Path("/b.gguf"), plan))
    assert (src, dst) == ("/a.gguf", "/b.gguf")
    assert back == plan


def test_cli_quantize_makes_the_file_and_refuses_requantize(
        tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.cli.main import main

    out = tmp_path / "cli.gguf"
    assert main(["quantize", str(tiny_target), "--type", "q4_0", "--embeddings-type", "Q8_0",
                 "--edge-layers", "1:Q8_0", "--override", "ffn_down=Q5_0", "-o", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    types = read_tensor_types(out)
    assert (types["token_embd.weight"], types["blk.0.attn_q.weight"],
            types["blk.1.attn_q.weight"], types["blk.2.ffn_down.weight"]) == (
        "Q8_0", "Q8_0", "Q4_0", "Q5_0")
    assert main(["quantize", str(out), "--type", "Q4_0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--allow-requantize" in err and err.count("\n") == 1
    assert main(["quantize", str(out), "--type", "Q8_0", "--allow-requantize"]) == 0
    assert "warning: " in capsys.readouterr().err
    assert (tmp_path / "cli.Q8_0.gguf").is_file()  # default name: beside the source
