"""`outrider --self-test [--model F.gguf] [--fixtures DIR]`: offscreen, the product end to end.

Opens the main window, runs each check below through the code path the product itself
takes, prints one line per check, and exits 0 only when every check passed:

    self-test: load: ok (… loaded by the engine process; … the load probe … recorded 'ok' …)
    self-test: router: FAILED: needs --fixtures DIR (write them with …)
    …
    self-test: FAILED: 1 of 11 checks failed (router) in 48.2 s

Every check runs even when an earlier one failed (a check that needs the engine loads its model
again if it has to). The checks, in the order they run:

  load               the chat model through the app's load (`MainWindow.load_model`: the engine
                     process `outrider serve`, POST /api/load). The temporary home holds no
                     load verdict, so the engine first loads the file in a probe child
                     (`--load-probe` frozen, `python -m runtime.engine.probe` from source); the
                     check asserts that verdict was written.
  chat               a message from the chat controller, streamed back.
  structured output  a chat with a JSON schema (the chat's "Structured output": strict
                     `response_format`, llguidance in the engine); the reply must validate.
  embedding          `EngineClient.embed` (POST /v1/embeddings): vectors of the model's n_embd,
                     finite, unit length.
  document           a one-page PDF made at run time, attached in the composer (read by pypdf
                     on the window's runner), sent with Send; the request must carry its text.
  router             POST /v1/chat/completions naming a second model of the (temporary)
                     library: the server's router loads it in an engine process of its own.
  tool call          that model (a Hermes template) with `tool_choice` naming a function: one
                     call whose JSON arguments fit the function's parameters.
  vision             the tiny vision pair in the library: loaded by the app (which pairs the
                     projector beside it), an image attached in the composer and sent.
  quantize           `runtime.quality.quantize` makes a Q8_0 of a tiny F32 model in its worker
                     child (`--quantize-worker` frozen, `python -m runtime.quality.worker`).
  worker             the Server page's "Lend this machine" starts `outrider worker`
                     (`--engine worker` frozen); it must answer llama.cpp's RPC handshake.
  window             the window opened at the start; closing it stops the engine and worker.

Child processes are started by the product's own helpers (`EngineCommand.outrider`,
`runtime.engine.probe.child_command`, `runtime.quality.quantize.worker_command`), which
re-execute the frozen app with packaging/entry.py's flags. The router, tool call, vision and
quantize checks need the tiny models of `--fixtures DIR` (packaging/self_test_fixtures.py
writes them; app/self_test/fixtures.py names them); without it they fail, saying so.

Everything is written to a temporary home (`self_test_home`: OUTRIDER_HOME for this process
and its children), removed at the end unless a check failed (its engine logs are kept there,
and a line says where); only the model file comes from the user's library.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.self_test.home import self_test_home
from runtime.paths import UserDirs

__all__ = ["run_self_test", "self_test_home"]

if TYPE_CHECKING:  # Qt loads lazily: packaging/self_test_fixtures.py imports this package
    from app.qt import QtWidgets
    from app.window import MainWindow


def run_self_test(app: QtWidgets.QApplication, window: MainWindow, model: Path,
                  fixtures: Path | None = None, home: UserDirs | None = None) -> int:
    """Run every check against `window`; the exit code (0: all passed)."""
    # circle: the checks import this package (`fixtures`); Qt only once the window exists
    from app.qt import QtCore
    from app.self_test.checks import CHECKS
    from app.self_test.runner import SelfTest

    test = SelfTest(app, window, model, fixtures, home or window.dirs, CHECKS)
    QtCore.QTimer.singleShot(0, test.start)
    app.exec()
    return test.exit_code
