"""Images in requests: the one reader every dialect's image parts go through.

A client sends an image as a `data:` URI (OpenAI's `image_url`, the Responses API's
`input_image`), as bare base64 (Ollama's `images`, Anthropic's `base64` source), or as an
http(s) URL, which is fetched only when the server was started with `--allow-remote-images`
(a local server fetching what a request names is a way into the user's network). Whatever the
route, the bytes are checked and normalised by `runtime.media.images` before the engine sees
them, so a bad image is a one-line 400 naming where it was:

    >>> image_from_url("data:text/plain;base64,aGk=", where="messages.0.content.1")
    Traceback (most recent call last):
    runtime.errors.ImageError: messages.0.content.1: not an image Outrider can read (PNG, JPEG, WebP, GIF, BMP or TIFF)
    >>> image_from_url("https://example.com/cat.png", where="messages.0.content.1")
    Traceback (most recent call last):
    runtime.errors.ImageError: messages.0.content.1: this server does not fetch images from URLs; send the image as a data: URI (base64), or start the server with --allow-remote-images
"""

from __future__ import annotations

import base64
import binascii

import httpx

from runtime.errors import ImageError
from runtime.media.images import MAX_BYTES, normalized_rgb
from runtime.units import fmt_bytes

FETCH_TIMEOUT_S = 10.0
NO_REMOTE = ("this server does not fetch images from URLs; send the image as a data: URI "
             "(base64), or start the server with --allow-remote-images")


def image_from_url(url: str, *, where: str, allow_remote: bool = False) -> bytes:
    """The checked bytes of the image a `data:` URI holds, or (when allowed) an http(s) URL
    points at."""
    text = url.strip()
    if text[:5].lower() == "data:":
        header, comma, payload = text[5:].partition(",")
        if not comma or not header.lower().endswith(";base64"):
            raise ImageError(f"{where}: a data: URI image must be base64 "
                             "(data:image/png;base64,...)")
        return image_from_base64(payload, where=where)
    if text[:7].lower() == "http://" or text[:8].lower() == "https://":
        if not allow_remote:
            raise ImageError(f"{where}: {NO_REMOTE}")
        return _checked(_fetch(text, where), where)
    raise ImageError(f"{where}: an image URL must be a data: URI (base64) or http(s)")


def image_from_base64(data: str, *, where: str) -> bytes:
    """The checked bytes of base64-encoded image data."""
    if len(data) > MAX_BYTES * 4 // 3 + 4:
        raise ImageError(f"{where}: the image is larger than {fmt_bytes(MAX_BYTES)}")
    try:
        raw = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: the image data is not valid base64") from None
    return _checked(raw, where)


def _checked(raw: bytes, where: str) -> bytes:
    try:
        return normalized_rgb(raw)
    except ImageError as exc:
        raise ImageError(f"{where}: {exc}") from None


def _fetch(url: str, where: str) -> bytes:
    """GET `url`, at most `MAX_BYTES`, within `FETCH_TIMEOUT_S`."""
    try:
        with httpx.stream("GET", url, timeout=FETCH_TIMEOUT_S, follow_redirects=True) as reply:
            if reply.status_code != 200:
                raise ImageError(f"{where}: fetching the image answered HTTP {reply.status_code}")
            chunks, size = [], 0
            for chunk in reply.iter_bytes():
                size += len(chunk)
                if size > MAX_BYTES:
                    raise ImageError(f"{where}: the image is larger than {fmt_bytes(MAX_BYTES)}")
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise ImageError(f"{where}: the image could not be fetched ({type(exc).__name__})") from None
    return b"".join(chunks)
