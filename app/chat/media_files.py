"""The images of the chats, content-addressed: one file per distinct image, named by the
sha256 of its bytes, in a folder beside the chats database.

    media = MediaFiles(Path("~/.local/share/outrider/chat-images"))
    sha = media.put(png_bytes, "image/png")     # …/chat-images/3f2a….png (written once)
    media.read(sha, "image/png") == png_bytes

Why content-addressed: the same screenshot pasted into ten chats (or ten branches of one)
is one file, a name can never collide, and a file is never rewritten, so a half-written
one cannot replace a good one (files are written beside and renamed into place).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from runtime.atomic_file import write_bytes

_EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
               "image/webp": ".webp", "image/bmp": ".bmp", "image/tiff": ".tif"}


def file_name(sha256: str, mime: str) -> str:
    """The name an image is stored (and exported) under.

    >>> file_name("ab" * 32, "image/jpeg")[-8:]
    'abab.jpg'
    """
    if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a sha256: {sha256!r}")  # never a path out of the folder
    return f"{sha256}{_EXTENSIONS.get(mime, '.bin')}"


class MediaFiles:
    """Attachment files under `folder` (created on the first `put`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, sha256: str, mime: str) -> Path:
        return self.folder / file_name(sha256, mime)

    def put(self, data: bytes, mime: str) -> str:
        """Store `data` (once) and return its sha256."""
        sha = hashlib.sha256(data).hexdigest()
        path = self.path(sha, mime)
        if not path.is_file():
            write_bytes(path, data, prefix=".partial-")
        return sha

    def read(self, sha256: str, mime: str) -> bytes:
        return self.path(sha256, mime).read_bytes()

    def remove(self, sha256: str, mime: str) -> None:
        self.path(sha256, mime).unlink(missing_ok=True)
