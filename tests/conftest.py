"""Shared fixtures: isolated user dirs for every test, the tiny generated GGUFs, the default
model. The tiny models are written once into the user cache (keyed by their spec) and reused
across runs; they are never committed."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from runtime.paths import user_dirs
from tests import network_guard
from tests.fixtures.tiny_gguf import ALIEN_DRAFT, DRAFT, TARGET, TinySpec, write_tiny_gguf
from tests.fixtures.tiny_vision_gguf import PROJECTOR, TinyProjectorSpec, write_tiny_mmproj

_REAL_DIRS = user_dirs()  # taken before any test redirects OUTRIDER_HOME
network_guard.install()  # loopback only, for every test (see tests/network_guard.py)


def tiny_model_path(spec: TinySpec) -> Path:
    """The cached file for `spec`, written on first use."""
    source = Path(__file__).parent / "fixtures" / "tiny_gguf.py"
    key = hashlib.sha256((repr(spec) + source.read_text()).encode()).hexdigest()[:12]
    path = _REAL_DIRS.cache / "test-models" / f"{spec.name}-{key}.gguf"
    if not path.is_file():
        write_tiny_gguf(path, spec)
    return path


def tiny_mmproj_path(spec: TinyProjectorSpec = PROJECTOR) -> Path:
    """The cached projector file for `spec` (tests/fixtures/tiny_vision_gguf.py), written on
    first use; it pairs with TARGET."""
    source = Path(__file__).parent / "fixtures" / "tiny_vision_gguf.py"
    key = hashlib.sha256((repr(spec) + source.read_text()).encode()).hexdigest()[:12]
    path = _REAL_DIRS.cache / "test-models" / f"{spec.name}-{key}.gguf"
    if not path.is_file():
        write_tiny_mmproj(path, spec)
    return path


@pytest.fixture(autouse=True)
def isolated_user_dirs(tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own OUTRIDER_HOME: no test reads or writes the user's data."""
    home = tmp_path_factory.mktemp("outrider-home")
    monkeypatch.setenv("OUTRIDER_HOME", str(home))
    monkeypatch.delenv("OUTRIDER_MODELS_DIR", raising=False)
    yield home


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    return tiny_model_path(TARGET)


@pytest.fixture(scope="session")
def tiny_draft() -> Path:
    return tiny_model_path(DRAFT)


@pytest.fixture(scope="session")
def alien_draft() -> Path:
    return tiny_model_path(ALIEN_DRAFT)


@pytest.fixture(scope="session")
def tiny_mmproj() -> Path:
    """A tiny Gemma-3 vision projector for `tiny_target` (64 tokens per image)."""
    return tiny_mmproj_path(PROJECTOR)


@pytest.fixture(scope="session")
def default_model() -> Path:
    """SmolLM2-135M-Instruct Q4_1 in the real user library (fetched by `make`, or here)."""
    from runtime.library.default_model import fetch_default_model

    return fetch_default_model(_REAL_DIRS.models, _REAL_DIRS.cache)


@pytest.fixture(scope="session")
def llama_templates() -> Path:
    """The folder of llama.cpp's 70 real chat templates (`*.jinja`), taken out of the pinned
    llama-cpp-python sdist into the real user cache (tests/fixtures/llama_templates.py)."""
    from tests.fixtures.llama_templates import llama_templates_dir

    return llama_templates_dir(_REAL_DIRS.cache)
