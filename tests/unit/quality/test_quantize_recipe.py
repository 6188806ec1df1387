"""The recipe → llama.cpp parameters step, pure: asserted by what it returns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.errors import ImatrixError, QuantizeError
from runtime.quality.imatrix import load_imatrix, normalise
from runtime.quality.quantize import (
    FTYPES,
    STORAGE_TYPE_IDS,
    QuantRecipe,
    block_count,
    default_output_path,
    parse_edge_layers,
    parse_override,
    plan_quantization,
    quantized_weights,
    recipe_to_tensor_types,
)


def names(n_layer: int) -> list[str]:
    out = ["token_embd.weight", "output_norm.weight", "output.weight"]
    for i in range(n_layer):
        out += [f"blk.{i}.attn_q.weight", f"blk.{i}.attn_v.weight", f"blk.{i}.ffn_down.weight",
                f"blk.{i}.attn_norm.weight"]
    return out


def test_plain_recipe_has_no_patterns() -> None:
    assert recipe_to_tensor_types(QuantRecipe("Q4_K_M"), names(30)) == {}


def test_edge_layers_name_the_first_and_last_blocks() -> None:
    recipe = QuantRecipe("q4_k_m", edge_layers=(2, "q6_k"))
    assert recipe_to_tensor_types(recipe, names(30)) == {r"^blk\.(0|1|28|29)\.": "Q6_K"}


def test_edge_layers_covering_the_whole_model_name_each_block_once() -> None:
    recipe = QuantRecipe("Q4_0", edge_layers=(3, "Q8_0"))
    assert recipe_to_tensor_types(recipe, names(4)) == {r"^blk\.(0|1|2|3)\.": "Q8_0"}


def test_user_overrides_come_before_edge_layers_in_given_order() -> None:
    recipe = QuantRecipe("Q4_K_M", edge_layers=(1, "Q6_K"),
                         overrides=(("attn_v", "Q8_0"), (r"ffn_down", "q5_k")))
    types = recipe_to_tensor_types(recipe, names(10))
    assert list(types.items()) == [("attn_v", "Q8_0"), ("ffn_down", "Q5_K"),
                                   (r"^blk\.(0|9)\.", "Q6_K")]


def test_edge_layers_need_blocks() -> None:
    with pytest.raises(QuantizeError, match=r"no blk\.N tensors"):
        recipe_to_tensor_types(QuantRecipe("Q4_0", edge_layers=(1, "Q8_0")), ["token_embd.weight"])


def test_plan_carries_ids_for_llama_cpp() -> None:
    recipe = QuantRecipe("Q4_K_M", embeddings="Q8_0", output="F16", edge_layers=(2, "Q6_K"),
                         overrides=(("attn_v", "Q6_K"),), allow_requantize=True, n_threads=3)
    plan = plan_quantization(recipe, names(30))
    assert plan.ftype == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert plan.token_embedding_type == 8  # GGML_TYPE_Q8_0
    assert plan.output_tensor_type == 1  # GGML_TYPE_F16
    assert plan.tensor_types == (("attn_v", 14), (r"^blk\.(0|1|28|29)\.", 14))  # Q6_K
    assert plan.allow_requantize and plan.n_threads == 3


def test_plan_leaves_embeddings_and_output_to_the_mixture_by_default() -> None:
    plan = plan_quantization(QuantRecipe("Q8_0"), names(2))
    assert (plan.ftype, plan.token_embedding_type, plan.output_tensor_type) == (7, None, None)


def test_type_tables_agree_with_llama_h() -> None:
    assert FTYPES["Q4_0"] == 2 and FTYPES["Q8_0"] == 7 and FTYPES["Q2_K"] == 10
    assert FTYPES["Q4_K"] == FTYPES["Q4_K_M"] == 15 and FTYPES["IQ4_XS"] == 30
    assert STORAGE_TYPE_IDS["Q4_K"] == 12 and STORAGE_TYPE_IDS["BF16"] == 30
    assert "Q8_K" not in STORAGE_TYPE_IDS  # a scratch type, not a storage type


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ftype": "Q4_Z"}, "not a quant level"),
    ({"ftype": "Q4_0", "embeddings": "Q9"}, "embeddings type"),
    ({"ftype": "Q4_0", "edge_layers": (0, "Q8_0")}, "1 or more"),
    ({"ftype": "Q4_0", "overrides": (("attn_v[", "Q8_0"),)}, "not a regex"),
    ({"ftype": "F16", "overrides": (("attn_v", "Q8_0"),)}, "need a quantized --type"),
    ({"ftype": "Q4_0", "n_threads": -1}, "threads"),
])
def test_bad_recipes_are_refused_with_a_message(kwargs: dict, message: str) -> None:
    with pytest.raises(QuantizeError, match=message):
        QuantRecipe(**kwargs)


def test_parse_override_and_edge_layers() -> None:
    assert parse_override("attn_v=q6_k") == ("attn_v", "Q6_K")
    assert parse_override(r"blk\.(1|2)\.ffn_down=Q8_0") == (r"blk\.(1|2)\.ffn_down", "Q8_0")
    assert parse_edge_layers("2:Q6_K") == (2, "Q6_K")
    with pytest.raises(QuantizeError, match="PATTERN=TYPE"):
        parse_override("attn_v")
    with pytest.raises(QuantizeError, match="N:TYPE"):
        parse_edge_layers("two:Q6_K")


def test_block_count() -> None:
    assert block_count(names(30)) == 30
    assert block_count(["token_embd.weight"]) == 0


def test_quantized_weights_ignores_float_tensors() -> None:
    types = {"a": "F32", "b": "F16", "c": "Q4_1", "d": "BF16", "e": "Q8_0"}
    assert quantized_weights(types) == {"c": "Q4_1", "e": "Q8_0"}


def test_default_output_path_swaps_the_quant_name() -> None:
    src = Path("/lib/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert default_output_path(src, "Q8_0") == Path("/lib/SmolLM2-135M-Instruct.Q8_0.gguf")
    assert default_output_path(src, "Q4_K_M", mixed=True) == Path(
        "/lib/SmolLM2-135M-Instruct.Q4_K_M-mixed.gguf")
    assert default_output_path(Path("m-f16.gguf"), "Q6_K") == Path("m.Q6_K.gguf")
    assert default_output_path(Path("model.gguf"), "Q6_K") == Path("model.Q6_K.gguf")


def test_imatrix_normalise_divides_by_count_per_expert() -> None:
    sums = np.array([4, 8, 3, 3, 5, 5], np.float32)
    got = normalise(sums, np.array([2, 0, 5], np.float32))
    assert got.tolist() == [2.0, 4.0, 1.0, 1.0, 1.0, 1.0]


def test_legacy_imatrix_is_read_as_llama_cpp_reads_it(tmp_path: Path) -> None:
    import struct

    values = np.array([2.0, 4.0, 6.0], np.float32)
    name = b"blk.0.attn_q.weight"
    raw = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name
    raw += struct.pack("<ii", 2, 3) + values.tobytes()
    raw += struct.pack("<i", 7) + struct.pack("<i", 4) + b"wiki"
    path = tmp_path / "m.dat"
    path.write_bytes(raw)
    matrix = load_imatrix(path)
    assert matrix.legacy and matrix.chunk_count == 7 and matrix.datasets == ("wiki",)
    assert matrix.entries["blk.0.attn_q.weight"].tolist() == [1.0, 2.0, 3.0]


def test_garbage_is_not_an_imatrix(tmp_path: Path) -> None:
    path = tmp_path / "x.dat"
    path.write_bytes(b"\xff\xff\xff\xff nonsense")
    with pytest.raises(ImatrixError):
        load_imatrix(path)


def test_embeddings_and_output_types_must_fit_the_rows() -> None:
    from runtime.quality.quantize import check_row_sizes

    rows = {"token_embd.weight": 576, "output.weight": 576, "blk.0.attn_q.weight": 576}
    check_row_sizes(QuantRecipe("Q4_K_M", embeddings="Q8_0", output="F16"), rows)  # fine
    with pytest.raises(QuantizeError, match=r"embeddings type Q6_K packs 256 .* rows of 576"):
        check_row_sizes(QuantRecipe("Q4_K_M", embeddings="Q6_K"), rows)
    with pytest.raises(QuantizeError, match="output type Q4_K"):
        check_row_sizes(QuantRecipe("Q4_0", output="Q4_K"), rows)
    check_row_sizes(QuantRecipe("Q4_0", output="Q4_K"), {"token_embd.weight": 576})  # tied
