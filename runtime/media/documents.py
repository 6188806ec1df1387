"""Documents attached to a chat: their text, cut into overlapping passages, ranked by embeddings.

    >>> doc = extract_text(b"# Notes\\n\\nCats sleep a lot.\\n\\nDogs bark.", "notes.md")
    >>> doc.name, doc.text[:7], doc.pages
    ('notes.md', '# Notes', None)
    >>> [c.text for c in chunks(doc.text, 6, lambda s: len(s.split()))]
    ['# Notes\\n\\nCats sleep a lot.\\n\\n', 'Dogs bark.']
    >>> top_chunks([1.0, 0.0], [[0.0, 1.0], [0.9, 0.1], [0.6, 0.6]], k=2)
    [(1, 0.9939), (2, 0.7071)]

A text file must be UTF-8 (a byte-order mark is fine, and UTF-16 with one is read too); a PDF
is read with pypdf, one text per page, so a passage can say which page it came from
(`Document.page_at`). What cannot be read as text is a `DocumentError` with one line that
says why and what to do: an encrypted, damaged or scanned (no text layer) PDF, a binary file.

Why chunks overlap: a passage cut mid-argument loses the sentence that explains it; repeating
the last ~1/8 of each chunk at the start of the next keeps such sentences whole in one of them.
"""

from __future__ import annotations

import bisect
import io
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pypdf import PdfReader
from pypdf.errors import DependencyError, PdfReadError, PyPdfError

from runtime.errors import DocumentError, shown
from runtime.units import MIB, fmt_bytes

MAX_BYTES = 50 * MIB
PAGE_BREAK = "\n\n"
# pypdf warns through logging about every repairable quirk of a file ("EOF marker not
# found"); what matters to the user is the one-line error or the text.
logging.getLogger("pypdf").setLevel(logging.ERROR)
# Where text may be cut, coarsest first: paragraphs, lines, sentences (always cut down to
# these), then spaces (only a sentence longer than a chunk).
_BREAKS = (re.compile(r"\n\s*\n\s*"), re.compile(r"\n\s*"), re.compile(r"(?<=[.!?;:])\s+"),
           re.compile(r"\s+"))
_SENTENCE_LEVELS = 3
_PARAGRAPH_END = re.compile(r"\n\s*\n\s*$")
TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class Document:
    """A document's text. `pages` holds each page's text for a PDF (`text` is them joined by
    blank lines), None for a text file."""

    name: str
    text: str
    pages: tuple[str, ...] | None = None

    def page_at(self, offset: int) -> int | None:
        """The 1-based page holding character `offset` of `text` (None for a text file).

        >>> Document("a.pdf", "one\\n\\ntwo", ("one", "two")).page_at(5)
        2
        """
        if self.pages is None:
            return None
        starts, position = [], 0
        for page in self.pages:
            starts.append(position)
            position += len(page) + len(PAGE_BREAK)
        return bisect.bisect_right(starts, offset)


@dataclass(frozen=True)
class Chunk:
    """One passage: `text` is `source[start:end]`; `index` its place among the chunks."""

    index: int
    start: int
    end: int
    text: str


def extract_text(source: Path | str | bytes, name: str, *,
                 max_bytes: int = MAX_BYTES) -> Document:
    """The text of a document (a path, or its bytes with its file name), else `DocumentError`."""
    if isinstance(source, bytes):
        data = source
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise DocumentError(f"cannot read {shown(name)}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise DocumentError(f"{shown(name)} is {fmt_bytes(len(data))}; the limit for a document "
                            f"is {fmt_bytes(max_bytes)}")
    if data.startswith(b"%PDF-") or name.lower().endswith(".pdf"):
        return _pdf(data, name)
    return Document(name, _decoded(data, name))


def _decoded(data: bytes, name: str) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 with its mark (Windows Notepad)
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            pass
    if b"\x00" in data[:8192]:
        raise DocumentError(f"{shown(name)} is not a text file or a PDF (Outrider reads .txt, "
                            ".md, code files and PDF)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{shown(name)} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                            f"position {exc.start:,}); save it as UTF-8 and attach it again"
                            ) from None


def _pdf(data: bytes, name: str) -> Document:
    damaged = f"{shown(name)} is damaged or cut short (not a complete PDF)"
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _decrypted(reader):
            raise DocumentError(f"{shown(name)} is password-protected (encrypted); save an "
                                "unprotected copy and attach that")
        pages = tuple(_page_text(page) for page in reader.pages)
    except DocumentError:
        raise
    except (PyPdfError, OSError, ValueError, KeyError, TypeError, AttributeError,
            RecursionError):
        raise DocumentError(damaged) from None
    if not pages:
        raise DocumentError(f"{shown(name)} has no pages")
    if not any(page.strip() for page in pages):
        raise DocumentError(f"{shown(name)} has no text layer (scanned pages or images only); "
                            "run it through OCR first")
    return Document(name, PAGE_BREAK.join(pages), pages)


def _decrypted(reader: PdfReader) -> bool:
    """Open a PDF that is encrypted with an empty user password (only its owner password
    set: many "protected" PDFs). False when it needs a password."""
    try:
        return bool(reader.decrypt(""))
    except (DependencyError, PdfReadError, NotImplementedError):  # AES without `cryptography`
        return False


