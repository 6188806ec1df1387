"""The files `outrider --self-test --fixtures DIR` reads from DIR, and where each goes.

DIR is written by `packaging/self_test_fixtures.py DIR` (from a checkout, with the venv's
Python: it uses the test suite's tiny GGUF writers); the self-test itself only reads it. No Qt
here: the fixtures script imports these names.

    tiny-tools.gguf           a tiny llama model with a Hermes (Qwen 2.5) chat template: the
                              router loads it by name, and it answers a forced tool call
    tiny-vision.gguf          the tiny vision pair: a 128-wide text model …
    mmproj-tiny-vision.gguf   … and its Gemma-3 projector (64 tokens per image)
    tiny-quantize.F32.gguf    an F32 model the quantize worker makes a Q8_0 of
    image.png                 a small RGB picture for the vision check
"""

from __future__ import annotations

from pathlib import Path

TOOLS_MODEL = "tiny-tools.gguf"
VISION_MODEL = "tiny-vision.gguf"
VISION_PROJECTOR = "mmproj-tiny-vision.gguf"
QUANTIZE_SOURCE = "tiny-quantize.F32.gguf"
IMAGE = "image.png"
ALL = (TOOLS_MODEL, VISION_MODEL, VISION_PROJECTOR, QUANTIZE_SOURCE, IMAGE)
HOW = "write them with `.venv/bin/python packaging/self_test_fixtures.py DIR`"


class MissingFixture(Exception):
    """A check's fixture is not there: `--fixtures` was not given, or DIR lacks the file."""


def fixture(folder: Path | None, *names: str) -> list[Path]:
    """The paths of `names` in the fixtures folder; `MissingFixture` saying what is wrong."""
    if folder is None:
        raise MissingFixture(f"needs --fixtures DIR ({HOW})")
    paths = [folder / name for name in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise MissingFixture(f"{folder} has no {', '.join(missing)} ({HOW})")
    return paths
