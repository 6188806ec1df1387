"""`outrider install-desktop-entry`: put Outrider in the Linux application menu.

    $ outrider install-desktop-entry            # source install: runs this venv's outrider-app
    $ ./Outrider --engine install-desktop-entry # the unpacked bundle: runs that Outrider
    $ outrider install-desktop-entry --remove

Copies `packaging/outrider.desktop` to `$XDG_DATA_HOME/applications/` (default
`~/.local/share`) with Exec pointing at this very install, and the icons to
`$XDG_DATA_HOME/icons/hicolor/<N>x<N>/apps/outrider.png` (and `scalable/apps/outrider.svg`).
The icons are pre-rendered PNGs kept in `packaging/icons/` (packaging/make_icons.py draws
them with Qt; this module must not import Qt). Desktops watch these folders, so no cache
needs refreshing: the entry appears within seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.atomic_file import write_bytes
from runtime.errors import DesktopEntryError

DESKTOP_ID = "outrider"  # app/main.py sets the same desktop file name on the QApplication
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
# Characters that force an Exec argument into double quotes (Desktop Entry Specification,
# "The Exec key"); inside the quotes, these four take a backslash.
_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")
_EXEC_ESCAPED_IN_QUOTES = set('"`$\\')


@dataclass(frozen=True)
class DesktopEntry:
    """The files one installation wrote."""

    desktop_file: Path
    icons: tuple[Path, ...]


def packaging_dir() -> Path:
    """`packaging/` beside `runtime/`: in a source checkout, and inside the bundle, whose spec
    copies the desktop file and icons to the same relative place."""
    return Path(__file__).resolve().parents[2] / "packaging"


def data_home(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_DATA_HOME`, or `~/.local/share` when unset or relative (as the spec says)."""
    value = (os.environ if env is None else env).get("XDG_DATA_HOME", "")
    return Path(value) if value and os.path.isabs(value) else Path.home() / ".local" / "share"


def app_command() -> tuple[list[str], Path | None]:
    """The command that opens this install's app, and the folder it must start in (if any).

    Frozen: the bundle's executable. Installed (editable or not): the `outrider-app` script
    beside this Python. Otherwise `python -m app.main` from the checkout.
    """
    if getattr(sys, "frozen", False):
        return [sys.executable], None
    script = Path(sys.executable).parent / ("outrider-app.exe" if os.name == "nt" else "outrider-app")
    if script.is_file():
        return [str(script)], None
    return [sys.executable, "-m", "app.main"], Path(__file__).resolve().parents[2]


def exec_value(argv: Sequence[str]) -> str:
    """The value of an `Exec=` key that runs `argv`, quoted and escaped as the spec asks.

    >>> exec_value(["/opt/Outrider/Outrider"])
    '/opt/Outrider/Outrider'
    >>> exec_value(["/home/ann/my apps/outrider-app", "--no-model"])
    '"/home/ann/my apps/outrider-app" --no-model'
    >>> exec_value(["/srv/$HOME/run"])  # quoted, `$` escaped, then that backslash doubled
    '"/srv/\\\\\\\\$HOME/run"'
    >>> exec_value(["/data/100%/app"])  # a literal % is written %%
    '/data/100%%/app'
    """
    words = []
    for arg in argv:
        if any(ch in _EXEC_RESERVED for ch in arg):
            arg = '"' + "".join("\\" + ch if ch in _EXEC_ESCAPED_IN_QUOTES else ch
                                for ch in arg) + '"'
        words.append(arg.replace("%", "%%"))
    # The string-value escape applies on top of the quoting rule: each backslash doubles.
    return " ".join(words).replace("\\", "\\\\")


