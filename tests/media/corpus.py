"""The bad-image and bad-PDF corpus, written at test time (never committed binaries).

Every function returns bytes; `write_corpus(folder)` writes them all under their file names
for tests that attach files (the chat's GUI tests, the server's 400s).

    >>> png_declaring(20_000, 20_000)[:8]
    b'\\x89PNG\\r\\n\\x1a\\n'
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

from PIL import Image
from pypdf import PdfReader, PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject


def png(width: int = 64, height: int = 48, color: str = "teal", mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), color).save(out, "PNG")
    return out.getvalue()


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares `width` × `height` with a tiny compressed IDAT: the
    decompression-bomb shape, a few hundred bytes that would decode to gigabytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 256)) + chunk(b"IEND", b""))


def truncated_png() -> bytes:
    data = png(200, 120, "orange")
    return data[: len(data) // 2]


def text_named_jpg() -> bytes:
    return b"This is a shopping list, not a photo.\nmilk\nbread\n"


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (24, 24), color) for color in ("red", "green", "blue")]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=80, loop=0)
    return out.getvalue()


def cmyk_jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("CMYK", (40, 30), (0, 255, 255, 0)).save(out, "JPEG")  # pure red in CMYK
    return out.getvalue()


def text_pdf(pages: list[str]) -> bytes:
    """A PDF with one page per text (lines set in Helvetica), readable by any extractor."""
    writer = PdfWriter()
    for text in pages:
        page = writer.add_blank_page(612, 792)
        font = DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                                 NameObject("/Subtype"): NameObject("/Type1"),
                                 NameObject("/BaseFont"): NameObject("/Helvetica")})
        fonts = DictionaryObject({NameObject("/F1"): writer._add_object(font)})
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
        escaped = [line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
                   for line in text.split("\n")]
        stream = DecodedStreamObject()
        stream.set_data(("BT /F1 11 Tf 72 720 Td "
                         + "".join(f"({line}) Tj 0 -13 Td " for line in escaped) + "ET").encode())
        page[NameObject("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypted_pdf() -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(["A secret plan"]))))
    writer.encrypt("hunter2", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def owner_locked_pdf() -> bytes:
    """Encrypted with an owner password only (an empty user password): opens as usual."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(["Open to read"]))))
    writer.encrypt("", owner_password="owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def truncated_pdf() -> bytes:
    data = text_pdf(["First page", "Second page"])
    return data[: len(data) // 2]


def image_only_pdf() -> bytes:
    """A scan: one page that is a picture, no text layer."""
    out = io.BytesIO()
    Image.new("RGB", (300, 400), "white").save(out, "PDF")
    return out.getvalue()


BAD_IMAGES = {
    "truncated.png": truncated_png,
    "huge.png": lambda: png_declaring(20_000, 20_000),
    "notes.jpg": text_named_jpg,
    "animated.gif": animated_gif,
}
BAD_PDFS = {
    "encrypted.pdf": encrypted_pdf,
    "truncated.pdf": truncated_pdf,
    "scan.pdf": image_only_pdf,
}


def write_corpus(folder: Path) -> dict[str, Path]:
    """Every corpus file under `folder`, by name (the bad ones, a CMYK JPEG, a good PNG)."""
    folder.mkdir(parents=True, exist_ok=True)
    makers = {**BAD_IMAGES, **BAD_PDFS, "cmyk.jpg": cmyk_jpeg, "good.png": png}
    paths = {}
    for name, make in makers.items():
        paths[name] = folder / name
        paths[name].write_bytes(make())
    return paths
