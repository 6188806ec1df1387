"""The `outrider` command. With no subcommand it opens the desktop app.

Each command group registers its own subcommands from a module of this package
(`runtime/cli/<group>.py`), so this file stays a table of contents.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from runtime import __version__
from runtime.cli import desktop, draft, hub, info, quality, run, serve, worker
from runtime.errors import OutriderError, shown
from runtime.hugepages import restart_as_engine_process

# Modules that each define `register(subparsers)`; their handlers return an exit code.
COMMAND_MODULES = (
    info,  # info, plan
    run,  # run, chat
    hub,  # search, show, pull, ls, rm
    serve,  # serve
    worker,  # worker
    draft,  # draft make
    quality,  # quantize, eval, bench
    desktop,  # install-desktop-entry
)
# Commands whose engine runs in this process (`runtime.cli.run._engine`): started from a
# shell, they start again once with the environment an engine process has (runtime.hugepages).
IN_PROCESS_ENGINE = ("run", "chat")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outrider", description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true",
                        help="offscreen: check the product end to end, one line per check")
    parser.add_argument("--fixtures", metavar="DIR",
                        help="with --self-test: the tiny models some checks need "
                             "(packaging/self_test_fixtures.py DIR)")
    parser.add_argument("--model", metavar="PATH", help="open the app with this GGUF loaded")
    parser.add_argument("--no-model", action="store_true", help="open the app without loading a model")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def _open_app(argv: list[str]) -> int:
    # Imported by name: `runtime` never imports the Qt app (import-linter's first contract);
    # the app is the one optional entry point this command opens.
    app_main = importlib.import_module("app.main")
    return int(app_main.main(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    if argv is None and args.command in IN_PROCESS_ENGINE:
        restart_as_engine_process()  # their engine runs here: on huge pages as a child's would
    if args.version:
        print(f"outrider {__version__}")
        return 0
    if args.command is None:
        app_args = ["--self-test"] if args.self_test else []
        if args.model:
            app_args += ["--model", args.model]
        if args.fixtures:
            app_args += ["--fixtures", args.fixtures]
        if args.no_model:
            app_args.append("--no-model")
        return _open_app(app_args)
    try:
        return int(args.handler(args))
    except OutriderError as exc:
        print(f"error: {shown(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
