"""Files that appear whole or not at all, with the permissions of any file the user creates.

    with atomic_output(Path("models/me/m/m.Q8_0.gguf")) as tmp:
        write_everything_to(tmp)      # an exception here leaves nothing behind
    # m.Q8_0.gguf now exists, complete, mode 0o644 under the usual umask 022

    write_text(cache / "hub" / "repo-3f9c.json", json.dumps(listing))   # a whole small file
    write_text(secrets_path, toml, mode=0o600, fsync=True)              # exact mode, on disk

This module is the one way Outrider writes a file that others may read meanwhile (the library
index, the Hub cache, the download queue, settings, exports, quantized models): every writer
gets its own temporary name, so two writers of one target (two processes sharing a cache, a
background save and the save at exit) never write into each other's temporary file, and a
reader sees the old file or one writer's whole new one. Why not a fixed `<name>.tmp`: the
second writer truncates the first one's file while the first still writes or renames it, and
the target can end up as a mix of both, or the first `os.replace` fails because the second
already moved the shared name away. Why not `<name>.<pid>.tmp`: two threads share a pid.

The temporary file lives in the destination's folder (so the final `os.replace` is one atomic
rename on one file system) under a dot-name the library scan never lists.

Why not `tempfile.mkstemp`: it creates the file with mode 0o600 on purpose (temporary files
are private), and a rename keeps the mode, so a model made by `outrider quantize` ended up
readable by its owner alone — unlike a file copied with `cp`, and unreadable by a server
running as another user. Here the file is created with `os.open(..., 0o666)`, so the kernel
applies the umask exactly as it does for `open(path, "w")`: 0o666 & ~umask.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_ATTEMPTS = 100  # unique names collide only by a 48-bit chance, or a hostile folder


def create_beside(dst: Path, prefix: str = ".partial-", suffix: str = "",
                  mode: int | None = None) -> Path:
    """A new, empty file with a unique name in `dst`'s folder, mode 0o666 & ~umask, or exactly
    `mode` when one is given (a secret's 0o600, whatever the umask).

    create_beside(Path("lib/m.gguf"), suffix=".gguf") -> lib/.partial-3f9c2a0b1d4e.gguf
    """
    for _ in range(_ATTEMPTS):
        tmp = dst.with_name(f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            # O_EXCL: never reuse (or follow a symlink to) a file that someone else made.
            # Created with its final mode, so a secret is never readable by others, not even
            # briefly; the umask can only take bits away, and the chmod puts back exactly `mode`.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
        except FileExistsError:
            continue
        os.close(fd)
        if mode is not None:
            os.chmod(tmp, mode)
        return tmp
    raise FileExistsError(f"no free temporary name beside {dst} after {_ATTEMPTS} tries")


@contextmanager
def atomic_output(dst: Path, prefix: str = ".partial-", suffix: str = "",
                  mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `dst`; rename it to `dst` when the block ends cleanly.

    The folder is created when missing. If the block raises, the temporary file is removed
    and `dst` is left as it was (absent, or the previous version). `mode` as in `create_beside`.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = create_beside(dst, prefix, suffix, mode)
    try:
        yield tmp
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(dst: Path, data: bytes, *, mode: int | None = None, fsync: bool = False,
                prefix: str = ".partial-", suffix: str = "") -> None:
    """Replace `dst` by a file holding `data`, in one step (see `atomic_output`).

    fsync=True waits until the bytes are on the disk before the rename, for a file whose loss
    in a power cut costs the user something (settings, secrets); caches and indexes skip it.
    """
    with atomic_output(dst, prefix, suffix, mode) as tmp, open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def write_text(dst: Path, text: str, *, encoding: str = "utf-8", mode: int | None = None,
               fsync: bool = False, prefix: str = ".partial-", suffix: str = "") -> None:
    """`write_bytes` for text, written as `Path.write_text` writes it (the platform's newlines)."""
    with atomic_output(dst, prefix, suffix, mode) as tmp, open(tmp, "w", encoding=encoding) as f:
        f.write(text)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
