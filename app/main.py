"""Start the desktop app: `outrider` (no subcommand), `outrider-app`, `python -m app.main`.

    outrider-app                     # opens the window; loads the default model if present
    outrider-app --model FILE.gguf   # loads that model instead
    outrider-app --no-model          # loads nothing (first-run page if the library is empty)
    outrider --self-test             # offscreen checks of the product (app.self_test), exit 0
    outrider --self-test --model F.gguf --fixtures DIR   # DIR: packaging/self_test_fixtures.py
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.library.default_model import SMOLLM2
from runtime.paths import UserDirs, user_dirs

if TYPE_CHECKING:  # Qt loads lazily: `outrider --version` must stay fast
    from app.qt import QtGui


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="outrider-app", description="Outrider desktop app")
    parser.add_argument("--model", type=Path, help="GGUF file to load at start")
    parser.add_argument("--no-model", action="store_true", help="start without loading a model")
    parser.add_argument("--self-test", action="store_true",
                        help="offscreen: check the product end to end (load, chat, structured "
                             "output, tools, embeddings, documents, router, vision, quantize, "
                             "worker, window), one line per check; exit 0 when all pass")
    parser.add_argument("--fixtures", type=Path, metavar="DIR",
                        help="with --self-test: the tiny models some checks need (written by "
                             "packaging/self_test_fixtures.py DIR)")
    args = parser.parse_args(list(argv))
    if args.fixtures is not None and not args.self_test:
        parser.error("--fixtures goes with --self-test")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.self_test:
        # start-up time: `--version` and `--help` load neither Qt nor the self-test
        from app.self_test import self_test_home

        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        # Found in the user's library (or fetched) before OUTRIDER_HOME moves to a temporary
        # folder for the test and the processes it starts.
        args.model = _self_test_model(args).expanduser().resolve()
        if args.fixtures is not None:
            args.fixtures = args.fixtures.expanduser().resolve()
        with self_test_home() as dirs:
            return _run(args, dirs)
    return _run(args, user_dirs())


# What Qt's xcb platform plugin (libqxcb.so) loads beyond libxcb itself, with the package
# that ships each: (library, Debian/Ubuntu package, Fedora package).
XCB_LIBRARIES = (
    ("libxcb-icccm.so.4", "libxcb-icccm4", "xcb-util-wm"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1", "xcb-util-keysyms"),
    ("libxcb-image.so.0", "libxcb-image0", "xcb-util-image"),
    ("libxcb-render-util.so.0", "libxcb-render-util0", "xcb-util-renderutil"),
    ("libxcb-cursor.so.0", "libxcb-cursor0", "xcb-util-cursor"),
    ("libxcb-shape.so.0", "libxcb-shape0", "libxcb"),
    ("libxcb-xkb.so.1", "libxcb-xkb1", "libxcb"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0", "libxkbcommon-x11"),
)


def missing_xcb_libraries(environ: dict[str, str] | os._Environ[str] = os.environ,
                          platform: str = sys.platform,
                          load: Callable[[str], object] = ctypes.CDLL) -> list[tuple[str, str, str]]:
    """The xcb plugin's libraries this machine lacks, when Qt is about to use that plugin
    (Linux, QT_QPA_PLATFORM unset or xcb); [] otherwise. Without them Qt aborts the process
    with "could not load the Qt platform plugin xcb" and no word on what to install. Each
    library is loaded by its soname (`ctypes.CDLL`, the dynamic loader's own search), so no
    `ldd` is needed:

        >>> missing_xcb_libraries({}, "linux", load=lambda name: None)
        []
        >>> missing_xcb_libraries({"QT_QPA_PLATFORM": "offscreen"}, "linux")
        []
    """
    if platform != "linux" or environ.get("QT_QPA_PLATFORM", "xcb").split(":")[0] != "xcb":
        return []
    missing = []
    for entry in XCB_LIBRARIES:
        try:
            load(entry[0])
        except OSError:
            missing.append(entry)
    return missing


def xcb_advice(missing: list[tuple[str, str, str]]) -> str:
    """What to tell the user about `missing` (see `missing_xcb_libraries`)."""
    debian = " ".join(dict.fromkeys(deb for _, deb, _ in missing))
    fedora = " ".join(dict.fromkeys(fed for _, _, fed in missing))
    names = ", ".join(lib for lib, _, _ in missing)
    return (f"Outrider cannot open its window: Qt's X11 (xcb) platform needs {names}, which "
            f"this system lacks. Install it and start Outrider again:\n"
            f"  Debian/Ubuntu: sudo apt-get install {debian}\n"
            f"  Fedora:        sudo dnf install {fedora}\n"
            "(or run under Wayland with QT_QPA_PLATFORM=wayland)")


def _qt_has_xcb_plugin() -> bool:
    spec = importlib.util.find_spec("PySide6")  # found, not imported: Qt is not loaded yet
    folders = spec.submodule_search_locations if spec is not None else None
    return any((Path(folder) / "Qt" / "plugins" / "platforms" / "libqxcb.so").is_file()
               for folder in folders or ())


def _run(args: argparse.Namespace, dirs: UserDirs) -> int:
    missing = missing_xcb_libraries() if _qt_has_xcb_plugin() else []
    if missing:
        print(xcb_advice(missing), file=sys.stderr)
        return 1
    # Qt is imported here, not at module level: `outrider --version` must stay fast.
    from app.chat.store import ChatStore
    from app.crash import CrashReporter, crash_if_asked
    from app.engine.client import EngineClient
    from app.gui_gc import collect_on_gui_thread
    from app.qt import QtCore, QtWidgets
    from app.services.settings import SettingsController
    from app.theme import apply_theme, palette_for
    from app.window import MainWindow
    from runtime.settings.user import SettingsStore

    reporter = CrashReporter(dirs.crash_reports)
    earlier_crashes = reporter.install()
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([sys.argv[0]])
    if not isinstance(app, QtWidgets.QApplication):
        raise RuntimeError("another kind of Qt application is already running in this process")
    collect_on_gui_thread()  # Qt objects must never be freed by a worker thread's collection
    app.setApplicationName("Outrider")
    app.setDesktopFileName("outrider")
    app.setWindowIcon(_app_icon())
    settings = SettingsController.open(SettingsStore(dirs.settings_file))  # a bad file: kept aside
    palette = palette_for(settings.settings.theme, app)
    apply_theme(app, palette)
    store = ChatStore(dirs.chats_db)
    client = EngineClient(log_dir=dirs.logs)
    library_default = user_dirs().models / SMOLLM2.library_path
    window = MainWindow(client, store, dirs, palette, default_model=library_default,
                        settings=settings)
    try:
        if args.self_test:
            # the self-test's checks load only when `--self-test` asks for them
            from app.self_test import run_self_test

            return run_self_test(app, window, args.model, args.fixtures, dirs)
        reporter.on_exception = lambda path, line: _notify_error(window, path, line)
        window.show()
        if earlier_crashes:
            _show_crash_reports(window, earlier_crashes)
        QtCore.QTimer.singleShot(0, crash_if_asked)  # OUTRIDER_DEBUG_CRASH: once the loop runs
        model = args.model or (library_default if library_default.is_file() else None)
        if model is not None and not args.no_model:
            window.load_model_file(model.expanduser().resolve())  # its remembered settings
        else:
            window.offer_first_run()
        return int(app.exec())
    finally:
        window.close()  # also stops the model services and writes unsaved settings
        store.close()
        reporter.uninstall()


def _app_icon() -> QtGui.QIcon:
    # packaging/icons lies beside app/ in a checkout and inside the PyInstaller bundle alike.
    from app.qt import QtGui

    icon = QtGui.QIcon()
    for png in sorted((Path(__file__).resolve().parent.parent / "packaging" / "icons")
                      .glob("outrider-*.png")):
        icon.addFile(str(png))
    return icon


def _self_test_model(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return Path(args.model)
    # start-up time, as above: the default model's fetcher only for `--self-test`
    from runtime.library.default_model import default_model_path

    return default_model_path()  # fetched (and checksum-verified) if missing


def _notify_error(window: object, path: Path, line: str) -> None:
    # start-up time: Qt loads in `main` only once past the quick flags
    from app.qt import QtWidgets

    if isinstance(window, QtWidgets.QMainWindow):
        window.statusBar().showMessage(f"Internal error: {line} (report saved to {path})", 20000)


def _show_crash_reports(window: object, reports: list[Path]) -> None:
    # start-up time: Qt loads in `main` only once past the quick flags
    from app.crash import read_report
    from app.qt import QtWidgets

    if not isinstance(window, QtWidgets.QWidget):
        return
    box = QtWidgets.QMessageBox(window)
    box.setIcon(QtWidgets.QMessageBox.Icon.Warning)
    box.setWindowTitle("Outrider closed unexpectedly")
    box.setText("Outrider crashed the last time it ran. Your chats were saved as they streamed.")
    box.setInformativeText(f"The report is kept in {reports[-1]}")
    box.setDetailedText(read_report(reports[-1]))
    box.open()


if __name__ == "__main__":
    sys.exit(main())
