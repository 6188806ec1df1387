"""What a message carries besides its text: images and documents, and how they go to the model.

Pure Python, no Qt. An attachment is stored on its message by reference: an image by the
sha256 of its (normalised) bytes, whose file lies beside the chat store (`MediaFiles`); a
document by the sha256 of its text, kept in the store. How a document is sent is decided when
the message is sent: whole when it fits the context, else as the passages the retrieval
picked (`Attachment.passages`, also what the reply's "Used passages" line shows).

    >>> doc = Attachment("document", "notes.md", "ab12", tokens=3)
    >>> user_content("What is in it?", [(doc, "Cats sleep.")], [])
    '--- notes.md ---\\nCats sleep.\\n--- end of notes.md ---\\n\\nWhat is in it?'
    >>> user_content("Describe it", [], ["data:image/png;base64,iVBO"])[1]
    {'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,iVBO'}}

A document's tokens are first estimated (≈ characters / 4, shown with "≈") and then counted
with the served model's tokenizer (`EngineClient.tokenize`, `POST /tokenize`); the count
replaces the estimate when it arrives, and the estimate stays when it cannot be had (no model
ready, the call failed). Its text is extracted (`read_document`: pypdf for a PDF) off the GUI
thread; meanwhile the composer holds a `ReadingDocument`.

    >>> fmt_tokens(41_237), fmt_tokens(41_237, exact=True)
    ('≈41,237 tokens', '41,237 tokens')
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from runtime.errors import ImageError, shown
from runtime.media.documents import Document, extract_text
from runtime.media.images import check_image, mime_type, normalized_rgb

Kind = Literal["image", "document"]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff")
Mode = Literal["whole", "passages"]
CHARS_PER_TOKEN = 4
NOT_VISION = ("{model} cannot read images: load a vision model (one with a projector, e.g. "
              "Gemma 3 or Qwen2.5-VL)")


def estimate_tokens(text: str) -> int:
    """Tokens of `text`, estimated as characters / 4 (shown with "≈").

    >>> estimate_tokens("Hello, world!"), estimate_tokens("")
    (4, 0)
    """
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def fmt_tokens(n: int, exact: bool = False) -> str:
    """A token count as the chips show it: with "≈" unless the tokenizer counted it.

    >>> fmt_tokens(41_237), fmt_tokens(1, exact=True)
    ('≈41,237 tokens', '1 token')
    """
    return ("" if exact else "≈") + f"{n:,} token" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Passage:
    """A chunk of a document sent instead of the whole: its place, its page (PDF), its text."""

    index: int
    page: int | None
    text: str

    @property
    def label(self) -> str:
        """Where the passage is, as the reply's line names it.

        >>> Passage(4, 3, "").label, Passage(4, None, "").label
        ('p.3', 'passage 5')
        """
        return f"p.{self.page}" if self.page is not None else f"passage {self.index + 1}"


@dataclass(frozen=True)
class Attachment:
    """One image or document of a message. `mode` and `passages` concern documents: "whole"
    (the text goes in as is) or "passages" (the chunks in `passages`, once retrieved)."""

    kind: Kind
    name: str
    sha256: str
    mime: str = ""  # images: the media type of the stored bytes
    tokens: int = 0  # documents: the whole text's tokens (counted, else estimated)
    pages: int | None = None  # documents: a PDF's page count
    mode: Mode = "whole"
    passages: tuple[Passage, ...] = field(default=())
    exact: bool = False  # documents: `tokens` was counted by the model's tokenizer

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passages"] = [asdict(p) for p in self.passages]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attachment:
        passages = tuple(Passage(int(p["index"]), p.get("page"), str(p["text"]))
                         for p in data.get("passages") or ())
        return cls(data["kind"], str(data["name"]), str(data["sha256"]), str(data.get("mime", "")),
                   int(data.get("tokens", 0)), data.get("pages"), data.get("mode", "whole"),
                   passages, bool(data.get("exact", False)))

    def describe(self) -> str:
        """What a chip says about a document: "report.pdf · 12 pages · ≈8,400 tokens" (an
        estimate), "report.pdf · 12 pages · 8,391 tokens" (counted).

        >>> Attachment("document", "a.pdf", "x", tokens=8400, pages=12).describe()
        'a.pdf · 12 pages · ≈8,400 tokens'
        >>> Attachment("document", "a.md", "x", tokens=8391, exact=True).describe()
        'a.md · 8,391 tokens'
        """
        parts = [self.name]
        if self.pages:
            parts.append(f"{self.pages} page" + ("" if self.pages == 1 else "s"))
        if self.kind == "document":
            parts.append(fmt_tokens(self.tokens, self.exact))
        return " · ".join(parts)


def used_passages(attachments: list[Attachment]) -> str:
    """The reply's line about what it was given: "Used passages: a.pdf p.3, p.7" ("" if none).

    >>> used_passages([Attachment("document", "a.pdf", "x", mode="passages",
    ...     passages=(Passage(2, 3, ""), Passage(9, 7, "")))])
    'Used passages: a.pdf p.3, p.7'
    """
    parts = [f"{a.name} " + ", ".join(_unique(p.label for p in a.passages))
             for a in attachments if a.kind == "document" and a.passages]
    return "Used passages: " + "; ".join(parts) if parts else ""


def _unique(labels: Any) -> list[str]:
    out: list[str] = []
    for label in labels:
        if label not in out:
            out.append(label)
    return out


def document_block(attachment: Attachment, text: str) -> str:
    """A document as the model reads it, between lines naming the file; as passages, each
    under the page (or place) it came from."""
    if attachment.mode == "passages":
        body = "\n\n".join(f"[{p.label}]\n{p.text.strip()}" for p in attachment.passages)
        return (f"--- {attachment.name} (the passages most relevant to the question) ---\n"
                f"{body}\n--- end of {attachment.name} ---")
    return f"--- {attachment.name} ---\n{text.rstrip()}\n--- end of {attachment.name} ---"


def data_url(data: bytes, mime: str) -> str:
    """Image bytes as a data: URL (what an `image_url` content part carries).

    >>> data_url(b"\\x89PNG", "image/png")
    'data:image/png;base64,iVBORw=='
    """
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def user_content(text: str, documents: list[tuple[Attachment, str]],
                 image_urls: list[str]) -> str | list[dict[str, Any]]:
    """A user message's `content` for the OpenAI API: the documents, then the typed text;
    with images, content parts (the text part, then one `image_url` part per image)."""
    blocks = [document_block(a, body) for a, body in documents]
    joined = "\n\n".join([*blocks, text] if text else blocks)
    if not image_urls:
        return joined
    parts: list[dict[str, Any]] = [{"type": "text", "text": joined}] if joined else []
    return parts + [{"type": "image_url", "image_url": {"url": url}} for url in image_urls]


# -- what the composer holds before sending --------------------------------------------


@dataclass(frozen=True)
class PendingImage:
    """A checked image waiting in the composer: its normalised bytes (what is stored and
    sent) and their media type."""

    name: str
    data: bytes
    mime: str
    width: int
    height: int


@dataclass(frozen=True)
class PendingDocument:
    """A read document waiting in the composer, with its tokens: estimated until
    `counted_by` names the model whose tokenizer counted them."""

    name: str
    document: Document
    tokens: int
    counted_by: str = ""

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.document.text.encode("utf-8")).hexdigest()

    def counted(self, tokens: int, model: str) -> PendingDocument:
        """This document with its tokens as `model` counted them.

        >>> doc = PendingDocument("a.md", Document("a.md", "Cats sleep."), 3)
        >>> doc.attachment("whole").describe(), doc.counted(4, "smol").attachment("whole").describe()
        ('a.md · ≈3 tokens', 'a.md · 4 tokens')
        """
        return PendingDocument(self.name, self.document, tokens, model)

    def attachment(self, mode: Mode) -> Attachment:
        pages = len(self.document.pages) if self.document.pages is not None else None
        return Attachment("document", self.name, self.sha256, tokens=self.tokens, pages=pages,
                          mode=mode, exact=bool(self.counted_by))


@dataclass(frozen=True, eq=False)
class ReadingDocument:
    """A document whose text is being extracted off the GUI thread (its chip says
    "reading…"); replaced by its `PendingDocument` when read. Compared by identity: the same
    file attached twice is two of these."""

    name: str
    path: Path


Pending = PendingImage | PendingDocument


def read_image(data: bytes, name: str) -> PendingImage:
    """An image for the composer, checked and normalised; `ImageError` names the file.

    >>> read_image(b"milk, bread", "list.jpg")
    Traceback (most recent call last):
    runtime.errors.ImageError: list.jpg: not an image Outrider can read (PNG, JPEG, WebP, GIF, BMP or TIFF)
    """
    try:
        normal = normalized_rgb(data)
        info = check_image(normal) if normal is not data else check_image(data)
    except ImageError as exc:
        raise ImageError(f"{shown(name)}: {exc}") from None
    return PendingImage(name, normal, mime_type(normal), info.width, info.height)


def is_image(path: Path) -> bool:
    """Attached as an image (by its suffix), else as a document."""
    return path.suffix.lower() in IMAGE_SUFFIXES


def read_image_file(path: Path) -> PendingImage:
    """An image from a file, checked and normalised; `ImageError` names the file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(f"cannot read {shown(path.name)}: {exc.strerror or exc}") from None
    return read_image(data, path.name)


def read_document(path: Path) -> PendingDocument:
    """A document's text with its estimated tokens; `DocumentError` says why it cannot be
    read. Slow for a large PDF: the composer runs it on a background runner."""
    document = extract_text(path, path.name)
    return PendingDocument(path.name, document, estimate_tokens(document.text))
