"""`outrider run` of a library vision model without `--mmproj` reads an image: the projector
beside it is loaded (runtime.library.projectors.with_projector); outside the library, the same
files need `--mmproj`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runtime.cli.main import main
from runtime.paths import user_dirs
from tests.fixtures.tiny_vision_gguf import tiny_png


def test_a_library_vision_model_reads_an_image_without_mmproj(
        tiny_target: Path, tiny_mmproj: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = user_dirs().models / "vision" / "Tiny-Vision-GGUF"
    folder.mkdir(parents=True)
    model = folder / "tiny-vision-F32.gguf"
    shutil.copyfile(tiny_target, model)
    shutil.copyfile(tiny_mmproj, folder / "mmproj-tiny-vision-F16.gguf")
    image = tmp_path / "photo.png"
    image.write_bytes(tiny_png(seed=1))
    argv = ["-p", "What is this?", "--image", str(image), "--temp", "0", "--max-tokens", "2",
            "--ctx", "512", "--threads", "1"]
    code = main(["run", str(model), *argv])
    _, err = capsys.readouterr()
    assert code == 0, err

    elsewhere = tmp_path / "tiny-vision-F32.gguf"  # the pair, outside the library
    shutil.copyfile(tiny_target, elsewhere)
    shutil.copyfile(tiny_mmproj, tmp_path / "mmproj-tiny-vision-F16.gguf")
    code = main(["run", str(elsewhere), *argv])
    _, err = capsys.readouterr()
    assert code != 0 and "cannot read images" in err
