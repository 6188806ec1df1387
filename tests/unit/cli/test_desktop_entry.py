"""`outrider install-desktop-entry`: the desktop file and icons land in the XDG data home with
an Exec line that runs this install; `--remove` takes them away again."""

from __future__ import annotations

import configparser
import doctest
import sys
from pathlib import Path

import pytest

from runtime.cli import desktop as cli_desktop
from runtime.cli.desktop import (
    ICON_SIZES,
    exec_value,
    install_desktop_entry,
    packaging_dir,
    remove_desktop_entry,
)
from runtime.cli.main import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="desktop entries are a Linux feature")


def _entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser["Desktop Entry"]


def test_install_writes_entry_and_every_icon(tmp_path: Path) -> None:
    entry = install_desktop_entry(tmp_path, ["/opt/My Apps/Outrider/Outrider"])

    assert entry.desktop_file == tmp_path / "applications" / "outrider.desktop"
    fields = _entry(entry.desktop_file)
    assert fields["Exec"] == '"/opt/My Apps/Outrider/Outrider"'
    assert fields["TryExec"] == "/opt/My Apps/Outrider/Outrider"
    assert fields["Icon"] == "outrider" and fields["Type"] == "Application"
    assert "Path" not in fields
    hicolor = tmp_path / "icons" / "hicolor"
    expected = {hicolor / f"{n}x{n}" / "apps" / "outrider.png" for n in ICON_SIZES}
    expected.add(hicolor / "scalable" / "apps" / "outrider.svg")
    assert set(entry.icons) == expected
    for n in ICON_SIZES:
        png = hicolor / f"{n}x{n}" / "apps" / "outrider.png"
        assert png.read_bytes() == (packaging_dir() / "icons" / f"outrider-{n}.png").read_bytes()
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_python_m_fallback_sets_the_working_folder(tmp_path: Path) -> None:
    entry = install_desktop_entry(tmp_path, ["/usr/bin/python3", "-m", "app.main"],
                                  workdir=Path("/src/outrider"))
    fields = _entry(entry.desktop_file)
    assert fields["Exec"] == "/usr/bin/python3 -m app.main"
    assert fields["Path"] == "/src/outrider"


def test_cli_installs_into_xdg_data_home_and_removes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert main(["install-desktop-entry"]) == 0
    desktop = tmp_path / "applications" / "outrider.desktop"
    argv, _ = cli_desktop.app_command()
    assert _entry(desktop)["Exec"] == exec_value(argv)
    assert Path(argv[0]).is_absolute() and Path(argv[0]).exists()
    assert "installed" in capsys.readouterr().out

    assert main(["install-desktop-entry", "--remove"]) == 0
    assert not desktop.exists()
    assert not list((tmp_path / "icons").rglob("outrider.*"))


def test_reinstall_replaces_the_exec_line(tmp_path: Path) -> None:
    install_desktop_entry(tmp_path, ["/old/Outrider"])
    entry = install_desktop_entry(tmp_path, ["/new/Outrider"])
    assert _entry(entry.desktop_file)["Exec"] == "/new/Outrider"
    assert remove_desktop_entry(tmp_path) and not remove_desktop_entry(tmp_path)


def test_missing_packaging_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(cli_desktop.DesktopEntryError, match="packaging/ folder"):
        install_desktop_entry(tmp_path / "home", ["/x"], source=tmp_path / "nowhere")


@pytest.mark.parametrize(("argv", "value"), [
    (["/a/b"], "/a/b"),
    (["/a b/c", "--x"], '"/a b/c" --x'),
    (['/a"b'], '"/a\\\\"b"'),  # quote escaped by a backslash, which the value escape doubles
    (["/a/50%"], "/a/50%%"),
])
def test_exec_quoting(argv: list[str], value: str) -> None:
    assert exec_value(argv) == value


def test_docstring_examples() -> None:
    assert doctest.testmod(cli_desktop).failed == 0


def test_relative_xdg_data_home_is_ignored() -> None:
    assert cli_desktop.data_home({"XDG_DATA_HOME": "rel/dir"}) == Path.home() / ".local" / "share"
    assert cli_desktop.data_home({"XDG_DATA_HOME": "/x"}) == Path("/x")
