"""Vision models and their projectors: the one pairing rule, for the Hub, the library and loads.

A vision model ships as two GGUFs: the language model and its projector (`mmproj-*.gguf`,
llama.cpp's multimodal "clip" file). Outrider keeps the pair side by side, the projector in the
model's own folder (a download puts every file of a repository in `models/<owner>/<repo>/`):

    models/ggml-org/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf
    models/ggml-org/gemma-3-4b-it-GGUF/mmproj-model-f16.gguf

    >>> import tempfile
    >>> models = tempfile.TemporaryDirectory()                # a models folder with that pair
    >>> folder = Path(models.name, "ggml-org", "gemma-3-4b-it-GGUF"); folder.mkdir(parents=True)
    >>> for name in ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-model-f16.gguf"):
    ...     (folder / name).touch()
    >>> model = folder / "gemma-3-4b-it-Q4_K_M.gguf"
    >>> projector_for(model).name
    'mmproj-model-f16.gguf'
    >>> with_projector(LoadSettings(model_path=model), roots=[models.name]).mmproj_path.name
    'mmproj-model-f16.gguf'
    >>> models.cleanup()

Some architectures read images only from a size on: Gemma 3 1B (and 270M) read text only.

    >>> vision_capable("gemma3", 3_880_000_000), vision_capable("gemma3", 1_000_000_000)
    (True, False)

When a folder (or a repository) holds several projectors, `preferred_projector` takes the F16
one (what llama.cpp's own `ggml-org` repositories publish and llama-server's `-hf` fetches),
else the smallest. A model file that *is* a projector never pairs (it is not a model).

`with_projector` is what every load of a library model goes through when the user gave no
projector: the app (its model picker, Library → Load, Settings → Load), the server (a model
loaded just in time, `outrider serve MODEL`) and `outrider run`. It pairs only models of the
library (`library_roots`: the models folder, the Hugging Face cache, LM Studio's folders),
where a folder holds one repository; a file elsewhere (a Downloads folder of unrelated
models, where an `mmproj` may belong to any of them) loads as given: `--mmproj` names its
projector.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from huggingface_hub import constants

from runtime.errors import OutriderError
from runtime.paths import user_dirs
from runtime.settings.load import LoadSettings
from runtime.settings.user import SettingsStore

T = TypeVar("T")

LMSTUDIO_DIRS = ("~/.lmstudio/models", "~/.cache/lm-studio/models")  # LM Studio's models folders
PROJECTOR_NAME = re.compile(r"(?i)mmproj.*\.gguf$")
_F16 = re.compile(r"(?i)(?<![a-z0-9])f16(?=[-_.])")

# Text architectures whose models read images with a projector (llama.cpp's names), and the
# fewest parameters such a model has: Gemma 3's 270M and 1B are text only.
VISION_ARCHITECTURES: dict[str, int] = {
    "gemma3": 2_000_000_000, "gemma3n": 0, "qwen2vl": 0, "qwen3vl": 0, "qwen3vlmoe": 0,
    "llama4": 0, "mistral3": 0, "hunyuan_vl": 0, "cogvlm": 0,
}


def is_projector_name(name: str) -> bool:
    """Whether a file name is a projector's (`mmproj*.gguf`, any case, anywhere in the name).

    >>> is_projector_name("mmproj-F16.gguf"), is_projector_name("Qwen2.5-VL-7B-mmproj-f16.gguf")
    (True, True)
    >>> is_projector_name("gemma-3-4b-it-Q4_K_M.gguf")
    False
    """
    return PROJECTOR_NAME.search(name) is not None


def preferred_projector(candidates: Iterable[T], name: Callable[[T], str],
                        size: Callable[[T], int | None]) -> T | None:
    """The projector to use of several: the F16 one (the smallest, if several are), else the
    smallest; None when there are none.

    >>> files = [("mmproj-F32.gguf", 1600), ("mmproj-BF16.gguf", 800), ("mmproj-F16.gguf", 810)]
    >>> preferred_projector(files, name=lambda f: f[0], size=lambda f: f[1])[0]
    'mmproj-F16.gguf'
    """
    items = list(candidates)
    if not items:
        return None
    f16 = [c for c in items if _F16.search(name(c))]
    pool = f16 or items
    return min(pool, key=lambda c: (size(c) if size(c) is not None else 1 << 62, name(c)))


def projector_for(model_path: Path) -> Path | None:
    """The projector that pairs with the model file `model_path`: a `mmproj*.gguf` in the same
    folder (`preferred_projector` of several); None when there is none, or when `model_path`
    is itself a projector."""
    path = Path(model_path)
    if is_projector_name(path.name):
        return None
    try:
        found = [p for p in path.parent.iterdir()
                 if is_projector_name(p.name) and not p.name.startswith(".") and p.is_file()]
    except OSError:
        return None
    return preferred_projector(found, name=lambda p: p.name, size=_size)


def library_roots(models_dir: Path | None = None) -> tuple[Path, ...]:
    """The folders whose models pair with the projector beside them: `models_dir` (default:
    the models folder of the user settings), the default models folder, the Hugging Face
    cache and LM Studio's models folders."""
    if models_dir is None:
        try:
            models_dir = SettingsStore().load().models_dir
        except OutriderError:  # a broken settings file: the app says so; the default folder
            models_dir = None
    roots = [models_dir, user_dirs().models, Path(constants.HF_HUB_CACHE),
             *(Path(d).expanduser() for d in LMSTUDIO_DIRS)]
    return tuple(Path(r) for r in roots if r is not None)


def with_projector(settings: LoadSettings, roots: Iterable[Path] | None = None) -> LoadSettings:
    """`settings` with its model's projector (`projector_for`) when they name none and the
    model is a library model (under one of `roots`, default `library_roots()`)."""
    if settings.mmproj_path is not None:
        return settings
    model = Path(settings.model_path).absolute()
    folders = [Path(r).expanduser().absolute() for r in (library_roots() if roots is None
                                                          else roots)]
    if not any(root in model.parents for root in folders):
        return settings
    paired = projector_for(settings.model_path)
    return settings if paired is None else dataclasses.replace(settings, mmproj_path=paired)


def vision_capable(architecture: str | None, n_params: int | None = None) -> bool:
    """Whether a model of this architecture (and size) reads images, given its projector."""
    if architecture is None or architecture not in VISION_ARCHITECTURES:
        return False
    return (n_params or 0) >= VISION_ARCHITECTURES[architecture]


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
