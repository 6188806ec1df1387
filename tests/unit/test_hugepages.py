"""runtime.hugepages: the glibc tunable is set for the engine processes where it does
something, the user's setting wins, and the auto load mode reads a model into RAM only where
this process allocates on huge pages, on the CPU, with room to spare."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import pytest

import runtime.hugepages as hugepages
from runtime.hugepages import TUNABLE, huge_pages_default, weights_in_ram
from runtime.llama.params import LOAD_MODE_MMAP, LOAD_MODE_NONE, to_llama_params
from runtime.settings.load import LoadSettings

MIB = 1 << 20


def test_doctests() -> None:
    assert doctest.testmod(hugepages).failed == 0


@pytest.mark.parametrize(("mode", "glibc", "expected"), [
    ("madvise", (2, 35), TUNABLE),  # the first glibc with the tunable
    ("madvise", (2, 34), None),     # too old: the tunable is unknown there
    ("always", (2, 36), None),      # anonymous memory gets huge pages anyway
    ("never", (2, 36), None),
    (None, (2, 36), None),          # no THP (not Linux)
    ("madvise", None, None),        # another C library (musl)
])
def test_the_tunable_is_set_only_where_it_does_something(
        monkeypatch: pytest.MonkeyPatch, mode: str | None, glibc: tuple[int, int] | None,
        expected: str | None) -> None:
    monkeypatch.setattr(hugepages, "thp_mode", lambda: mode)  # None: what this machine says
    monkeypatch.setattr(hugepages, "glibc_version", lambda: glibc)
    env: dict[str, str] = {}
    assert huge_pages_default(env) == expected
    assert env.get("GLIBC_TUNABLES") == expected


def test_the_users_tunables_are_kept_and_their_hugetlb_wins() -> None:
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    huge_pages_default(env, mode="madvise", glibc=(2, 36))
    assert env["GLIBC_TUNABLES"].split(":") == ["glibc.malloc.arena_max=2", TUNABLE]
    env = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}
    assert huge_pages_default(env, mode="madvise", glibc=(2, 36)) is None
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}


def test_a_process_that_set_it_itself_does_not_count_as_on_huge_pages() -> None:
    env = {"GLIBC_TUNABLES": TUNABLE}
    assert hugepages.active(env, mode="madvise", set_here=False)
    assert not hugepages.active(env, mode="madvise", set_here=True)  # glibc read it already
    assert not hugepages.active({}, mode="madvise", set_here=False)
    assert not hugepages.active(env, mode="never", set_here=False)


def _model(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "m.gguf"
    with path.open("wb") as f:
        f.truncate(size)
    return path


def test_auto_reads_into_ram_only_on_huge_pages_on_the_cpu_with_room(tmp_path: Path) -> None:
    path = _model(tmp_path, 100 * MIB)
    assert weights_in_ram(path, 0, huge_pages=True, available=200 * MIB)
    assert not weights_in_ram(path, 0, huge_pages=True, available=199 * MIB)  # twice the file
    assert not weights_in_ram(path, 0, huge_pages=False, available=10_000 * MIB)
    assert not weights_in_ram(path, 1, huge_pages=True, available=10_000 * MIB)  # a GPU layer
    assert not weights_in_ram(tmp_path / "gone.gguf", 0, huge_pages=True, available=1 << 40)


@pytest.mark.parametrize(("use_mmap", "into_ram", "mode"), [
    (None, True, LOAD_MODE_NONE),   # auto, and reading is better here
    (None, False, LOAD_MODE_MMAP),  # auto elsewhere: mapped, llama.cpp's default
    (True, True, LOAD_MODE_MMAP),   # the user's choice wins
    (False, False, LOAD_MODE_NONE),
])
def test_the_load_mode_is_the_users_or_autos(monkeypatch: pytest.MonkeyPatch,
                                             use_mmap: bool | None, into_ram: bool,
                                             mode: int) -> None:
    import runtime.llama.params as params

    monkeypatch.setattr(params, "weights_in_ram", lambda path, gpu_layers: into_ram)
    settings = LoadSettings(model_path=Path("m.gguf"), use_mmap=use_mmap)
    assert to_llama_params(settings, 0, cpu_count=2).load_mode == mode


def test_reference_env_drops_only_the_tunable_outrider_set(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from runtime import openmp

    monkeypatch.setattr(hugepages, "_set_here", True)
    monkeypatch.setenv("GLIBC_TUNABLES", f"glibc.malloc.arena_max=2:{TUNABLE}")
    assert openmp.reference_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    monkeypatch.setenv("GLIBC_TUNABLES", TUNABLE)
    assert "GLIBC_TUNABLES" not in openmp.reference_env()
    monkeypatch.setattr(hugepages, "_set_here", False)  # the user's own: kept
    assert openmp.reference_env()["GLIBC_TUNABLES"] == TUNABLE


# Where Outrider's tunable does the work: THP in madvise mode (with "always" the kernel gives
# huge pages as it can, by its own defrag policy) and glibc 2.35 or later.
_WHERE_THE_TUNABLE_WORKS = pytest.mark.skipif(
    hugepages.thp_mode() != "madvise"
    or (hugepages.glibc_version() or (0, 0)) < hugepages.MIN_GLIBC,
    reason="the tunable is set only with THP in madvise mode and glibc 2.35 or later")


@_WHERE_THE_TUNABLE_WORKS
def test_an_engine_process_holds_the_default_model_on_huge_pages(default_model: Path) -> None:
    """A fresh interpreter (as an engine child starts) inherits the tunable from one that
    started as an engine process (`prepare_engine_process`, as `outrider serve` does), loads
    the default model with the auto load mode, and its weights sit on 2 MiB pages:
    AnonHugePages grows by most of the file's size."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    code = f"""
