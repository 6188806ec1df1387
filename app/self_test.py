"""`outrider --self-test`: offscreen, open the main window, load the default model in the
engine process, generate a few tokens through the chat, close the window, exit 0.

Everything the test writes (chats, window state, logs) goes to a temporary folder; only the
default model comes from the user's library (fetched there if missing).
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.chat.conversation import Message
from app.engine.client import EngineState
from app.engine.wire import ReplyError
from app.qt import QtCore, QtWidgets
from app.window import MainWindow
from runtime.events import SamplingParams
from runtime.settings.load import LoadSettings

TIMEOUT_MS = 180_000
PROMPT = "Say hello in five words."


class SelfTest(QtCore.QObject):
    """Drives the window through the check; `result` is the exit code once the loop ends."""

    def __init__(self, app: QtWidgets.QApplication, window: MainWindow, model: Path) -> None:
        super().__init__()
        self._app = app
        self._window = window
        self._model = model
        self.result = 1
        self._done = False
        self._sent = False
        self._timer = QtCore.QTimer(self, singleShot=True, interval=TIMEOUT_MS)
        self._timer.timeout.connect(lambda: self._fail(f"no answer within {TIMEOUT_MS // 1000} s"))

    def start(self) -> None:
        client = self._window.client
        client.state_changed.connect(self._on_state)
        client.problem.connect(lambda error: self._fail(error.message))
        client.engine_exited.connect(
            lambda info: None if info.expected else self._fail(info.describe() + "\n" + info.tail))
        self._window.controller.reply_finished.connect(self._on_reply)
        self._window.show()
        self._say(f"window open; loading {self._model.name}")
        self._window.load_model(LoadSettings(model_path=self._model, n_ctx=1024))
        self._timer.start()

    def _on_state(self, state: EngineState) -> None:
        model = self._window.client.model
        if state != EngineState.READY or model is None or self._sent:
            return
        self._sent = True
        self._say(f"engine ready with {model.name} ({model.quant})")
        controller = self._window.controller
        controller.new_conversation()
        controller.set_sampling(SamplingParams(temperature=0.0, max_tokens=8))
        controller.send(PROMPT)

    def _on_reply(self, message: Message) -> None:
        if self._done:
            return
        if message.status != "done" or not message.content.strip():
            self._fail(f"the reply ended as {message.status}: {message.error or 'no text'}")
            return
        tokens = message.stats.get("tokens", 0)
        self._say(f"generated {tokens} tokens: {message.content.strip()!r}")
        self.result = 0
        self._finish()

    def _fail(self, reason: str | ReplyError) -> None:
        if self._done:
            return
        self._say(f"FAILED: {reason}")
        self.result = 1
        self._finish()

    def _finish(self) -> None:
        self._done = True
        self._timer.stop()
        self._window.close()
        self._say("window closed")
        QtCore.QTimer.singleShot(0, self._app.quit)

    @staticmethod
    def _say(text: str) -> None:
        print(f"self-test: {text}", flush=True)


def run_self_test(app: QtWidgets.QApplication, window: MainWindow, model: Path) -> int:
    test = SelfTest(app, window, model)
    QtCore.QTimer.singleShot(0, test.start)
    app.exec()
    if test.result == 0:
        print("self-test: ok", flush=True)
    else:
        print("self-test: failed", file=sys.stderr, flush=True)
    return test.result
