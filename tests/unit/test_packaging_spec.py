"""packaging/: the PyInstaller spec keeps the Qt modules the app imports and leaves out the
big unused ones; the frozen entry point dispatches engine and app; the icons are real images.
(Building the bundle takes minutes: `make package-test` does that, not `make test`.)"""

from __future__ import annotations

import ast
import importlib.util
import re
import struct
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"


def _spec_constants() -> dict[str, Any]:
    """Run only the spec's constant assignments (the rest needs PyInstaller's build)."""
    tree = ast.parse((PACKAGING / "outrider.spec").read_text(encoding="utf-8"))
    wanted = {"QT_EXCLUDES", "PY_EXCLUDES", "QT_FILE_EXCLUDES"}
    body = [node for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in wanted for t in node.targets)]
    namespace: dict[str, Any] = {"re": re}
    exec(compile(ast.Module(body=body, type_ignores=[]), "outrider.spec", "exec"), namespace)
    assert wanted <= namespace.keys()
    return namespace


def _qt_modules_imported_by_app() -> set[str]:
    found = set()
    for path in (ROOT / "app").rglob("*.py"):
        if path.name == "screenshots.py":  # a development tool, not in the bundle
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "PySide6":
                found |= {f"PySide6.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("PySide6."):
                found.add(node.module or "")
    return found


def test_spec_excludes_the_big_unused_qt_modules() -> None:
    excludes = set(_spec_constants()["QT_EXCLUDES"])
    for name in ("QtWebEngineCore", "QtWebEngineWidgets", "Qt3DCore", "QtMultimedia", "QtQuick",
                 "QtQml", "QtPdf", "QtCharts", "QtDesigner", "QtTest"):
        assert f"PySide6.{name}" in excludes


def test_spec_keeps_every_qt_module_the_app_and_pyqtgraph_import() -> None:
    excludes = set(_spec_constants()["QT_EXCLUDES"])
    used = _qt_modules_imported_by_app()
    assert {"PySide6.QtCore", "PySide6.QtWidgets"} <= used
    # pyqtgraph's PlotCurveItem imports these unconditionally; it uses QtSvg for export.
    used |= {"PySide6.QtOpenGL", "PySide6.QtOpenGLWidgets", "PySide6.QtSvg"}
    assert not used & excludes


@pytest.mark.parametrize(("path", "dropped"), [
    ("PySide6/Qt/translations/qtbase_de.qm", True),
    ("PySide6/Qt/plugins/platforms/libqvnc.so", True),
    ("PySide6/Qt/plugins/platformthemes/libqgtk3.so", True),
    ("PySide6/Qt/plugins/platforms/libqxcb.so", False),
    ("PySide6/Qt/plugins/platforms/libqoffscreen.so", False),  # the self-test needs it
    ("PySide6/Qt/plugins/platforms/libqwayland.so", False),
    ("PySide6/Qt/plugins/iconengines/libqsvgicon.so", False),
])
def test_spec_file_filter(path: str, dropped: bool) -> None:
    pattern = _spec_constants()["QT_FILE_EXCLUDES"]
    assert bool(pattern.search(path)) is dropped


def test_entry_runs_the_engine_cli(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("outrider_frozen_entry", PACKAGING / "entry.py")
    assert spec is not None and spec.loader is not None
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    assert entry.main(["--engine", "--version"]) == 0
    assert capsys.readouterr().out.startswith("outrider ")
    assert entry.main(["-m", "pip", "download", "x"]) == 2  # never a second window
    assert "not available in the packaged app" in capsys.readouterr().err


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_icons_are_what_their_names_say() -> None:
    icons = PACKAGING / "icons"
    for size in (16, 24, 32, 48, 64, 128, 256, 512):
        assert _png_size((icons / f"outrider-{size}.png").read_bytes()) == (size, size)
    ico = (icons / "outrider.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", ico[:6])
    assert (reserved, kind) == (0, 1) and count >= 5
    icns = (icons / "outrider.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