def render_entry(template: str, argv: Sequence[str], workdir: Path | None) -> str:
    """`template` (packaging/outrider.desktop) with Exec, TryExec and Path set for `argv`."""
    lines = []
    for line in template.splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "Exec":
            line = f"Exec={exec_value(argv)}"
        elif key == "TryExec":
            line = "TryExec=" + argv[0].replace("\\", "\\\\")
        elif key == "Path":
            continue
        lines.append(line)
        if key == "Exec" and workdir is not None:
            lines.append("Path=" + str(workdir).replace("\\", "\\\\"))
    return "\n".join(lines) + "\n"


def _icon_files(source: Path) -> list[tuple[Path, str]]:
    """(source icon, path under icons/hicolor/) pairs."""
    icons = source / "icons"
    pairs = [(icons / f"{DESKTOP_ID}-{n}.png", f"{n}x{n}/apps/{DESKTOP_ID}.png")
             for n in ICON_SIZES]
    pairs.append((icons / f"{DESKTOP_ID}.svg", f"scalable/apps/{DESKTOP_ID}.svg"))
    return pairs


def install_desktop_entry(target: Path, argv: Sequence[str], workdir: Path | None = None,
                          source: Path | None = None) -> DesktopEntry:
    """Write the desktop file and icons under `target` (an XDG data home).

    Replaces an earlier installation's files, so running it again after moving the bundle
    points the menu entry at the new place.
    """
    source = source or packaging_dir()
    template_path = source / f"{DESKTOP_ID}.desktop"
    icons = _icon_files(source)
    missing = [p for p in [template_path, *(src for src, _ in icons)] if not p.is_file()]
    if missing:
        raise DesktopEntryError(
            f"{missing[0]} is missing: install-desktop-entry needs the packaging/ folder of a "
            "source checkout or of the packaged app")
    desktop_file = target / "applications" / f"{DESKTOP_ID}.desktop"
    written = []
    try:
        desktop_file.parent.mkdir(parents=True, exist_ok=True)
        text = render_entry(template_path.read_text(encoding="utf-8"), argv, workdir)
        write_bytes(desktop_file, text.encode("utf-8"))  # a menu never reads half a file
        for src, rel in icons:
            dest = target / "icons" / "hicolor" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(dest, src.read_bytes())
            written.append(dest)
    except OSError as exc:
        raise DesktopEntryError(f"Could not write under {target}: {exc.strerror or exc}") from exc
    return DesktopEntry(desktop_file, tuple(written))


def remove_desktop_entry(target: Path) -> list[Path]:
    """Delete what `install_desktop_entry` wrote under `target`; returns the removed files."""
    candidates = [target / "applications" / f"{DESKTOP_ID}.desktop"]
    candidates += [target / "icons" / "hicolor" / rel for _, rel in _icon_files(packaging_dir())]
    removed = [p for p in candidates if p.is_file()]
    for path in removed:
        path.unlink()
    return removed


def register(subparsers: Any) -> None:
    cmd = subparsers.add_parser(
        "install-desktop-entry",
        help="add Outrider to the Linux application menu (desktop file and icons)")
    cmd.add_argument("--remove", action="store_true", help="remove the entry and icons instead")
    cmd.add_argument("--data-home", type=Path, default=None,
                     help="install under this folder instead of $XDG_DATA_HOME or ~/.local/share")
    cmd.set_defaults(handler=run_install_desktop_entry)


def run_install_desktop_entry(args: argparse.Namespace) -> int:
    if not sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        raise DesktopEntryError("desktop entries are for Linux and BSD desktops; on macOS "
                                "use Outrider.app, on Windows Outrider.exe")
    target = args.data_home or data_home()
    if args.remove:
        removed = remove_desktop_entry(target)
        print(f"removed {len(removed)} files" if removed else f"nothing to remove under {target}")
        return 0
    argv, workdir = app_command()
    entry = install_desktop_entry(target, argv, workdir)
    print(f"installed {entry.desktop_file} (Exec={exec_value(argv)})")
    print(f"installed {len(entry.icons)} icons under {target / 'icons' / 'hicolor'}")
    return 0
