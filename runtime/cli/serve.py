"""`outrider serve`: the OpenAI-compatible server (and the desktop app's engine process).

    outrider serve                                   # 127.0.0.1:1234, no model yet
    outrider serve model.gguf --ctx 8192 --parallel 8 --kv-k q8_0 --kv-v q8_0
    outrider serve --host 0.0.0.0 --api-key KEY      # other machines: a key is required
    outrider serve --port 0 --parent-pid 4242        # as the app's engine: any free port
    outrider serve --saved-kv-gib 16                 # keep more idle chats' KV caches on disk
    outrider serve --max-models 2 --ttl 600          # models on demand: 2 at once, 10 min idle
    outrider serve --ollama-port 11434               # also where Ollama's clients look
    outrider serve model.gguf --worker 10.0.0.2:50052  # part of the model on another machine
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from runtime.cli.load_args import (
    DRAFT,
    ENGINE,
    SLOTS,
    add_load_flags,
    given_load_flags,
    load_settings,
)
from runtime.engine.kv_store import GIB, KvStoreOptions
from runtime.errors import ModelNotFound, SettingsError
from runtime.library.projectors import with_projector
from runtime.paths import user_dirs
from runtime.settings.load import LoadSettings
from runtime.settings.user import MAX_SAVED_KV_GIB

# Sequences the start-up model decodes together when --parallel does not say.
SERVE_SLOTS = 4


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="run the OpenAI-compatible local server",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", metavar="MODEL", help="GGUF file to load at start")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; others need --api-key)")
    parser.add_argument("--port", type=int, default=1234, help="port (0 = any free port)")
    parser.add_argument("--api-key", default=os.environ.get("OUTRIDER_API_KEY"),
                        help="require 'Authorization: Bearer KEY' (default $OUTRIDER_API_KEY)")
    parser.add_argument("--parent-pid", type=int, help="exit when this process dies")
    add_load_flags(parser, *ENGINE, *DRAFT, *SLOTS,
                   defaults={"--parallel": str(SERVE_SLOTS)})
    parser.add_argument("--models-dir", type=Path,
                        help="the library /api/load may load from (default: the user's)")
    parser.add_argument("--allow-any-path", action="store_true",
                        help="let /api/load open models outside the library")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="allow browser pages from ORIGIN (repeatable; default none)")
    parser.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024,
                        help="largest request body (default 32 MiB: room for an image)")
    parser.add_argument("--allow-remote-images", action="store_true",
                        help="fetch images that requests give as http(s) URLs (default: only "
                             "data: URIs; a fetch reaches whatever the URL names)")
    parser.add_argument("--max-tokens", type=int, default=8192,
                        help="largest max_tokens a request may ask for")
    parser.add_argument("--saved-kv-gib", type=float, default=4.0, metavar="GIB",
                        help="disk for idle conversations' KV caches, resumed without a "
                             "prefill (default 4; 0 = off)")
    parser.add_argument("--max-models", type=int, default=4, metavar="N",
                        help="models resident at once, each loaded when a request names it "
                             "(default 4; the least recently used idle one makes room)")
    parser.add_argument("--ttl", type=float, default=3600.0, metavar="SECONDS",
                        help="unload a model loaded on demand after this long idle "
                             "(default 3600; a request's ttl / keep_alive overrides; -1 = never)")
    parser.add_argument("--memory-budget-gib", type=float, metavar="GIB",
                        help="memory the resident models' plans may take together "
                             "(default: what is free on this machine)")
    parser.add_argument("--ollama-port", type=int, metavar="PORT",
                        help="also serve on PORT (Ollama's clients look at 11434)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(handler=run)


def load_settings_from_args(args: argparse.Namespace) -> LoadSettings | None:
    """The start-up model's settings, or None without MODEL (then load flags are an error)."""
    if args.model is None:
        given = given_load_flags(args)
        if given:
            raise SettingsError(f"{', '.join(given)} apply to a MODEL given at start; "
                                "POST /api/load takes its own settings")
        return None
    path = Path(args.model).expanduser().resolve()
    if not path.is_file():
        raise ModelNotFound(f"no model file at {path}")
    settings = load_settings(args, LoadSettings(model_path=path, n_parallel=SERVE_SLOTS))
    if settings.draft.model_path is not None:  # allowed to the server by its resolved path
        draft = dataclasses.replace(settings.draft, model_path=settings.draft.model_path.resolve())
        settings = dataclasses.replace(settings, draft=draft)
    return with_projector(settings)  # a vision model's projector beside it


def saved_kv_from_args(args: argparse.Namespace) -> KvStoreOptions | None:
    """Where and how much the engine keeps of idle conversations' KV caches (None: off).

    >>> saved_kv_from_args(argparse.Namespace(saved_kv_gib=0.5)).budget_bytes
    536870912
    """
    gib = args.saved_kv_gib
    if not 0 <= gib <= MAX_SAVED_KV_GIB:
        raise SettingsError(f"--saved-kv-gib takes 0..{MAX_SAVED_KV_GIB} GiB, not {gib}")
    if gib == 0:
        return None
    return KvStoreOptions(user_dirs().cache / "kv", budget_bytes=int(gib * GIB))


def router_from_args(args: argparse.Namespace) -> Any:
    """The model router's options from --max-models, --ttl and --memory-budget-gib."""
    # start-up time: `outrider --help` does not pay for the server
    from runtime.server.models.router import RouterOptions

    if args.max_models < 1:
        raise SettingsError(f"--max-models takes 1 or more, not {args.max_models}")
    budget = args.memory_budget_gib
    if budget is not None and budget <= 0:
        raise SettingsError(f"--memory-budget-gib takes a positive size, not {budget}")
    return RouterOptions(max_resident=args.max_models,
                         default_ttl_s=None if args.ttl < 0 else args.ttl,
                         memory_budget_bytes=None if budget is None else int(budget * GIB))


def run(args: argparse.Namespace) -> int:
    # Imported here so `outrider --help` does not pay for FastAPI and uvicorn.
    from runtime.server.serve import ServeOptions, serve
    from runtime.server.state import ServerLimits

    if args.max_body_bytes < 1024 or args.max_tokens < 1:
        raise SettingsError("--max-body-bytes must be at least 1024 and --max-tokens at least 1")
    if args.ollama_port is not None and not 0 <= args.ollama_port <= 65535:
        raise SettingsError(f"--ollama-port must be 0..65535, not {args.ollama_port}")
    options = ServeOptions(
        models_dir=args.models_dir or user_dirs().models, host=args.host, port=args.port,
        api_key=args.api_key or None, parent_pid=args.parent_pid,
        model=load_settings_from_args(args), cors_origins=tuple(args.cors_origin),
        allow_any_path=args.allow_any_path,
        limits=ServerLimits(max_body_bytes=args.max_body_bytes, max_tokens=args.max_tokens,
                            allow_remote_images=args.allow_remote_images,
                            default_max_tokens=min(2048, args.max_tokens)),
        log_level=args.log_level, saved_kv=saved_kv_from_args(args),
        router=router_from_args(args), ollama_port=args.ollama_port)
    return serve(options)
