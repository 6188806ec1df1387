"""`outrider quantize`'s flags: `-o/--out` is the file, `--output-type` / `--embeddings-type`
the tensor types, and `--output` is never taken for a tensor type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.cli.main import main
from runtime.quality import quantize as quantize_module
from runtime.quality.quantize import QuantRecipe


@pytest.fixture
def recipes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, QuantRecipe]]:
    """What `outrider quantize` asks for: (output file, recipe) per call; the file is written."""
    asked: list[tuple[Path, QuantRecipe]] = []

    def fake_quantize(src: Path, dst: Path, recipe: QuantRecipe, **_: Any) -> Path:
        asked.append((dst, recipe))
        dst.write_bytes(b"GGUF")
        return dst

    monkeypatch.setattr(quantize_module, "quantize", fake_quantize)
    return asked


def test_tensor_types_and_the_output_file_are_separate_flags(
        tmp_path: Path, recipes: list[tuple[Path, QuantRecipe]],
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.gguf"
    assert main(["quantize", str(tmp_path / "m.F16.gguf"), "--type", "Q4_K_M",
                 "--embeddings-type", "Q8_0", "--output-type", "F16", "-o", str(out)]) == 0
    ((dst, recipe),) = recipes
    assert dst == out and (recipe.embeddings, recipe.output) == ("Q8_0", "F16")
    assert str(out) in capsys.readouterr().out
    assert main(["quantize", str(tmp_path / "m.F16.gguf"), "--type", "Q4_K_M",
                 "--out", str(tmp_path / "long.gguf")]) == 0
    assert recipes[1][0] == tmp_path / "long.gguf"
    assert (recipes[1][1].embeddings, recipes[1][1].output) == (None, None)


@pytest.mark.parametrize(("flag", "says"), [
    ("--output", "for the file use -o/--out; the output tensor type is --output-type"),
    ("--embeddings", "the token-embedding tensor type is --embeddings-type"),
    ("--output-t", "unrecognized arguments: --output-t"),  # no prefix matching
    ("--emb", "unrecognized arguments: --emb"),
])
def test_a_misnamed_flag_is_refused_with_the_right_name(
        flag: str, says: str, tmp_path: Path, recipes: list[tuple[Path, QuantRecipe]],
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["quantize", str(tmp_path / "m.F16.gguf"), "--type", "Q4_K_M",
              flag, str(tmp_path / "out.gguf")])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
    assert recipes == []  # nothing was quantized
