"""The frozen app's entry point: one executable that is the desktop app, the engine and the CLI.

A frozen app has no `python -m`, so the processes Outrider starts re-execute this very
executable with a flag that says what to be:

    Outrider                               the desktop app (app.main.main)
    Outrider --self-test [--model F.gguf]  the offscreen self-test (passed to app.main.main)
    Outrider --engine serve --port 0 …     the engine CLI, `outrider …` (runtime.cli.main.main);
                                           app/engine/process.py starts the engine this way
    Outrider --quantize-worker             the quantize worker (runtime/quality/quantize.py)
    Outrider --load-probe                  a new model's first load (runtime/engine/probe.py)
    Outrider --multiprocessing-fork …      an engine process of the server (runtime/engine/
                                           isolated.py), via multiprocessing.freeze_support()
    Outrider --check-bundle                (hidden) the build's check that the bundle carries
                                           every module, metadata and data file (check_bundle.py)

So `Outrider --engine info model.gguf` or `Outrider --engine serve model.gguf` work from a
terminal too: the bundle carries the whole command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

ENGINE_FLAG = "--engine"
QUANTIZE_WORKER_FLAG = "--quantize-worker"
LOAD_PROBE_FLAG = "--load-probe"
CHECK_BUNDLE_FLAG = "--check-bundle"


def main(argv: Sequence[str]) -> int:
    # The server's engine processes (runtime.engine.isolated) are multiprocessing "spawn"
    # children: in the bundle they re-execute this executable, and freeze_support() turns
    # such a start into the child's own loop before anything else runs.
    import multiprocessing

    multiprocessing.freeze_support()
    args = list(argv)
    if args[:1] == [ENGINE_FLAG]:
        from runtime.cli.main import main as cli_main

        return cli_main(args[1:])
    if args[:1] == [QUANTIZE_WORKER_FLAG]:
        from runtime.quality.worker import main as worker_main

        return worker_main()
    if args[:1] == [LOAD_PROBE_FLAG]:
        from runtime.engine.probe import main as probe_main

        return probe_main()
    if args[:1] == [CHECK_BUNDLE_FLAG]:
        if not getattr(sys, "frozen", False):  # from the checkout: check_bundle.py is beside us
            from pathlib import Path

            sys.path.insert(0, str(Path(__file__).resolve().parent))
        from check_bundle import main as check_bundle_main

        return check_bundle_main(args[1:])
    if args[:1] == ["-m"]:
        # Code written for a source install may run `sys.executable -m MODULE`; in the bundle
        # that would open a second window instead. Refuse, and say so on stderr.
        print(f"Outrider: `-m {' '.join(args[1:2])}` is not available in the packaged app",
              file=sys.stderr)
        return 2
    from app.main import main as app_main

    return app_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
