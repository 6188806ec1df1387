"""The model-load flags, declared once for every command that loads or plans a model, and the
one conversion from them to `LoadSettings`.

    parser = argparse.ArgumentParser()
    add_load_flags(parser, *ENGINE, *DRAFT)
    args = parser.parse_args(["--ctx", "8192", "--gpu-layers", "auto", "--draft", "ngram"])
    load_settings(args, LoadSettings(model_path=Path("m.gguf")))  # n_ctx 8192, ngram drafts

A command takes the flags it uses (`plan` needs no draft length, `show` only what a fit
depends on), but a flag means the same everywhere: one type, one set of choices, one
dest. A flag left out is None in the namespace, whatever the command: the base settings the
command passes decide (LoadSettings' defaults, `serve`'s four slots, the app's fit settings
for `show` and `pull`), and `serve` can tell which flags were given (`given_load_flags`).

"auto or a number" and "3,1" are read here rather than by argparse, so a bad one is the same
one-line `error:` as every other bad setting (SettingsError), not argparse's usage block.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.errors import SettingsError
from runtime.settings.load import KV_CACHE_TYPES, DraftSettings, LoadSettings

# What a will-it-fit verdict depends on (`show`, `pull`).
FIT = ("--ctx", "--kv-k", "--kv-v")
# How an engine loads one model (`run`, `chat`, `serve`).
ENGINE = (*FIT, "--flash-attn", "--ubatch", "--threads", "--gpu-layers", "--tensor-split",
          "--worker", "--mmproj")
# Speculative decoding (`run`, `chat`, `serve`; `plan` counts a draft model's memory).
DRAFT = ("--draft", "--draft-k", "--verifier")
# Sequences decoded together: the server's slots (`serve`, `plan`).
SLOTS = ("--parallel",)
LOAD_FLAGS = (*ENGINE, *DRAFT, *SLOTS)

_BASE = LoadSettings(model_path=Path("model.gguf"))
# What a flag left out means, as --help says it; a command with another base says its own.
_SAID_DEFAULTS = {
    "--ctx": str(_BASE.n_ctx), "--kv-k": _BASE.type_k, "--kv-v": _BASE.type_v,
    "--flash-attn": _BASE.flash_attn, "--ubatch": str(_BASE.n_ubatch),
    "--threads": "one per physical core",
    "--gpu-layers": "as many as the memory planner finds fit",
    "--tensor-split": "by free memory", "--mmproj": "the mmproj*.gguf beside a library model",
    "--draft-k": "adaptive", "--verifier": _BASE.draft.verifier,
    "--parallel": str(_BASE.n_parallel),
}


def add_load_flags(parser: argparse.ArgumentParser, *flags: str,
                   defaults: Mapping[str, str] | None = None) -> None:
    """Declare `flags` (names from LOAD_FLAGS) on `parser`, in one group.
    `defaults` says, for --help, what a flag left out means where the command's base settings
    differ from LoadSettings' (e.g. {"--parallel": "4"}); the parsed default is None always."""
    unknown = [f for f in flags if f not in LOAD_FLAGS]
    if unknown:
        raise ValueError(f"not a load flag: {', '.join(unknown)}")
    said = {**_SAID_DEFAULTS, **(defaults or {})}
    group = parser.add_argument_group("load settings")

    def add(flag: str, help_text: str, **kwargs: Any) -> None:
        if flag in flags:
            group.add_argument(flag, default=None, help=help_text.format(default=said.get(flag)),
                               **kwargs)

    kv_types = list(KV_CACHE_TYPES)
    add("--ctx", "context length in tokens (default: {default})", type=int, metavar="TOKENS")
    add("--kv-k", f"K cache type: {', '.join(kv_types)} (default: {{default}})",
        choices=kv_types, metavar="TYPE")
    add("--kv-v", "V cache type, as --kv-k (default: {default}); a quantized V turns flash "
                  "attention on", choices=kv_types, metavar="TYPE")
    add("--flash-attn", "flash attention (default: {default})", choices=("auto", "on", "off"))
    add("--ubatch", "micro-batch size in tokens (default: {default})", type=int,
        metavar="TOKENS")
    add("--threads", "CPU threads (default: {default})", type=int, metavar="N")
    add("--parallel", "sequences decoded together (slots; default: {default})", type=int,
        metavar="N")
    add("--gpu-layers", "layers on the GPUs and workers: a number, or auto (the default): "
                        "{default}", metavar="auto|N")
    add("--tensor-split", "each worker's (then each GPU's) share of the offloaded layers, "
                          "e.g. 1,1 (default: {default})", metavar="A,B,...")
    add("--worker", "another machine's `outrider worker` to hold part of the model "
                    "(repeatable; docs/distributed.md)", action="append", metavar="HOST:PORT")
    add("--mmproj", "a vision model's projector (mmproj .gguf; `info` and `plan` read a URL "
                    "too): lets it read images (default: {default})", metavar="FILE")
    add("--draft", "speculative decoding: a draft .gguf sharing the vocabulary (`plan` reads "
                   "a URL too), or 'ngram' (prompt lookup)", metavar="FILE|ngram")
    add("--draft-k", "draft length: a number, or auto (the default): {default}",
        metavar="auto|N")
    add("--verifier", "acceptance rule: leviathan (min(1, p/q)) or greedy_match (llama.cpp's) "
                      "(default: {default})", choices=("leviathan", "greedy_match"))