import os, subprocess, sys
from runtime.openmp import prepare_engine_process
prepare_engine_process()
child = '''
import runtime
from pathlib import Path
from runtime import hugepages
from runtime.engine.engine import Engine
from runtime.settings.load import LoadSettings
def huge():
    with open("/proc/self/smaps") as f:
        return sum(int(l.split()[1]) for l in f if l.startswith("AnonHugePages:")) * 1024
before = huge()
engine = Engine()
engine.load(LoadSettings(model_path=Path({str(default_model)!r}), n_ctx=256, gpu_layers=0))
print(hugepages.active(), huge() - before)
engine.stop()
'''
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                     check=True).stdout)
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=300).stdout.split()
    assert out[0] == "True"
    assert int(out[1]) >= default_model.stat().st_size // 2


@_WHERE_THE_TUNABLE_WORKS
def test_outrider_run_from_a_shell_starts_again_on_huge_pages(tmp_path: Path) -> None:
    """`outrider run` keeps its engine in its own process: started without the tunable, it
    runs again once with it (same pid, same arguments), and only then parses on."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, sys\n"
        "print(os.getpid(), os.environ.get('GLIBC_TUNABLES'), sys.argv[1:], flush=True)\n"
        "from runtime.cli import main as cli\n"
        "sys.exit(cli.main())\n")
    missing = str(tmp_path / "missing.gguf")
    out = subprocess.run([sys.executable, str(probe), "run", missing, "-p", "hi"], env=env,
                         capture_output=True, text=True, timeout=120)
    starts = [line.split(" ", 2) for line in out.stdout.splitlines() if line[:1].isdigit()]
    assert [s[1] for s in starts] == ["None", TUNABLE]  # the first start, then the second
    assert starts[0][0] == starts[1][0]  # the same process
    assert starts[0][2] == starts[1][2] == repr(["run", missing, "-p", "hi"])
    assert out.returncode == 2 and "missing.gguf" in out.stderr  # and then it went on
