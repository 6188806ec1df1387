"""`outrider run` and `outrider chat` (runtime.cli.run) through `runtime.cli.main.main`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from runtime.cli.main import main


def test_run_streams_and_prints_speed(tiny_target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(tiny_target), "-p", "hello there", "--temp", "0", "--max-tokens", "8",
                 "--ctx", "256", "--threads", "1", "--seed", "1"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.endswith("\n") and out.strip()
    assert "TTFT" in err and "prefill" in err and "decode" in err and "tok/s" in err
    assert "8 tokens (length)" in err or "(stop)" in err


def test_run_raw_with_quantized_kv_notes_flash_attention(tiny_target: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(tiny_target), "-p", "the cat", "--raw", "--temp", "0",
                 "--max-tokens", "4", "--ctx", "256", "--threads", "1", "--kv-v", "q8_0"])
    _, err = capsys.readouterr()
    assert code == 0
    assert "note: flash attention on: the quantized V cache (q8_0) needs it" in err


def test_run_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(tmp_path / "nope.gguf"), "-p", "x"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ") and "nope.gguf" in err


def test_chat_keeps_history_and_reset(tiny_target: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nand again\n/reset\nfresh start\n/exit\n"))
    code = main(["chat", str(tiny_target), "--temp", "0", "--max-tokens", "6", "--ctx", "512",
                 "--threads", "1"])
    _, err = capsys.readouterr()
    assert code == 0
    stats = [line for line in err.splitlines() if line.startswith("TTFT")]
    assert len(stats) == 3
    prompts = [int(line.split("prompt ")[1].split(" tokens")[0]) for line in stats]
    assert prompts[1] > prompts[0]  # the second turn carries the first
    assert prompts[2] < prompts[1]  # /reset forgot it
    assert "cached" in stats[1]  # and the second turn reused the first turn's cells
    assert "(conversation cleared)" in err
