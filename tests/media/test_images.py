"""Images: the bad-image corpus is refused with one line each; a CMYK JPEG is accepted and
normalised to RGB that mtmd's loader reads; good PNG/JPEG bytes pass through unchanged."""

from __future__ import annotations

import doctest
import hashlib
import io

import pytest
from PIL import Image

from runtime.errors import ImageError, OutriderError
from runtime.media import images
from runtime.media.images import check_image, mime_type, normalized_rgb
from tests.media import corpus


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(images).failed == 0


@pytest.mark.parametrize(("name", "words"), [
    ("truncated.png", "damaged or cut short"),
    ("huge.png", "megapixels"),
    ("notes.jpg", "not an image"),
    ("animated.gif", "animated images are not supported; attach a still frame"),
])
def test_each_bad_image_is_one_line_that_says_why(name: str, words: str) -> None:
    with pytest.raises(ImageError) as caught:
        check_image(corpus.BAD_IMAGES[name]())
    message = str(caught.value)
    assert words in message
    assert "\n" not in message and len(message) < 120
    assert isinstance(caught.value, OutriderError)


def test_a_declared_20000_square_png_is_refused_from_its_header() -> None:
    bomb = corpus.png_declaring(20_000, 20_000)
    assert len(bomb) < 1_000  # never decoded: 1.2 GB of pixels from under a kilobyte
    with pytest.raises(ImageError, match="the limit is 50 megapixels"):
        check_image(bomb)


def test_our_pixel_limit_applies_below_pillows_own() -> None:
    with pytest.raises(ImageError, match=r"8,000 × 8,000 pixels \(64 megapixels\)"):
        check_image(corpus.png_declaring(8_000, 8_000))
    assert check_image(corpus.png(300, 200), max_pixels=60_000).width == 300
    with pytest.raises(ImageError, match="the limit is 0 megapixels"):
        check_image(corpus.png(300, 200), max_pixels=50_000)


def test_too_many_bytes_is_refused_before_decoding() -> None:
    with pytest.raises(ImageError, match=r"the limit is 1\.00 KiB"):
        check_image(corpus.png(400, 400, "white") + b"\x00" * 2048, max_bytes=1024)


def test_an_animated_png_is_refused_and_a_one_frame_gif_accepted() -> None:
    frames = [Image.new("RGB", (10, 10), c) for c in ("red", "blue")]
    apng = io.BytesIO()
    frames[0].save(apng, "PNG", save_all=True, append_images=frames[1:])
    with pytest.raises(ImageError, match="animated"):
        check_image(apng.getvalue())
    still = io.BytesIO()
    frames[0].save(still, "GIF")
    assert check_image(still.getvalue()).format == "GIF"


def test_a_cmyk_jpeg_is_accepted_and_normalised_to_an_rgb_jpeg() -> None:
    data = corpus.cmyk_jpeg()
    info = check_image(data)
    assert (info.format, info.width, info.height) == ("JPEG", 40, 30)
    out = normalized_rgb(data)
    image = Image.open(io.BytesIO(out))
    assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (40, 30))
    red, green, blue = image.getpixel((20, 15))  # type: ignore[misc]
    assert red > 200 and green < 60 and blue < 60
    assert mime_type(out) == "image/jpeg"


def test_good_png_and_jpeg_pass_through_byte_for_byte() -> None:
    data = corpus.png()
    assert normalized_rgb(data) is data
    jpeg = io.BytesIO()
    Image.new("RGB", (16, 16), "navy").save(jpeg, "JPEG")
    assert normalized_rgb(jpeg.getvalue()) == jpeg.getvalue()
    assert check_image(data).sha256 == hashlib.sha256(data).hexdigest()


def test_transparency_is_laid_on_white_and_webp_becomes_png() -> None:
    clear = io.BytesIO()
    Image.new("RGBA", (8, 8), (0, 0, 0, 0)).save(clear, "PNG")
    out = Image.open(io.BytesIO(normalized_rgb(clear.getvalue())))
    assert (out.format, out.mode, out.getpixel((0, 0))) == ("PNG", "RGB", (255, 255, 255))
    webp = io.BytesIO()
    Image.new("RGB", (8, 8), "green").save(webp, "WEBP")
    converted = normalized_rgb(webp.getvalue())
    assert mime_type(converted) == "image/png"
    assert check_image(converted).format == "PNG"


def test_an_exif_rotated_photo_comes_back_upright() -> None:
    photo = Image.new("RGB", (40, 20), "white")
    exif = photo.getexif()
    exif[0x0112] = 6  # rotated 90° clockwise: upright it is 20 wide, 40 tall
    data = io.BytesIO()
    photo.save(data, "JPEG", exif=exif)
    out = Image.open(io.BytesIO(normalized_rgb(data.getvalue())))
    assert out.size == (20, 40)


def test_sixteen_bit_grey_is_scaled_not_clipped() -> None:
    grey = Image.new("I;16", (4, 4), 32768)
    data = io.BytesIO()
    grey.save(data, "PNG")
    out = Image.open(io.BytesIO(normalized_rgb(data.getvalue())))
    assert out.mode == "L" and out.getpixel((0, 0)) == 128


def test_exotic_formats_are_not_parsed() -> None:
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(ImageError, match="not an image"):
        check_image(eps)
