"""`outrider --self-test` from source against the real default model, with the tiny fixtures
`packaging/self_test_fixtures.py` writes, as CI and `make package-test` run it (the frozen app
runs the same code): every check prints one line, and a missing fixture fails its own check
without stopping the others.

OUTRIDER_SELF_TEST_MODEL names another chat model to check with, for a machine where the
default one cannot run (llama.cpp's AMX kernels crash on SmolLM2's Q4_1 on some CPUs: there the
chat checks fail, as they should, and say SIGSEGV).
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.main import parse_args
from app.self_test import fixtures, pdf
from app.self_test.fixtures import MissingFixture, fixture

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ["load", "chat", "structured output", "embedding", "document", "router", "tool call",
          "vision", "quantize", "worker", "window"]
LINE = re.compile(r"^self-test: (?P<check>[a-z ]+): (?P<outcome>ok|FAILED)\b(?P<rest>.*)$")


def _model(default_model: Path) -> Path:
    chosen = os.environ.get("OUTRIDER_SELF_TEST_MODEL")
    return Path(chosen) if chosen else default_model


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", OUTRIDER_HOME=str(home))
    env.pop("OUTRIDER_MODELS_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _write_fixtures(folder: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "packaging" / "self_test_fixtures.py"),
                           str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in folder.iterdir()) == sorted(fixtures.ALL)


def _self_test(model: Path, fixtures_dir: Path | None, home: Path,
               ) -> tuple[int, dict[str, tuple[str, str]], str]:
    """Run it; (exit code, {check: (outcome, rest of its line)}, stdout + stderr)."""
    argv = [sys.executable, "-m", "app.main", "--self-test", "--model", str(model)]
    if fixtures_dir is not None:
        argv += ["--fixtures", str(fixtures_dir)]
    done = subprocess.run(argv, cwd=ROOT, env=_env(home), capture_output=True, text=True,
                          timeout=280, check=False)
    lines: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines():
        match = LINE.match(line)
        if match:
            assert match["check"] not in lines, f"two lines for {match['check']}"
            lines[match["check"]] = (match["outcome"], match["rest"])
    return done.returncode, lines, done.stdout + done.stderr


def _temporary_home(output: str) -> Path:
    match = re.search(r"user folders in (\S+)", output)
    assert match, output
    return Path(match[1])


@pytest.mark.e2e
@pytest.mark.slow
def test_every_check_passes_and_each_says_so(default_model: Path, tmp_path: Path) -> None:
    _write_fixtures(tmp_path / "fixtures")
    home = tmp_path / "home"
    code, lines, output = _self_test(_model(default_model), tmp_path / "fixtures", home)
    assert list(lines) == CHECKS, output
    assert [check for check, (outcome, _) in lines.items() if outcome != "ok"] == [], output
    assert code == 0, output
    assert f"self-test: ok: all {len(CHECKS)} checks passed" in output, output
    assert "the load probe loaded it in a child" in lines["load"][1]
    assert "get_weather" in lines["tool call"][1]
    # Everything went to its own temporary home, removed at the end: not to OUTRIDER_HOME.
    assert not _temporary_home(output).exists()
    assert not (home / "cache" / "load-verdicts.json").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_missing_fixture_fails_its_check_and_the_others_still_run(
        default_model: Path, tmp_path: Path) -> None:
    _write_fixtures(tmp_path / "fixtures")
    (tmp_path / "fixtures" / fixtures.VISION_PROJECTOR).unlink()
    code, lines, output = _self_test(_model(default_model), tmp_path / "fixtures",
                                     tmp_path / "home")
    assert code != 0, output
    assert list(lines) == CHECKS, output  # every check ran and said how it went
    outcome, rest = lines["vision"]
    assert outcome == "FAILED" and f"has no {fixtures.VISION_PROJECTOR}" in rest, output
    assert {check for check, (outcome, _) in lines.items() if outcome != "ok"} == {"vision"}, \
        output
    assert "self-test: FAILED: 1 of 11 checks failed (vision)" in output
    kept = _temporary_home(output)  # kept for its logs after a failure
    assert (kept / "state" / "logs").is_dir(), output
    shutil.rmtree(kept)


def test_without_fixtures_the_checks_that_need_them_say_so(tmp_path: Path) -> None:
    with pytest.raises(MissingFixture, match="needs --fixtures DIR"):
        fixture(None, fixtures.VISION_MODEL)
    with pytest.raises(MissingFixture, match=f"has no {fixtures.IMAGE}"):
        fixture(tmp_path, fixtures.IMAGE)


def test_fixtures_go_with_self_test_only(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(["--self-test", "--fixtures", "dir"])
    assert args.self_test and args.fixtures == Path("dir")
    with pytest.raises(SystemExit):
        parse_args(["--fixtures", "dir"])
    assert "--fixtures goes with --self-test" in capsys.readouterr().err


def test_the_pdf_it_writes_is_one_pypdf_reads(tmp_path: Path) -> None:
    from runtime.media.documents import extract_text

    assert doctest.testmod(pdf).failed == 0
    path = tmp_path / "notes.pdf"
    path.write_bytes(pdf.one_page_pdf(["First line (1)", "Back\\slash"]))
    document = extract_text(path, path.name)
    assert document.pages == ("First line (1)\nBack\\slash",)
