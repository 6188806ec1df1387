"""runtime.atomic_file: the final file appears whole, with the user's normal mode, or not at all."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.atomic_file import atomic_output, create_beside, write_bytes, write_text

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


@posix_modes
@pytest.mark.parametrize("umask", [0o022, 0o077], indirect=True)
def test_an_exact_mode_ignores_the_umask(tmp_path: Path, umask: int) -> None:
    """Settings are 0o644 and secrets 0o600 whatever the umask; the temporary file already
    has the final mode, so a secret is never readable by others, not even briefly."""
    secret = tmp_path / "secrets.toml"
    with atomic_output(secret, mode=0o600) as tmp:
        assert mode(tmp) == 0o600
    assert mode(secret) == 0o600
    write_text(tmp_path / "settings.toml", "theme = 'dark'\n", mode=0o644, fsync=True)
    assert mode(tmp_path / "settings.toml") == 0o644


def test_write_text_and_bytes_replace_the_whole_file(tmp_path: Path) -> None:
    dst = tmp_path / "cache" / "hub" / "repo.json"  # the folders are made
    write_text(dst, '{"a": "ä"}')
    assert dst.read_text(encoding="utf-8") == '{"a": "ä"}'
    write_bytes(dst, b"{}", fsync=True)
    assert dst.read_bytes() == b"{}"
    assert [p.name for p in dst.parent.iterdir()] == ["repo.json"]


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    dst = tmp_path / "index.json"
    dst.write_text("old")
    with pytest.raises(TypeError):
        write_text(dst, b"not text")  # type: ignore[arg-type]
    assert dst.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]


def test_two_writers_at_once_never_share_a_temporary_file(tmp_path: Path) -> None:
    """Both writers hold their temporary files at the same moment (the barrier): with a fixed
    `<name>.tmp` they would be one file, each truncating the other's bytes."""
    dst = tmp_path / "hub-cache.json"
    both_open = threading.Barrier(2, timeout=10)
    temps: dict[str, Path] = {}
    errors: list[BaseException] = []

    def writer(name: str, payload: bytes) -> None:
        try:
            with atomic_output(dst) as tmp, open(tmp, "wb") as f:
                temps[name] = tmp
                f.write(payload[: len(payload) // 2])
                both_open.wait()  # the other writer has created (and half written) its file too
                f.write(payload[len(payload) // 2:])
        except BaseException as exc:  # a thread's error would vanish: the test reports it
            errors.append(exc)

    contents = {"a": b"a" * 100_000, "b": b"b" * 150_000}
    threads = [threading.Thread(target=writer, args=item) for item in contents.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert temps["a"] != temps["b"]
    assert dst.read_bytes() in contents.values()  # one writer's whole file, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["hub-cache.json"]


WRITER = """
import sys
from pathlib import Path
from runtime.atomic_file import write_bytes
dst, byte = Path(sys.argv[1]), sys.argv[2].encode()
for _ in range(200):
    write_bytes(dst, byte * 200_000)
"""


def test_two_processes_writing_one_target_leave_a_whole_file(tmp_path: Path) -> None:
    """Two processes (two apps sharing a cache) rewrite one file 200 times each while this one
    reads it: every read is one writer's complete content, and no temporary file is left."""
    dst = tmp_path / "shared.json"
    root = Path(__file__).resolve().parents[2]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(dst), byte], cwd=root)
               for byte in ("x", "y")]
    whole = {b"x" * 200_000, b"y" * 200_000}
    while any(w.poll() is None for w in writers):
        try:
            data = dst.read_bytes()
        except (FileNotFoundError, PermissionError):  # before the first rename; Windows: a
            continue  # rename over a file open for reading
        assert data in whole
    assert [w.returncode for w in writers] == [0, 0]
    assert dst.read_bytes() in whole
    assert [p.name for p in tmp_path.iterdir()] == ["shared.json"]
