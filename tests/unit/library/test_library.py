"""The local library: scan with a metadata cache, import, discovery, delete, draft matching."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import hf_hub_download

from runtime.errors import ModelNotFound, NotAGGUF, OutriderError
from runtime.gguf.info import read_model_info
from runtime.library.drafts import DraftJudge, compatible_drafts
from runtime.library.library import Library
from tests.hubserver import TINY_REPO, FakeHub
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)
from tests.hubserver.repos import tiny_files


class CountingReader:
    def __init__(self) -> None:
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> Any:
        self.paths.append(Path(path))
        return read_model_info(path)


@pytest.fixture
def split_parts() -> list[Path]:
    from tests.conftest import _REAL_DIRS

    files = tiny_files(_REAL_DIRS.cache / "test-models")
    return [files["split1"], files["split2"]]


def test_scan_reads_headers_once_then_uses_the_cache(tmp_path: Path, tiny_target: Path) -> None:
    reader = CountingReader()
    lib = Library(tmp_path / "models", tmp_path / "cache", read_info=reader)
    lib.import_file(tiny_target, "copy", repo_id="tiny/Tiny-GGUF")
    reader.paths.clear()
    [model] = lib.scan()
    assert model.id == f"tiny/Tiny-GGUF/{tiny_target.name}"
    assert (model.quant, model.architecture, model.source) == ("F32", "llama", "library")
    assert model.info and model.info["n_params"] > 0
    assert reader.paths == []  # known from the import: path, size and mtime unchanged
    again = Library(tmp_path / "models", tmp_path / "cache", read_info=reader).scan()
    assert again == [model] and reader.paths == []  # a new process: the index on disk
    os.utime(model.path, (1, 1))  # the file changed (mtime): read again
    Library(tmp_path / "models", tmp_path / "cache", read_info=reader).scan()
    assert reader.paths == [model.path]


def test_split_model_is_one_entry(tmp_path: Path, split_parts: list[Path]) -> None:
    lib = Library(tmp_path / "models", tmp_path / "cache")
    model = lib.import_file(split_parts[1], "copy", repo_id="tiny/Tiny-GGUF")  # any part will do
    assert model.parts == tuple(tmp_path / "models/tiny/Tiny-GGUF" / p.name for p in split_parts)
    assert model.name == "tiny-Q8_0"
    assert model.size == sum(p.stat().st_size for p in split_parts)
    assert [m.id for m in lib.scan()] == ["tiny/Tiny-GGUF/tiny-Q8_0-00001-of-00002.gguf"]
    model.parts[1].unlink()
    [broken] = lib.scan()
    assert broken.error and "1 of 2" in broken.error


def test_import_modes(tmp_path: Path, tiny_target: Path) -> None:
    lib = Library(tmp_path / "models", tmp_path / "cache")
    source = tmp_path / "mine" / "my-model.gguf"
    source.parent.mkdir()
    shutil.copyfile(tiny_target, source)
    copied = lib.import_file(source, "copy")
    assert copied.path == tmp_path / "models/imported/my-model/my-model.gguf"
    assert source.exists() and copied.path.read_bytes() == source.read_bytes()
    lib.delete(copied)
    linked = lib.import_file(source, "link", repo_id="me/Linked")
    assert linked.path.is_symlink() and linked.path.resolve() == source.resolve()
    lib.delete(linked)
    assert source.exists()  # deleting a linked model removes only the link
    moved = lib.import_file(source, "move", repo_id="me/Moved")
    assert not source.exists() and moved.path.is_file()
    with pytest.raises(OutriderError, match="already exists"):
        lib.import_file(moved.path, "copy", repo_id="me/Moved")


def test_import_refuses_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "fake.gguf"
    bogus.write_bytes(b"definitely not a model" * 10)
    lib = Library(tmp_path / "models", tmp_path / "cache")
    with pytest.raises(NotAGGUF):
        lib.import_file(bogus, "copy")
    assert not (tmp_path / "models").exists() or not list((tmp_path / "models").rglob("*"))


def test_scan_ignores_partial_and_hidden_files(tmp_path: Path, tiny_target: Path) -> None:
    folder = tmp_path / "models/o/r"
    folder.mkdir(parents=True)
    (folder / "x.gguf.part").write_bytes(b"GGUF")
    (folder / ".x.gguf.abc.incoming").write_bytes(b"GGUF")
    (folder / ".hidden.gguf").write_bytes(b"GGUF")
    shutil.copyfile(tiny_target, folder / "real.gguf")
    assert [m.id for m in Library(tmp_path / "models", tmp_path / "cache").scan()] == ["o/r/real.gguf"]


def test_discovers_the_hf_cache_and_lm_studio(fake_hub: FakeHub, tmp_path: Path,  # noqa: F811
                                              tiny_draft: Path) -> None:
    hf_cache = tmp_path / "hf"
    hf_hub_download(TINY_REPO, "tiny-F32.gguf", endpoint=fake_hub.url, cache_dir=hf_cache)
    hf_hub_download(TINY_REPO, "README.md", endpoint=fake_hub.url, cache_dir=hf_cache)
    lms = tmp_path / "lmstudio"
    (lms / "someone/Draft-GGUF").mkdir(parents=True)
    shutil.copyfile(tiny_draft, lms / "someone/Draft-GGUF/draft-F32.gguf")
    lib = Library(tmp_path / "models", tmp_path / "cache")
    found = lib.discover(hf_cache_dir=hf_cache, lmstudio_dirs=[lms, tmp_path / "absent"])
    assert [(m.source, m.id, m.quant) for m in found] == [
        ("hf-cache", "tiny/Tiny-GGUF/tiny-F32.gguf", "F32"),
        ("lmstudio", "someone/Draft-GGUF/draft-F32.gguf", "F32"),
    ]
    assert lib.scan() == []  # discovered, not imported
    with pytest.raises(OutriderError, match="not in the library"):
        lib.delete(found[1])
    linked = lib.import_file(found[0].path, "link", repo_id=found[0].repo_id)
    assert linked.id == "tiny/Tiny-GGUF/tiny-F32.gguf"


def test_find_and_delete(tmp_path: Path, tiny_target: Path, tiny_draft: Path) -> None:
    lib = Library(tmp_path / "models", tmp_path / "cache")
    target = lib.import_file(tiny_target, "copy", repo_id="tiny/Target-GGUF")
    lib.import_file(tiny_draft, "copy", repo_id="tiny/Draft-GGUF")
    assert lib.find(target.id) == target
    assert lib.find(tiny_target.name) == target
    assert lib.find(tiny_target.stem) == target
    assert lib.find("Target-GGUF") == target  # a unique substring of the id
    with pytest.raises(OutriderError, match="several"):
        lib.find("tiny/")
    with pytest.raises(ModelNotFound):
        lib.find("nothing-like-it")
    removed = lib.delete(target.id)
    assert removed == [target.path] and not target.path.exists()
    assert not (tmp_path / "models/tiny/Target-GGUF").exists()  # empty folders tidied
    assert [m.repo_id for m in lib.scan()] == ["tiny/Draft-GGUF"]


def test_compatible_drafts_share_the_vocabulary(tmp_path: Path, tiny_target: Path,
                                                tiny_draft: Path, alien_draft: Path) -> None:
    lib = Library(tmp_path / "models", tmp_path / "cache")
    target = lib.import_file(tiny_target, "copy", repo_id="tiny/Target-GGUF")
    draft = lib.import_file(tiny_draft, "copy", repo_id="tiny/Draft-GGUF")
    alien = lib.import_file(alien_draft, "copy", repo_id="tiny/Alien-GGUF")
    assert [m.path for m in compatible_drafts(target, lib.scan())] == [draft.path]
    assert DraftJudge().refusals(target, alien)  # reasons, in words
    assert compatible_drafts(draft, lib.scan()) == []  # a draft needs a smaller model
