"""The verdict store (runtime.gguf.verdicts): what llama.cpp did with a file, per file."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.errors import LoadCrashed
from runtime.gguf import verdicts
from runtime.gguf.verdicts import FILE_NAME, LoadVerdict, VerdictStore

CRASH = "ops.cpp:4132: GGML_ASSERT(eps >= 0.0f) failed"


def model(tmp_path: Path, name: str = "m.gguf", data: bytes = b"GGUF" + bytes(60)) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_verdict_is_kept_per_file_and_a_crash_refused(tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / "cache" / FILE_NAME)
    bad, good = model(tmp_path, "bad.gguf"), model(tmp_path, "good.gguf")
    assert store.get(bad) is None
    store.put(bad, LoadVerdict(ok=False, reason=CRASH))
    store.put(good, LoadVerdict(ok=True))
    assert VerdictStore(store.path).get(bad) == LoadVerdict(ok=False, reason=CRASH)
    assert store.failing(bad) == CRASH and store.failing(good) is None
    with pytest.raises(LoadCrashed, match=r"^llama.cpp crashed while loading bad.gguf: ops.cpp"):
        store.refuse_known_crash(bad)
    store.refuse_known_crash(good)
    bad.write_bytes(b"GGUF" + bytes(61))  # a new file under the old name: not known
    assert store.get(bad) is None


def test_an_unreadable_store_starts_over(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    m = model(tmp_path)
    for text in ("{not json", '{"version": 99, "files": {}}', "[1, 2]"):
        path.write_text(text)
        assert VerdictStore(path).get(m) is None
    VerdictStore(path).put(m, LoadVerdict(ok=True))
    assert VerdictStore(path).get(m) == LoadVerdict(ok=True)


def test_asking_about_a_file_without_a_crash_hashes_nothing(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = VerdictStore(tmp_path / FILE_NAME)
    store.put(model(tmp_path, "bad.gguf"), LoadVerdict(ok=False, reason=CRASH))

    def no_hashing(path: Path) -> str:
        raise AssertionError("hashed")

    monkeypatch.setattr(verdicts, "file_key", no_hashing)
    assert store.failing(model(tmp_path, "other.gguf")) is None
    with pytest.raises(AssertionError):
        store.failing(tmp_path / "bad.gguf")  # a crash of that name: now it must look
