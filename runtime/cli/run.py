"""`outrider run` and `outrider chat`: generate in the terminal and say how fast it went.

    $ outrider run default -p "What is the capital of France?"
    The capital of France is Paris.

    TTFT 210 ms · prefill 176 tok/s · decode 61.8 tok/s · 8 tokens (stop)

With a draft (`--draft DRAFT.gguf` or `--draft ngram`) the reply is decoded speculatively
(lossless: the same distribution as without) and the statistics add drafted and accepted
tokens, the acceptance rate, tokens per round, k, and predicted vs measured speedup.

A vision model reads images: `--mmproj FILE` loads its projector beside it (without it, the
model folder's own `mmproj*.gguf`, `runtime.library.projectors`) and each
`--image FILE` (PNG, JPEG, WebP …; checked and converted to RGB first) goes into the user
message, before the prompt's text:

    $ outrider run gemma-3-4b-it-Q4_K_M.gguf --mmproj mmproj-gemma-3-4b-it-f16.gguf \
          --image photo.jpg -p "What is in this picture?"

In `outrider chat`, `/image FILE` attaches an image to the next message; the conversation
keeps it, so later turns reuse its cells instead of reading it again.

The reply streams to stdout; load notes and the statistics go to stderr, so
`outrider run … > answer.txt` keeps only the answer. `--profile` adds where each generated
token's time went (runtime.engine.step_profile):

    profile (native step): 511 tokens in 43 engine steps (511 decodes) · per token: Python
    9.8 µs CPU, 8.1 µs wall (median step) · llama_decode 402.3 µs CPU · sampling 0.4 µs ·
    wall 421.7 µs
 `MODEL` is a .gguf path or `default`
(the default model, fetched on first use). By default the prompt goes through the model's
chat template as one user message after a plain system message (`--system` changes it);
`--raw` sends the prompt as is.

`--worker HOST:PORT` (repeatable) splits the model across other machines' `outrider worker`
and this one (docs/distributed.md); the engine then runs in a child process, so a worker that
disappears ends the reply with an error naming it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from runtime.cli.load_args import DRAFT, ENGINE, add_load_flags, load_settings
from runtime.engine.api import EngineAPI, LoadedModel, RequestHandle
from runtime.engine.build import build_engine
from runtime.engine.engine import Engine
from runtime.engine.isolated import IsolatedEngine
from runtime.errors import ImageError, OutriderError, SettingsError
from runtime.events import (
    ChatMessage,
    ErrorEvent,
    Finished,
    GenerationRequest,
    SamplingParams,
    StepStats,
    TokenEvent,
)
from runtime.library.projectors import with_projector
from runtime.media.images import normalized_rgb
from runtime.settings.load import LoadSettings
from runtime.units import fmt_latency, fmt_rate

# Small instruct models answer far better with a plain system message than with the
# persona their template inserts when there is none (SmolLM2-135M: "Paris" vs. nonsense).
DEFAULT_SYSTEM = "You are a helpful assistant."


def register(subparsers: Any) -> None:
    run = subparsers.add_parser("run", help="generate a reply to one prompt, then print speed",
                                description=__doc__)
    _model_args(run)
    run.add_argument("-p", "--prompt", required=True, help="the prompt")
    run.add_argument("--raw", action="store_true", help="no chat template: send the prompt as is")
    run.add_argument("--image", action="append", default=[], metavar="FILE",
                     help="an image for the model to read (repeat for more; needs --mmproj)")
    run.add_argument("--system", default=DEFAULT_SYSTEM,
                     help=f"system message (default {DEFAULT_SYSTEM!r}; '' = the template's own)")
    run.add_argument("--profile", action="store_true",
                     help="after the reply, say where each token's time went: Python, "
                          "llama_decode, sampling")
    run.set_defaults(handler=_run)

    chat = subparsers.add_parser("chat", help="talk with a model in the terminal (/image FILE, "
                                              "/reset, /exit)")
    _model_args(chat)
    chat.add_argument("--system", default=DEFAULT_SYSTEM,
                      help=f"system message (default {DEFAULT_SYSTEM!r}; '' = the template's own)")
    chat.set_defaults(handler=_chat)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a .gguf file, or 'default' for the default model")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens to generate (512)")
    p.add_argument("--temp", "--temperature", dest="temp", type=float, default=0.8,
                   help="temperature; 0 = greedy (0.8)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (random if unset)")
    add_load_flags(p, *ENGINE, *DRAFT)


def _model_path(name: str) -> Path:
    if name == "default":
        # start-up time: the default model's fetcher loads only when it is asked for
        from runtime.library.default_model import default_model_path

        return default_model_path()
    return Path(name).expanduser()


def _settings(args: argparse.Namespace) -> LoadSettings:
    # Without --mmproj, a vision model's projector beside it (runtime.library.projectors).
    return with_projector(load_settings(args, LoadSettings(model_path=_model_path(args.model))))


def _engine(args: argparse.Namespace, *, profile: bool = False) -> EngineAPI:
    """The engine for this command: in a child process when workers hold part of the model
    (llama.cpp's RPC client aborts its process when a worker disappears; in a child that is
    a one-line error here, naming the worker), else in this process."""
    if args.worker and not profile:
        return IsolatedEngine(build_engine, name=Path(args.model).stem)
    return build_engine(profile=profile)


def _images(paths: list[str]) -> tuple[bytes, ...]:
    """Each --image file's bytes, checked and in RGB (runtime.media.images), or ImageError
    naming the file."""
    images = []
    for name in paths:
        path = Path(name).expanduser()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ImageError(f"cannot read the image {path}: {exc.strerror or exc}") from exc
        try:
            images.append(normalized_rgb(data))
        except ImageError as exc:
            raise ImageError(f"{path.name}: {exc}") from exc
    return tuple(images)


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temp, max_tokens=args.max_tokens, seed=args.seed)


def _load(engine: EngineAPI, settings: LoadSettings, err: TextIO, *, raw: bool = False) -> None:
    info = engine.load(settings)
    draft = f", draft {info.draft}" if info.draft else ""
    print(f"{info.name}: {info.architecture}, {info.quant}, context {info.n_ctx}{draft}",
          file=err)
    for note in _notes(info, raw):
        print(f"note: {note}", file=err)


def _notes(info: LoadedModel, raw: bool) -> list[str]:
    """The load notes worth saying. With --raw no template is used, so the note that the
    model has none (or a broken one) and ChatML stands in would only mislead."""
    if not raw or info.chat_template_source != "fallback":
        return list(info.notes)
    return [note for note in info.notes if "chat template" not in note]


def _stream(handle: RequestHandle, out: TextIO, err: TextIO) -> tuple[str, Finished]:
    """Print the reply as it comes; return its text and its Finished event."""
    parts: list[str] = []
    step: StepStats | None = None
    try:
        for event in handle.events():
            if isinstance(event, TokenEvent) and event.text:
                parts.append(event.text)
                out.write(event.text)
                out.flush()
            elif isinstance(event, StepStats):
                step = event
            elif isinstance(event, ErrorEvent):
                raise _RequestFailed(event.message)
            elif isinstance(event, Finished):
                out.write("\n")
                out.flush()
                print(_stats_line(event), file=err)
                if event.speculative is not None:
                    print(_spec_line(event, step), file=err)
                return "".join(parts), event
    except KeyboardInterrupt:
        handle.cancel()
        for _ in handle.events(timeout=10):  # drain to the cancelled Finished
            pass
        raise
    raise _RequestFailed("the engine ended the reply without finishing it")


class _RequestFailed(OutriderError):
    pass


def _stats_line(done: Finished) -> str:
    t = done.timings
    u = done.usage
    cached = f", {u.cached_tokens} cached" if u.cached_tokens else ""
    return (f"\nTTFT {fmt_latency(t.ttft_s)} · prefill {fmt_rate(t.prefill_tokens_per_s)} · "
            f"decode {fmt_rate(t.decode_tokens_per_s)} · {u.completion_tokens} tokens "
            f"({done.reason}) · prompt {u.prompt_tokens} tokens{cached}")


def _spec_line(done: Finished, step: StepStats | None) -> str:
    """drafted 120 · accepted 96 (80.0%) · 2.9 tokens per round · k 4 · speedup
    predicted 1.62× / measured 1.48×"""
    spec = done.speculative
    assert spec is not None
    k = f" · k {step.k}" if step is not None and step.k else ""
    predicted = f"{step.predicted_speedup:.2f}×" if step is not None and step.k else "n/a"
    measured = f"{spec.measured_speedup:.2f}×" if spec.measured_speedup > 0 else "n/a"
    line = (f"drafted {spec.drafted} · accepted {spec.accepted} ({spec.acceptance_rate:.1%}) · "
            f"{spec.mean_accepted_length:.2f} tokens per round{k} · speedup predicted "
            f"{predicted} / measured {measured}")
    if step is not None and step.drafting_off_reason:
        line += f"\n{step.drafting_off_reason}"
    return line


def _run(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    if args.image and args.raw:
        raise SettingsError("--image needs the chat template (it places the image): drop --raw")
    images = _images(args.image)  # a bad image is said before the model loads
    settings = _settings(args)  # and a bad load flag before an engine starts
    engine = _engine(args, profile=args.profile)
    try:
        _load(engine, settings, err, raw=args.raw)
        if args.raw:
            request = GenerationRequest(prompt=args.prompt, sampling=_sampling(args))
        else:
            messages = [ChatMessage("system", args.system)] if args.system else []
            messages.append(ChatMessage("user", args.prompt, images=images))
            request = GenerationRequest(messages=tuple(messages), sampling=_sampling(args))
        _stream(engine.submit(request), out, err)
        profile = engine.step_profile() if isinstance(engine, Engine) else None
        if profile is not None:
            print(profile.line(), file=err)
        return 0
    finally:
        engine.stop()


def _chat(args: argparse.Namespace, lines: Iterable[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    settings = _settings(args)  # a bad load flag is said before an engine starts
    engine = _engine(args)
    system = [ChatMessage("system", args.system)] if args.system else []
    history: list[ChatMessage] = []
    try:
        _load(engine, settings, err)
        print("Type a message; /image FILE attaches an image to the next one (with --mmproj), "
              "/reset forgets the conversation, /exit (or Ctrl-D) leaves.", file=err)
        attached: list[bytes] = []
        for line in lines if lines is not None else _input_lines(out):
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                break
            if text == "/reset":
                history.clear()
                print("(conversation cleared)", file=err)
                continue
            if text.startswith("/image "):
                name = text.removeprefix("/image ").strip()
                try:
                    attached.extend(_images([name]))
                except ImageError as exc:
                    print(f"error: {exc}", file=err)
                    continue
                print(f"(image attached to your next message: {Path(name).name})", file=err)
                continue
            images, attached = tuple(attached), []
            history.append(ChatMessage("user", text, images=images))
            request = GenerationRequest(messages=tuple(system + history), sampling=_sampling(args),
                                        truncate_middle=True)
            try:
                reply, _ = _stream(engine.submit(request), out, err)
            except KeyboardInterrupt:
                history.pop()
                print("\n(stopped)", file=err)
                continue
            except _RequestFailed as exc:  # e.g. the template refused: say so, keep chatting
                history.pop()
                print(f"error: {exc}", file=err)
                continue
            history.append(ChatMessage("assistant", reply))
        return 0
    finally:
        engine.stop()


def _input_lines(out: TextIO) -> Iterable[str]:
    while True:
        try:
            yield input(">>> ")
        except EOFError:
            out.write("\n")
            return
