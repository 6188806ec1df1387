"""A one-page PDF written by hand, for the self-test's document check: the smallest file a
PDF reader accepts (catalog, page tree, one page, Helvetica, a text stream, the xref table),
so the check needs no PDF writer, only the reader the chat uses (pypdf).

    >>> pdf = one_page_pdf(["The code word is pelican."])
    >>> pdf[:8], pdf.rstrip().endswith(b"%%EOF")
    (b'%PDF-1.4', True)
"""

from __future__ import annotations


def _escaped(line: str) -> str:
    """A line as a PDF literal string: ASCII, with backslash and parentheses escaped."""
    ascii_line = line.encode("ascii", "replace").decode("ascii")
    return ascii_line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def one_page_pdf(lines: list[str]) -> bytes:
    """A PDF of one US-letter page showing `lines` in 12-point Helvetica."""
    shown = " T* ".join(f"({_escaped(line)}) Tj" for line in lines)
    stream = f"BT /F1 12 Tf 16 TL 72 720 Td {shown} ET".encode("ascii")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    return bytes(out)