def given_load_flags(args: argparse.Namespace) -> list[str]:
    """The load flags given on the command line, by name: ["--ctx", "--draft"]."""
    return [flag for flag in LOAD_FLAGS if getattr(args, _dest(flag), None) is not None]


def load_settings(args: argparse.Namespace, base: LoadSettings) -> LoadSettings:
    """`base` (the model and the command's own defaults) with what the load flags in `args`
    ask for; a bad value is a one-line SettingsError.

        >>> parser = argparse.ArgumentParser()
        >>> add_load_flags(parser, *ENGINE)
        >>> args = parser.parse_args(["--gpu-layers", "20", "--tensor-split", "3,1"])
        >>> s = load_settings(args, LoadSettings(model_path=Path("m.gguf")))
        >>> s.gpu_layers, s.tensor_split, s.n_ctx
        (20, (3.0, 1.0), 4096)
    """
    # The flags given, by name; one the command does not declare (eval: --ubatch) is absent.
    given = {flag: value for flag in LOAD_FLAGS
             if (value := getattr(args, _dest(flag), None)) is not None}
    changes: dict[str, Any] = {}
    for flag, name in (("--ctx", "n_ctx"), ("--kv-k", "type_k"), ("--kv-v", "type_v"),
                       ("--flash-attn", "flash_attn"), ("--threads", "n_threads"),
                       ("--parallel", "n_parallel")):
        if flag in given:
            changes[name] = given[flag]
    if "--ubatch" in given:  # a micro-batch never larger than the batch
        changes.update(n_ubatch=given["--ubatch"], n_batch=max(base.n_batch, given["--ubatch"]))
    if "--gpu-layers" in given:
        changes["gpu_layers"] = count_or_auto(given["--gpu-layers"], "--gpu-layers")
    if "--tensor-split" in given:
        changes["tensor_split"] = tensor_split_arg(given["--tensor-split"])
    if "--worker" in given:
        changes["workers"] = tuple(given["--worker"])
    if "--mmproj" in given:
        changes["mmproj_path"] = Path(given["--mmproj"]).expanduser()
    draft = _draft(given, base.draft)
    if draft is not base.draft:
        changes["draft"] = draft
    return dataclasses.replace(base, **changes)


def count_or_auto(text: str, flag: str) -> int | None:
    """--gpu-layers and --draft-k: "auto" → None (the planner's count, an adaptive length),
    a number → int (range checked by LoadSettings).

        >>> count_or_auto("auto", "--gpu-layers"), count_or_auto("12", "--gpu-layers")
        (None, 12)
    """
    word = text.strip().lower()
    if word == "auto":
        return None
    try:
        return int(word)
    except ValueError:
        raise SettingsError(f"{flag} must be auto or a number, not {text!r}") from None


def tensor_split_arg(text: str) -> tuple[float, ...]:
    """--tensor-split "3,1" → (3.0, 1.0); a one-line SettingsError for anything else.

        >>> tensor_split_arg("1, 1")
        (1.0, 1.0)
    """
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise SettingsError(f"--tensor-split takes shares like 3,1, not {text!r}") from None


def _draft(given: dict[str, Any], base: DraftSettings) -> DraftSettings:
    """The drafting --draft, --draft-k and --verifier ask for (`base` when none is given)."""
    source, k_text, verifier = (given.get(f) for f in ("--draft", "--draft-k", "--verifier"))
    if source is None:
        without = [f for f in ("--draft-k", "--verifier") if f in given]
        if without:
            raise SettingsError(f"{' and '.join(without)} need{'s' if len(without) == 1 else ''} "
                                "--draft (a draft model, or ngram)")
        return base
    k = None if k_text is None else count_or_auto(k_text, "--draft-k")
    verifier = verifier or base.verifier
    if source == "ngram":
        return DraftSettings(kind="ngram", k=k, verifier=verifier)
    return DraftSettings(kind="model", model_path=Path(source).expanduser(), k=k,
                         verifier=verifier)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")
