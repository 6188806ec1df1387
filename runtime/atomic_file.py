"""Files that appear whole or not at all, with the permissions of any file the user creates.

    with atomic_output(Path("models/me/m/m.Q8_0.gguf")) as tmp:
        write_everything_to(tmp)      # an exception here leaves nothing behind
    # m.Q8_0.gguf now exists, complete, mode 0o644 under the usual umask 022

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


def create_beside(dst: Path, prefix: str = ".partial-", suffix: str = "") -> Path:
    """A new, empty file with a unique name in `dst`'s folder, mode 0o666 & ~umask.

    create_beside(Path("lib/m.gguf"), suffix=".gguf") -> lib/.partial-3f9c2a0b1d4e.gguf
    """
    for _ in range(_ATTEMPTS):
        tmp = dst.with_name(f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            # O_EXCL: never reuse (or follow a symlink to) a file that someone else made.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"no free temporary name beside {dst} after {_ATTEMPTS} tries")


@contextmanager
def atomic_output(dst: Path, prefix: str = ".partial-", suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `dst`; rename it to `dst` when the block ends cleanly.

    The folder is created when missing. If the block raises, the temporary file is removed
    and `dst` is left as it was (absent, or the previous version).
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = create_beside(dst, prefix, suffix)
    try:
        yield tmp
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
