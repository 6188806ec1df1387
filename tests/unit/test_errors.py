"""`errors.shown`: names a user or a file's author chose, made safe to print in a message."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli.main import main
from runtime.errors import ModelFileError, shown
from runtime.gguf.header import read_local_header


@pytest.mark.parametrize(("name", "printed"), [
    ("model.gguf", "model.gguf"),
    ("Qwen2.5 7B Instruct-Q4_K_M.gguf", "Qwen2.5 7B Instruct-Q4_K_M.gguf"),
    ("модель «ночь».gguf", "модель «ночь».gguf"),  # ordinary Unicode stays
    ("日本語 😀.gguf", "日本語 😀.gguf"),
    ("it's \"quoted\".gguf", "it's \"quoted\".gguf"),
    ("evil\n.gguf", "evil\\n.gguf"),
    ("tab\there", "tab\\there"),
    ("\x1b[31mred\x1b[0m.gguf", "\\x1b[31mred\\x1b[0m.gguf"),
    ("cr\roverwrite", "cr\\roverwrite"),
    ("\u202egguf.exe", "\\u202egguf.exe"),  # right-to-left override
    ("bytes\udcff.gguf", "bytes\\udcff.gguf"),  # an undecodable byte (surrogateescape)
    (Path("/models/a\nb.gguf"), "/models/a\\nb.gguf"),
])
def test_shown_escapes_what_is_not_printable(name: object, printed: str) -> None:
    assert shown(name) == printed
    assert shown(name).isprintable()


def test_a_model_file_name_with_control_characters_stays_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "evil\n\x1b[2J.gguf"
    path.write_bytes(b"not a model at all")
    with pytest.raises(ModelFileError) as caught:
        read_local_header(path)
    message = str(caught.value)
    assert message.isprintable(), message
    assert "evil\\n\\x1b[2J.gguf" in message


def test_the_cli_prints_such_a_name_escaped(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x\n\x1b]0;owned\x07.gguf"
    path.write_bytes(b"GGUF")
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "\x1b" not in err
    assert "x\\n\\x1b]0;owned\\x07.gguf" in err
