"""The model-load flags (runtime.cli.load_args): declared once, the same in every command that
loads or plans a model, and read into `LoadSettings` with one-line errors."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from runtime.cli import run as run_module
from runtime.cli import serve as serve_module
from runtime.cli.load_args import LOAD_FLAGS, add_load_flags, load_settings
from runtime.cli.main import build_parser, main
from runtime.errors import SettingsError
from runtime.settings.load import DraftSettings, LoadSettings

# Every command that loads or plans a model. `bench` is not one of them: its --ctx,
# --gpu-layers, --threads and --draft are sweep axes, each a comma-separated list of values.
LOADING_COMMANDS = ("run", "chat", "serve", "plan", "info", "eval", "show", "pull")
BASE = LoadSettings(model_path=Path("m.gguf"))


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def load_actions(parser: argparse.ArgumentParser) -> dict[str, tuple[Any, ...]]:
    """Each load flag `parser` takes → what argparse does with it."""
    return {flag: (type(a).__name__, a.dest, a.type, a.choices, a.default, a.nargs, a.metavar,
                   tuple(a.option_strings))
            for a in parser._actions for flag in a.option_strings if flag in LOAD_FLAGS}


def parse(*argv: str, flags: tuple[str, ...] = LOAD_FLAGS) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_load_flags(parser, *flags)
    return parser.parse_args(list(argv))


def test_a_load_flag_is_the_same_in_every_command_that_takes_it() -> None:
    parsers = commands()
    seen: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for name in LOADING_COMMANDS:
        for flag, action in load_actions(parsers[name]).items():
            first, expected = seen.setdefault(flag, (name, action))
            assert action == expected, f"{flag}: `{name}` declares it unlike `{first}`"
    assert set(seen) == set(LOAD_FLAGS)  # each flag is taken by some command


def test_serve_takes_every_load_flag_run_takes() -> None:
    parsers = commands()
    run, serve = load_actions(parsers["run"]), load_actions(parsers["serve"])
    assert {"--tensor-split", "--mmproj", "--verifier", "--gpu-layers", "--draft-k"} <= set(run)
    assert {flag: serve[flag] for flag in run} == run
    assert load_actions(parsers["chat"]) == run
    assert set(serve) - set(run) == {"--parallel"}


def test_a_flag_left_out_is_none_and_changes_nothing() -> None:
    args = parse()
    assert all(getattr(args, flag[2:].replace("-", "_")) is None for flag in LOAD_FLAGS)
    assert load_settings(args, BASE) == BASE
    custom = LoadSettings(model_path=Path("m.gguf"), n_parallel=4, n_ctx=1024)
    assert load_settings(args, custom) == custom  # a command's own defaults stay


def test_the_flags_become_load_settings() -> None:
    args = parse("--ctx", "8192", "--kv-k", "q8_0", "--kv-v", "q4_0", "--flash-attn", "on",
                 "--ubatch", "1024", "--threads", "3", "--parallel", "2", "--gpu-layers", "20",
                 "--tensor-split", "3, 1", "--worker", "Box", "--worker", "10.0.0.2:7000",
                 "--mmproj", "~/mmproj-m.gguf", "--draft", "ngram", "--draft-k", "4",
                 "--verifier", "greedy_match")
    assert load_settings(args, BASE) == LoadSettings(
        model_path=Path("m.gguf"), n_ctx=8192, type_k="q8_0", type_v="q4_0", flash_attn="on",
        n_ubatch=1024, n_batch=1024, n_threads=3, n_parallel=2, gpu_layers=20,
        tensor_split=(3.0, 1.0), workers=("box:50052", "10.0.0.2:7000"),
        mmproj_path=Path("~/mmproj-m.gguf").expanduser(),
        draft=DraftSettings(kind="ngram", k=4, verifier="greedy_match"))


@pytest.mark.parametrize(("argv", "expected"), [
    (["--gpu-layers", "auto"], {"gpu_layers": None}),
    (["--gpu-layers", "AUTO"], {"gpu_layers": None}),
    (["--gpu-layers", "0"], {"gpu_layers": 0}),
    (["--ubatch", "128"], {"n_ubatch": 128, "n_batch": 512}),  # the batch never below it
    (["--draft", "d.gguf"], {"draft": DraftSettings(kind="model", model_path=Path("d.gguf"))}),
    (["--draft", "ngram", "--draft-k", "auto"], {"draft": DraftSettings(kind="ngram")}),
])
def test_auto_or_a_number(argv: list[str], expected: dict[str, Any]) -> None:
    assert load_settings(parse(*argv), BASE) == dataclasses.replace(BASE, **expected)


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpu-layers", "lots"], "--gpu-layers must be auto or a number, not 'lots'"),
    (["--gpu-layers", "-2"], "GPU layers must be 0 or more"),
    (["--draft", "ngram", "--draft-k", "many"], "--draft-k must be auto or a number"),
    (["--draft", "ngram", "--draft-k", "0"], "draft k must be between 1 and 32, not 0"),
    (["--draft-k", "4"], "--draft-k needs --draft"),
    (["--draft-k", "4", "--verifier", "greedy_match"], "--draft-k and --verifier need --draft"),
    (["--tensor-split", "3;1"], "--tensor-split takes shares like 3,1, not '3;1'"),
    (["--tensor-split", "0,0"], "at least one GPU a share above 0"),
    (["--worker", "a:b:c"], "a worker is host:port"),
    (["--ctx", "8"], "context length must be at least 16 tokens, not 8"),
    (["--mmproj", "m.gguf"], "the projector (mmproj) is a file of its own"),
])
def test_a_bad_value_is_a_one_line_settings_error(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(parse(*argv), BASE)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_run_and_serve_read_the_same_flags_into_the_same_settings(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    flags = ["--ctx", "2048", "--kv-k", "q8_0", "--gpu-layers", "auto", "--tensor-split", "1,1",
             "--mmproj", str(tmp_path / "mmproj.gguf"), "--draft", str(tmp_path / "d.gguf"),
             "--draft-k", "3", "--verifier", "greedy_match", "--threads", "2"]
    parser = build_parser()
    ran = run_module._settings(parser.parse_args(["run", str(model), "-p", "hi", *flags]))
    served = serve_module.load_settings_from_args(parser.parse_args(["serve", str(model), *flags]))
    assert served is not None
    assert served == dataclasses.replace(ran, model_path=model.resolve(), n_parallel=4)
    assert served.draft.k == 3 and served.gpu_layers is None and served.tensor_split == (1, 1)


def test_serve_without_a_model_refuses_load_flags() -> None:
    args = build_parser().parse_args(["serve", "--ctx", "512", "--parallel", "2",
                                      "--tensor-split", "1,1"])
    with pytest.raises(SettingsError, match=r"^--ctx, --tensor-split, --parallel apply to a "
                                            r"MODEL given at start"):
        serve_module.load_settings_from_args(args)
    assert serve_module.load_settings_from_args(build_parser().parse_args(["serve"])) is None


def test_a_bad_flag_through_the_command_is_one_line_and_exit_2(
        tiny_target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tiny_target), "--gpu-layers", "lots"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --gpu-layers must be auto or a number, not 'lots'\n"
    assert main(["plan", str(tiny_target), "--gpu-layers", "auto", "--draft", "ngram",
                 "--json"]) == 0
