"""Documents: text files and PDFs give their text (pages kept apart), the bad-PDF corpus is
refused with one line each, chunks cover the text with overlap, retrieval ranks by cosine."""

from __future__ import annotations

import doctest
import itertools

import numpy as np
import pytest

from runtime.errors import DocumentError
from runtime.media import documents
from runtime.media.documents import Document, chunks, extract_text, top_chunks
from tests.media import corpus


def words(text: str) -> int:
    return len(text.split())


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(documents).failed == 0


def test_a_text_file_is_read_as_utf8_from_a_path_or_bytes(tmp_path) -> None:
    path = tmp_path / "main.py"
    path.write_text("def greet():\n    return 'héllo'\n", encoding="utf-8")
    doc = extract_text(path, "main.py")
    assert doc == Document("main.py", "def greet():\n    return 'héllo'\n", None)
    assert extract_text("\ufeffwith a BOM".encode(), "a.md").text == "with a BOM"
    assert extract_text("utf-16 notes".encode("utf-16"), "n.txt").text == "utf-16 notes"


def test_text_that_is_not_utf8_or_not_text_is_refused() -> None:
    with pytest.raises(DocumentError, match=r"notes.txt is not UTF-8 text \(byte 0xe9 at "
                                            r"position 3\); save it as UTF-8"):
        extract_text("caf\xe9".encode("latin-1"), "notes.txt")
    with pytest.raises(DocumentError, match="is not a text file or a PDF"):
        extract_text(b"PK\x03\x04\x00\x00binary", "report.docx")


def test_a_missing_file_and_a_too_large_one_say_so(tmp_path) -> None:
    with pytest.raises(DocumentError, match=r"cannot read gone\.txt"):
        extract_text(tmp_path / "gone.txt", "gone.txt")
    with pytest.raises(DocumentError, match=r"the limit for a document is 1\.00 KiB"):
        extract_text(b"a" * 2000, "big.txt", max_bytes=1024)


def test_a_pdf_keeps_its_pages_and_says_where_a_passage_is() -> None:
    doc = extract_text(corpus.text_pdf(["Cats sleep sixteen hours.", "Dogs bark at night."]),
                       "pets.pdf")
    assert doc.pages == ("Cats sleep sixteen hours.", "Dogs bark at night.")
    assert doc.text == "Cats sleep sixteen hours.\n\nDogs bark at night."
    assert doc.page_at(doc.text.index("Dogs")) == 2 and doc.page_at(0) == 1


@pytest.mark.parametrize(("name", "words"), [
    ("encrypted.pdf", "encrypted.pdf is password-protected (encrypted); save an unprotected copy"),
    ("truncated.pdf", "truncated.pdf is damaged or cut short"),
    ("scan.pdf", "scan.pdf has no text layer (scanned pages or images only); run it through OCR"),
])
def test_each_bad_pdf_is_one_line_that_says_why(name: str, words: str) -> None:
    with pytest.raises(DocumentError) as caught:
        extract_text(corpus.BAD_PDFS[name](), name)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_pdf_locked_by_an_owner_password_only_opens() -> None:
    assert extract_text(corpus.owner_locked_pdf(), "locked.pdf").text == "Open to read"


def test_chunks_cover_the_text_within_the_limit_and_overlap() -> None:
    paragraphs = [" ".join(f"p{p}w{w}." for w in range(30)) for p in range(10)]
    text = "\n\n".join(paragraphs)
    out = chunks(text, 64, words, overlap_tokens=8)
    assert all(words(c.text) <= 64 for c in out)
    assert all(text[c.start:c.end] == c.text for c in out)
    assert [c.index for c in out] == list(range(len(out)))
    assert out[0].start == 0 and out[-1].end == len(text)
    for before, after in itertools.pairwise(out):
        assert after.start <= before.end, "no gap between chunks"
        assert after.start < before.end, "consecutive chunks overlap"
        assert after.start > before.start, "every chunk moves on"


def test_a_chunk_ends_at_a_paragraph_when_one_is_near() -> None:
    text = "one two three four five six.\n\nseven eight nine ten eleven twelve."
    first = chunks(text, 10, words, overlap_tokens=0)[0]
    assert first.text == "one two three four five six.\n\n"


def test_a_pdf_is_chunked_page_by_page() -> None:
    doc = extract_text(corpus.text_pdf(["alpha beta gamma", "delta epsilon"]), "g.pdf")
    out = documents.document_chunks(doc, 100, words)
    assert [(c.text, doc.page_at(c.start)) for c in out] == [("alpha beta gamma", 1),
                                                              ("delta epsilon", 2)]
    assert all(doc.text[c.start:c.end] == c.text for c in out)


def test_a_word_longer_than_a_chunk_is_cut_rather_than_looping() -> None:
    text = "x" * 100
    out = chunks(text, 10, lambda s: len(s))
    assert "".join(c.text for c in out) == text and all(len(c.text) <= 10 for c in out)


def test_top_chunks_ranks_by_cosine_and_ignores_length() -> None:
    vectors = np.array([[0.0, 1.0], [10.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    assert top_chunks([2.0, 0.0], vectors, 3) == [(2, 1.0), (1, 0.995), (0, 0.0)]
    assert top_chunks([1.0, 0.0], [], 3) == []
    with pytest.raises(ValueError, match="one size"):
        top_chunks([1.0, 0.0, 0.0], vectors, 1)
