"""Images a message carries: checked before anything decodes them for real, and normalised to
what the projector's loader reads (mtmd decodes with stb_image: PNG and JPEG in RGB are safe).

    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (64, 48), "red").save(buf, "PNG")
    >>> info = check_image(buf.getvalue())
    >>> info.format, info.width, info.height, len(info.sha256)
    ('PNG', 64, 48, 64)
    >>> normalized_rgb(buf.getvalue()) == buf.getvalue()   # already what mtmd reads
    True
    >>> check_image(b"hello, I am text in a file called photo.jpg")
    Traceback (most recent call last):
    runtime.errors.ImageError: not an image Outrider can read (PNG, JPEG, WebP, GIF, BMP or TIFF)

Why the size check comes before decoding: `Image.open` reads only the header, so a 20,000 ×
20,000 PNG of a few hundred bytes (400 million pixels, 1.2 GB once decoded) is refused from
its header alone. Pillow's own guard (`Image.MAX_IMAGE_PIXELS`, ~89 M) is a process-wide
setting; `max_pixels` is this call's.
"""

from __future__ import annotations

import hashlib
import io
import struct
import zlib
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from runtime.errors import ImageError
from runtime.units import MIB, fmt_bytes

MAX_BYTES = 20 * MIB
MAX_PIXELS = 50_000_000
# The decoders Pillow may use: the common still-image formats, never EPS (Ghostscript) or the
# other exotic parsers Pillow would otherwise try on whatever bytes it is given.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
NOT_AN_IMAGE = "not an image Outrider can read (PNG, JPEG, WebP, GIF, BMP or TIFF)"
ANIMATED = "animated images are not supported; attach a still frame"
DAMAGED = "the image is damaged or cut short (truncated)"
# Modes stb_image reads as they are; anything else is converted to RGB.
_PLAIN_MODES = ("RGB", "L")
_JPEG_QUALITY = 95


@dataclass(frozen=True)
class ImageInfo:
    """A checked image: its format as Pillow names it ("PNG", "JPEG", "MPO" …), its size in
    pixels and the sha256 of its bytes (the name it is stored under, the key of its cells)."""

    format: str
    width: int
    height: int
    sha256: str


def check_image(data: bytes, *, max_bytes: int = MAX_BYTES,
                max_pixels: int = MAX_PIXELS) -> ImageInfo:
    """The facts of `data` when it is one still image Outrider can use, else `ImageError`
    with a one-line reason: too many bytes, not an image, too many pixels, animated, damaged."""
    if len(data) > max_bytes:
        raise ImageError(f"the image is {fmt_bytes(len(data))}; the limit is {fmt_bytes(max_bytes)}")
    with _opened(data, max_pixels) as image:
        width, height = image.size
        if width * height > max_pixels:
            raise ImageError(f"the image is {width:,} × {height:,} pixels "
                             f"({width * height / 1e6:.0f} megapixels); the limit is "
                             f"{max_pixels / 1e6:.0f} megapixels")
        if _frames(image) > 1 and image.format != "MPO":  # MPO: a phone photo + its depth map
            raise ImageError(ANIMATED)
        _decode(image)
        return ImageInfo(str(image.format), width, height, hashlib.sha256(data).hexdigest())


def normalized_rgb(data: bytes, *, max_bytes: int = MAX_BYTES,
                   max_pixels: int = MAX_PIXELS) -> bytes:
    """`data` as PNG or JPEG bytes in RGB (or grey), upright, that mtmd's loader reads.

    A PNG or JPEG already in RGB or grey with no EXIF rotation comes back unchanged (the
    same bytes, the same sha256). Anything else is converted: CMYK JPEGs to RGB JPEG,
    transparency laid on white, 16-bit grey scaled to 8 bits, WebP / GIF / BMP / TIFF and
    the rest to PNG. Raises `ImageError` as `check_image` does.
    """
    info = check_image(data, max_bytes=max_bytes, max_pixels=max_pixels)
    with _opened(data, max_pixels) as image:
        orientation = image.getexif().get(0x0112, 1)  # EXIF Orientation; 1 = upright
        if info.format in ("PNG", "JPEG") and image.mode in _PLAIN_MODES and orientation == 1:
            return data
        _decode(image)
        upright = ImageOps.exif_transpose(image) if orientation != 1 else image
        rgb = _to_rgb(upright)
        out = io.BytesIO()
        if info.format in ("JPEG", "MPO"):  # a photo stays a photo (PNG would be 5x larger)
            rgb.save(out, "JPEG", quality=_JPEG_QUALITY)
        else:
            rgb.save(out, "PNG")
        return out.getvalue()


def mime_type(data: bytes) -> str:
    """The media type of encoded image bytes, from their signature (what a data: URL says).

    >>> mime_type(b"\\x89PNG\\r\\n\\x1a\\n..."), mime_type(b"\\xff\\xd8\\xff\\xe0..."), mime_type(b"GIF89a")
    ('image/png', 'image/jpeg', 'image/gif')
    """
    for signature, mime in ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
                            (b"GIF8", "image/gif"), (b"BM", "image/bmp")):
        if data.startswith(signature):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    return "application/octet-stream"


def _opened(data: bytes, max_pixels: int = MAX_PIXELS) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:  # past Pillow's own limit, read from the header too
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise ImageError(f"the image has more than {limit / 1e6:.0f} megapixels; the limit is "
                         f"{max_pixels / 1e6:.0f} megapixels") from None
    except UnidentifiedImageError:
        raise ImageError(NOT_AN_IMAGE) from None
    except (OSError, SyntaxError, ValueError, struct.error, zlib.error):
        raise ImageError(DAMAGED) from None


def _frames(image: Image.Image) -> int:
    try:
        return int(getattr(image, "n_frames", 1))
    except (OSError, SyntaxError, ValueError, EOFError, struct.error):  # frames cut short
        raise ImageError(DAMAGED) from None


def _decode(image: Image.Image) -> None:
    """Decode every pixel: a truncated file fails here, not later in the engine."""
    try:
        image.seek(0)
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error):
        raise ImageError(DAMAGED) from None


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB (or L) pixels: alpha laid on white, 16/32-bit grey scaled down, palettes expanded."""
    if image.mode in _PLAIN_MODES:
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        return image.convert("I").point(lambda v: v / 256).convert("L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
