"""Render packaging/icons/outrider.svg into the PNG, .ico and .icns files the bundles use.

    .venv/bin/python packaging/make_icons.py          # writes next to the SVG
    .venv/bin/python packaging/make_icons.py OUT_DIR

Qt's own SVG renderer draws the PNGs, so no other imaging library is needed. The .ico and
.icns files are plain containers of PNG images (Windows Vista and macOS 10.7 onwards read
PNG entries), written here with `struct`: Pillow is not a dependency. The outputs are small
and kept in git, because `outrider install-desktop-entry` (runtime, which never imports Qt)
copies the PNGs as they are.

Worked example of the .ico layout for two images (little-endian):

    00 00 01 00 02 00                 reserved, type 1 (icon), 2 images
    10 10 00 00 01 00 20 00 <size> <offset>   16×16, 1 plane, 32 bpp
    00 00 00 00 01 00 20 00 <size> <offset>   0 means 256×256
    <png bytes of 16×16><png bytes of 256×256>
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "icons"
SVG = HERE / "outrider.svg"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# icns entry types that hold PNG data, by pixel size (the @2x types repeat a size).
ICNS_TYPES = (
    (b"icp4", 16), (b"icp5", 32), (b"icp6", 64), (b"ic07", 128), (b"ic08", 256),
    (b"ic09", 512), (b"ic10", 1024), (b"ic11", 32), (b"ic12", 64), (b"ic13", 256),
    (b"ic14", 512),
)


def render_png(svg: Path, size: int) -> bytes:
    """The SVG drawn at `size`×`size` pixels, as PNG bytes (transparent background)."""
    from PySide6 import QtCore, QtGui, QtSvg

    renderer = QtSvg.QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg} is not a valid SVG")
    image = QtGui.QImage(size, size, QtGui.QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(QtCore.Qt.GlobalColor.transparent)
    painter = QtGui.QPainter(image)
    painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QtGui.QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter, QtCore.QRectF(0, 0, size, size))
    painter.end()
    data = QtCore.QByteArray()
    buffer = QtCore.QBuffer(data)
    buffer.open(QtCore.QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buffer, "PNG"):
        raise SystemExit(f"could not encode a {size}px PNG")
    buffer.close()
    return bytes(data.data())


def ico_bytes(pngs: dict[int, bytes]) -> bytes:
    """A Windows .ico holding each PNG as one image (sizes up to 256)."""
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(header) + 16 * len(sizes)
    entries, blobs = b"", b""
    for size in sizes:
        blob = pngs[size]
        dim = 0 if size >= 256 else size  # one byte: 0 stands for 256
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(blob), offset)
        offset += len(blob)
        blobs += blob
    return header + entries + blobs


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    """A macOS .icns: 'icns', total length, then (type, length incl. 8-byte header, PNG)."""
    body = b"".join(kind + struct.pack(">I", len(pngs[size]) + 8) + pngs[size]
                    for kind, size in ICNS_TYPES)
    return b"icns" + struct.pack(">I", len(body) + 8) + body


def _write_if_changed(path: Path, data: bytes) -> None:
    # Leave identical files alone, so a rebuild does not touch files kept in git.
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else HERE
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6 import QtGui

    _app = QtGui.QGuiApplication.instance() or QtGui.QGuiApplication(["make_icons"])
    every = sorted({*PNG_SIZES, *ICO_SIZES, *(size for _, size in ICNS_TYPES)})
    pngs = {size: render_png(SVG, size) for size in every}
    for size in PNG_SIZES:
        _write_if_changed(out / f"outrider-{size}.png", pngs[size])
    _write_if_changed(out / "outrider.ico", ico_bytes({s: pngs[s] for s in ICO_SIZES}))
    _write_if_changed(out / "outrider.icns", icns_bytes(pngs))
    print(f"icons written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