def _page_text(page: object) -> str:
    text = page.extract_text()  # type: ignore[attr-defined]
    return str(text or "").strip("\n")


def chunks(text: str, max_tokens: int, count_tokens: TokenCounter,
           overlap_tokens: int | None = None) -> list[Chunk]:
    """`text` cut into passages of at most `max_tokens` (as `count_tokens` counts), each
    starting with the last ~`overlap_tokens` (default max_tokens / 8) of the one before.

    The text is cut into sentences (at blank lines, line ends and sentence ends; a sentence
    longer than a chunk at spaces, and a single word longer than a chunk in its middle), and
    sentences are packed into chunks; a chunk ends at a paragraph's end when one falls in its
    second half. Whitespace stays with the sentence before it, so
    `text[c.start:c.end] == c.text` always holds.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    overlap = max_tokens // 8 if overlap_tokens is None else overlap_tokens
    pieces: list[tuple[int, int]] = []
    for a, b in _pieces(text, 0, len(text), max_tokens, count_tokens, 0):
        if pieces and not text[a:b].strip():  # whitespace goes with the sentence before it
            pieces[-1] = (pieces[-1][0], b)
        else:
            pieces.append((a, b))
    out: list[Chunk] = []
    i = 0
    while i < len(pieces):
        j, start = i, pieces[i][0]
        while j + 1 < len(pieces) and count_tokens(text[start:pieces[j + 1][1]]) <= max_tokens:
            j += 1
        if j + 1 < len(pieces):  # not the last chunk: end it at a paragraph if one is near
            ends = [e for e in range((i + j) // 2 + 1, j) if _PARAGRAPH_END.search(
                text, pieces[e][0], pieces[e][1])]
            j = ends[-1] if ends else j
        body = text[start:pieces[j][1]]
        if body.strip():
            out.append(Chunk(len(out), start, pieces[j][1], body))
        if j + 1 >= len(pieces):
            break
        back = j  # the sentences that fit in the overlap start the next chunk
        while back > i and count_tokens(text[pieces[back][0]:pieces[j][1]]) <= overlap:
            back -= 1
        i = back + 1 if back < j else j + 1
    return out


def document_chunks(document: Document, max_tokens: int, count_tokens: TokenCounter,
                    overlap_tokens: int | None = None) -> list[Chunk]:
    """`chunks` of a document; a PDF's page by page, so no passage straddles two pages and
    each has one page to name. Offsets are into `document.text`.

    >>> doc = Document("a.pdf", "one two\\n\\nthree", ("one two", "three"))
    >>> [(c.text, doc.page_at(c.start)) for c in document_chunks(doc, 5, lambda s: len(s.split()))]
    [('one two', 1), ('three', 2)]
    """
    if document.pages is None:
        return chunks(document.text, max_tokens, count_tokens, overlap_tokens)
    out: list[Chunk] = []
    offset = 0
    for page in document.pages:
        for c in chunks(page, max_tokens, count_tokens, overlap_tokens):
            out.append(Chunk(len(out), offset + c.start, offset + c.end, c.text))
        offset += len(page) + len(PAGE_BREAK)
    return out


def _pieces(text: str, start: int, end: int, max_tokens: int, count: TokenCounter,
            level: int) -> list[tuple[int, int]]:
    """[start, end) ranges, each a sentence or less that fits in `max_tokens`."""
    if level >= _SENTENCE_LEVELS and count(text[start:end]) <= max_tokens:
        return [(start, end)]
    if level == len(_BREAKS):  # one word longer than a chunk: halve it
        middle = (start + end) // 2
        if middle in (start, end):
            return [(start, end)]
        return (_pieces(text, start, middle, max_tokens, count, level)
                + _pieces(text, middle, end, max_tokens, count, level))
    cuts = [m.end() for m in _BREAKS[level].finditer(text, start, end) if start < m.end() < end]
    out: list[tuple[int, int]] = []
    for a, b in zip([start, *cuts], [*cuts, end], strict=True):
        out += _pieces(text, a, b, max_tokens, count, level + 1)
    return out


def top_chunks(query_vec: Sequence[float] | np.ndarray,
               chunk_vecs: Sequence[Sequence[float]] | np.ndarray, k: int) -> list[tuple[int, float]]:
    """The `k` chunks nearest the query by cosine similarity: (index, score) best first, the
    score rounded to 4 places (ties keep the chunks' order). Zero vectors score 0."""
    vectors = np.asarray(chunk_vecs, dtype=np.float64)
    if k < 1 or vectors.size == 0:
        return []
    query = np.asarray(query_vec, dtype=np.float64)
    if vectors.ndim != 2 or query.shape != (vectors.shape[1],):
        raise ValueError(f"the query has {query.shape} values, the chunk vectors "
                         f"{vectors.shape}: they must be one size")
    norms = np.linalg.norm(vectors, axis=1) * (np.linalg.norm(query) or 1.0)
    scores = np.divide(vectors @ query, norms, out=np.zeros(len(vectors)), where=norms > 0)
    order = sorted(range(len(scores)), key=lambda i: (-round(float(scores[i]), 4), i))[:k]
    return [(i, round(float(scores[i]), 4)) for i in order]
