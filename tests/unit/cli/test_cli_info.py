"""`outrider info` and `outrider plan`: what they print and the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.cli import info as cli_info
from runtime.cli.main import main
from runtime.planner.devices import Device


def test_info_prints_metadata_and_a_plan(tiny_target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tiny_target)]) == 0
    out = capsys.readouterr().out
    assert "tiny-target" in out and "llama, 4 layers, 128 wide, 4 heads (2 KV heads of 32)" in out
    assert "plan: context 2,048, K f16, V f16, GPU layers auto" in out
    assert "KV cache 1,024 bytes per token" in out


def test_info_json(tiny_draft: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tiny_draft), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["block_count"] == 2
    assert data["plan"]["n_ctx"] == 2048 and data["plan"]["verdict"] in ("cpu_only", "full_gpu", "partial")


def test_plan_with_settings_and_a_draft(tiny_target: Path, tiny_draft: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", str(tiny_target), "--ctx", "1024", "--kv-k", "q8_0", "--kv-v", "q4_0",
                 "--draft", str(tiny_draft), "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["kv_bytes_per_token"] == 4 * 2 * (32 * 34 // 32 + 32 * 18 // 32)
    assert plan["flash_attn"] is True
    assert plan["devices"][-1]["draft"] > 0


def test_plan_that_does_not_fit_exits_1(tiny_target: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_info, "list_devices", lambda: [Device("cpu", "tiny", "cpu", 1 << 20, 1 << 20)])
    assert main(["plan", str(tiny_target)]) == 1
    assert "Won't fit" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["plan", "{model}", "--ctx", "0"], "context length must be at least 16"),
    (["plan", "{model}", "--gpu-layers", "-2"], "GPU layers must be 0 or more"),
    (["info", "{folder}"], "is a folder"),
    (["info", "{folder}/missing.gguf"], "no model file"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_target: Path, tmp_path: Path, args: list[str],
                                          message: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(model=tiny_target, folder=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
