"""Start-up on a machine without Qt's xcb libraries: one message that names the packages and
exit status 1, before Qt is loaded (Qt itself would abort with a generic message)."""

from __future__ import annotations

import pytest

from app import main as app_main


def fake_loader(missing: set[str]):
    def load(name: str) -> object:
        if name in missing:
            raise OSError(f"{name}: cannot open shared object file")
        return object()
    return load


def test_a_missing_xcb_library_is_named_with_its_packages(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    load = fake_loader({"libxcb-icccm.so.4", "libxcb-keysyms.so.1"})
    check = app_main.missing_xcb_libraries
    monkeypatch.setattr(app_main, "missing_xcb_libraries", lambda: check({}, "linux", load))
    monkeypatch.setattr(app_main, "_qt_has_xcb_plugin", lambda: True)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)

    assert app_main.main(["--no-model"]) == 1
    err = capsys.readouterr().err
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1" in err
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in err
    assert "sudo dnf install xcb-util-wm xcb-util-keysyms" in err


def test_only_the_xcb_platform_on_linux_is_checked() -> None:
    everything = fake_loader({lib for lib, _, _ in app_main.XCB_LIBRARIES})
    assert len(app_main.missing_xcb_libraries({}, "linux", everything)) == 8
    assert app_main.missing_xcb_libraries({"QT_QPA_PLATFORM": "xcb"}, "linux", everything)
    assert app_main.missing_xcb_libraries({"QT_QPA_PLATFORM": "offscreen"}, "linux",
                                          everything) == []
    assert app_main.missing_xcb_libraries({"QT_QPA_PLATFORM": "wayland"}, "linux",
                                          everything) == []
    assert app_main.missing_xcb_libraries({}, "darwin", everything) == []
    assert app_main.missing_xcb_libraries({}, "linux", fake_loader(set())) == []


def test_libraries_shared_by_one_package_name_it_once() -> None:
    libs = [e for e in app_main.XCB_LIBRARIES if e[2] == "libxcb"]
    assert "install libxcb\n" in app_main.xcb_advice(libs) + "\n"
