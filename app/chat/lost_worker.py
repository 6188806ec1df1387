"""When a worker (another machine lending its devices, `outrider worker`) fails the chat's
model: the banner above the composer that says so in one line and offers "Reload without
host:port", and the settings that reload makes.

    worker = lost_worker(error)          # "10.0.0.2:50052" for worker_lost / worker_unavailable
    banner.show_problem(worker, error.message)
    banner.reload_requested.connect(page.reload_without)         # the worker, "host:port"
    settings = without_worker(client.asked, worker)               # the same load, minus it

Two errors name a worker (docs/api.md): `worker_unavailable`, a load whose worker cannot be
reached (refused before anything loads), and `worker_lost`, a worker that stopped answering
mid-reply — llama.cpp's RPC client then aborts the engine process, so the model is unloaded
with it. Either way the model is not loaded now; the reply's text so far and the message it
answers stay in the chat, and Regenerate answers it again once the model is back.
"""

from __future__ import annotations

import dataclasses

from app.engine.wire import ReplyError
from app.qt import QtWidgets, Signal
from runtime.planner.workers import worker_named_in
from runtime.settings.load import LoadSettings

WORKER_CODES = ("worker_lost", "worker_unavailable")


def lost_worker(error: ReplyError) -> str | None:
    """The worker ("host:port") an error of a worker blames, or None for any other error.

        >>> lost_worker(ReplyError("server_error", "worker 10.0.0.2:50052 stopped answering "
        ...                        "(connection refused), and the model m was unloaded with it",
        ...                        "worker_lost"))
        '10.0.0.2:50052'
        >>> lost_worker(ReplyError("server_error", "worker 10.0.0.2:50052 …", "engine_crashed"))
    """
    return worker_named_in(error.message) if error.code in WORKER_CODES else None


def without_worker(settings: LoadSettings, worker: str) -> LoadSettings:
    """`settings` with `worker` no longer among its workers (the rest as they were)."""
    return dataclasses.replace(settings, workers=tuple(w for w in settings.workers
                                                       if w != worker))


class LostWorkerBanner(QtWidgets.QFrame):
    """Signals:
        reload_requested(str): "Reload without host:port", with the worker.

    Attributes:
        text: the one-line message. reload_button: the action. worker: the worker it names
        (None while hidden).
    """

    reload_requested = Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("editBanner")
        self.worker: str | None = None
        self.text = QtWidgets.QLabel()
        self.text.setObjectName("replyError")
        self.text.setWordWrap(True)
        self.reload_button = QtWidgets.QPushButton()
        self.close_button = QtWidgets.QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        row = QtWidgets.QHBoxLayout(self)
        row.setContentsMargins(20, 6, 20, 6)
        row.addWidget(self.text, 1)
        row.addWidget(self.reload_button)
        row.addWidget(self.close_button)
        self.reload_button.clicked.connect(self._on_reload)
        self.close_button.clicked.connect(self.dismiss)
        self.hide()

    def show_problem(self, worker: str, message: str) -> None:
        self.worker = worker
        self.text.setText(message)
        self.reload_button.setText(f"Reload without {worker}")
        self.reload_button.setEnabled(True)
        self.show()

    def show_reloading(self, worker: str) -> None:
        """The reload is under way (its button waits)."""
        self.text.setText(f"Reloading the model without {worker}…")
        self.reload_button.setEnabled(False)

    def dismiss(self) -> None:
        self.worker = None
        self.hide()

    def _on_reload(self) -> None:
        if self.worker is not None:
            self.reload_requested.emit(self.worker)
