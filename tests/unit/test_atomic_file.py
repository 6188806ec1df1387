"""runtime.atomic_file: the final file appears whole, with the user's normal mode, or not at all."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.atomic_file import atomic_output, create_beside

posix_modes = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test under the umask given as its parameter; the old one comes back after."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@posix_modes
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077, 0o002], indirect=True)
def test_final_file_gets_0o666_less_the_umask(tmp_path: Path, umask: int) -> None:
    dst = tmp_path / "m.gguf"
    with atomic_output(dst, suffix=".gguf") as tmp:
        tmp.write_bytes(b"GGUF")
    assert dst.read_bytes() == b"GGUF"
    assert mode(dst) == 0o666 & ~umask


@posix_modes
@pytest.mark.parametrize("umask", [0o022], indirect=True)
def test_a_file_rewritten_by_someone_else_keeps_the_mode(tmp_path: Path, umask: int) -> None:
    """What llama.cpp does with the placeholder: open it for writing again (truncate)."""
    dst = tmp_path / "m.gguf"
    with atomic_output(dst) as tmp, open(tmp, "wb") as f:
        f.write(b"rewritten")
    assert mode(dst) == 0o644


def test_the_temporary_file_sits_beside_the_target_under_a_dot_name(tmp_path: Path) -> None:
    dst = tmp_path / "sub" / "m.gguf"
    with atomic_output(dst, prefix=".partial-", suffix=".gguf") as tmp:
        assert tmp.parent == dst.parent  # one file system: the rename is atomic
        assert tmp.name.startswith(".partial-") and tmp.name.endswith(".gguf")
        assert tmp.is_file() and not dst.exists()
    assert [p.name for p in dst.parent.iterdir()] == ["m.gguf"]


def test_an_error_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    dst = tmp_path / "queue.json"
    dst.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(dst) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk went away")
    assert dst.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["queue.json"]


def test_names_never_collide(tmp_path: Path) -> None:
    made = {create_beside(tmp_path / "x") for _ in range(50)}
    assert len(made) == 50 and all(p.is_file() for p in made)
