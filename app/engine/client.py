"""The app's side of the engine: a supervised server process and its HTTP API, asynchronously.

`EngineClient` starts the engine server (`app.engine.process`), talks to it with
`QNetworkAccessManager` (streamed answers are parsed from `readyRead` as they arrive, so the
GUI thread never waits), and turns what it hears into dataclass-carrying signals. It remembers
the load settings of the model the user wanted, so after a crash `start()` brings the same
model back: a chat's next Send restarts the engine and carries on.

    client = EngineClient()
    client.load(LoadSettings(model_path=path))        # starts the engine first if needed
    client.state_changed.connect(...)                  # … LOADING → READY
    stream = client.chat({"messages": [{"role": "user", "content": "Hi"}]})
    stream.delta.connect(on_text)                      # TextDelta, as tokens arrive
    stream.finished.connect(on_done)                   # ReplyFinished (timings, usage …)
    stream.errored.connect(on_error)                   # ReplyError, never text in the reply
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

from app.engine.embeddings_call import EmbeddingsCall
from app.engine.json_call import JsonCall
from app.engine.process import EngineCommand, EngineExit, EngineProcess
from app.engine.streams import LoadJob, MetricsFeed, ReplyStream
from app.engine.wire import ReplyError, ServedModel, ServerAddress, parse_token_count
from app.qt import QtCore, QtNetwork, Signal
from runtime.paths import user_dirs
from runtime.settings.load import LoadSettings

_Req = QtNetwork.QNetworkRequest
METRICS_RETRY_MS = 2000
__all__ = ["EngineClient", "EngineState", "LoadJob", "MetricsFeed", "ReplyStream"]


class EngineState(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    NO_MODEL = "no model"
    LOADING = "loading"
    READY = "ready"
    CRASHED = "crashed"

    @property
    def running(self) -> bool:
        return self in (EngineState.NO_MODEL, EngineState.LOADING, EngineState.READY)


class EngineClient(QtCore.QObject):
    """Starts, watches and talks to the engine server. Never blocks the GUI thread, except
    for at most a few seconds in `stop()` (app exit, user-requested restart).

    Signals:
        state_changed(EngineState)
        model_changed(ServedModel | None)
        metrics_received(MetricsSnapshot): about once a second while the engine runs.
        engine_exited(EngineExit): the process ended; `expected` False means it crashed.
        problem(ReplyError): the engine would not start, or a load failed.

    Attributes:
        process: the supervised `EngineProcess` (its `log_path` is the current log).
    """

    state_changed = Signal(object)
    model_changed = Signal(object)
    metrics_received = Signal(object)
    engine_exited = Signal(object)
    problem = Signal(object)

    def __init__(self, command: EngineCommand | None = None, log_dir: Path | None = None,
                 parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self.process = EngineProcess(command or EngineCommand.default(),
                                     log_dir or user_dirs().logs, self)
        self.process.ready.connect(self._on_ready)
        self.process.exited.connect(self._on_exited)
        self.process.failed.connect(self._on_failed)
        self._nam = QtNetwork.QNetworkAccessManager(self)
        self._nam.setProxy(QtNetwork.QNetworkProxy(QtNetwork.QNetworkProxy.ProxyType.NoProxy))
        self._state = EngineState.STOPPED
        self._model: ServedModel | None = None
        self._wanted: LoadSettings | None = None
        self._asked: LoadSettings | None = None
        self._queued_job: LoadJob | None = None
        self._metrics: MetricsFeed | None = None
        self._metrics_retry = QtCore.QTimer(self, singleShot=True, interval=METRICS_RETRY_MS)
        self._metrics_retry.timeout.connect(self._open_metrics)
        self.last_exit: EngineExit | None = None

    # -- state -------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def model(self) -> ServedModel | None:
        return self._model

    @property
    def wanted(self) -> LoadSettings | None:
        """The settings of the model the user asked for (reloaded after a restart)."""
        return self._wanted

    @property
    def asked(self) -> LoadSettings | None:
        """The settings of the last load asked for, kept when it failed (unlike `wanted`):
        what "Reload without a worker" starts from after a worker could not serve."""
        return self._asked

    @property
    def address(self) -> ServerAddress | None:
        return self.process.address

    def _set_state(self, state: EngineState) -> None:
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)

    def _set_model(self, model: ServedModel | None) -> None:
        if model != self._model:
            self._model = model
            self.model_changed.emit(model)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine if it is not running; the wanted model is loaded once it is up."""
        if self.process.running:
            return
        self._set_state(EngineState.STARTING)
        self.process.start()

    def stop(self) -> None:
        self._close_metrics()
        self.process.stop()
        self._set_model(None)
        self._set_state(EngineState.STOPPED)

    def restart(self) -> None:
        self.stop()
        self.start()

    def set_api_enabled(self, enabled: bool) -> None:
        """Serve the local API (the settings' port) or the chat alone (a private address).

        Why a restart: the API and the chat share one engine process and one listener, so
        moving the listener means a new process. The model the chat wanted is loaded again
        as soon as it is up (`_on_ready`): stopping or starting the API never leaves the
        chat without its model, it costs only the reload."""
        if enabled == self.process.api_enabled:
            return
        self.process.api_enabled = enabled
        if self.process.running:
            self.restart()

    # -- model -------------------------------------------------------------------------

    def load(self, settings: LoadSettings) -> LoadJob:
        """Load a model (replacing any loaded one), starting the engine first if needed."""
        self._wanted = self._asked = settings
        job = LoadJob(self)
        if self._queued_job is not None:
            self._queued_job.cancel()
        if self._state in (EngineState.NO_MODEL, EngineState.READY, EngineState.LOADING):
            self._send_load(settings, job)
        else:
            self._queued_job = job
            self.start()
        return job

    def unload(self) -> None:
        self._wanted = None
        if self._state.running:
            self._post_json("/api/unload", {})
            self._set_model(None)
            self._set_state(EngineState.NO_MODEL)

    def unload_model(self, name: str, *, default: bool = False) -> QtNetwork.QNetworkReply | None:
        """Unload one resident model (`POST /api/unload {"model": name}`); None when the engine
        is not running. Unloading the chat's model (the server's `default` one) is `unload()`:
        it is not loaded back after a restart. The caller reads the reply (404
        `model_not_found`: not resident) and deletes it."""
        if not self._state.running:
            return None
        if default or (self._model is not None and name == self._model.name):
            self._wanted = None
            self._set_model(None)
            self._set_state(EngineState.NO_MODEL)
        return self._post("/api/unload", {"model": name})

    def fetch_status(self) -> QtNetwork.QNetworkReply | None:
        """`GET /api/status` (the default model, and every resident one under `resident`);
        None when the engine is not running. The caller reads the reply and deletes it."""
        if self.process.address is None:
            return None
        return self._nam.get(self._request("/api/status", stream=False))

    def _send_load(self, settings: LoadSettings, job: LoadJob) -> None:
        self._set_model(None)
        self._set_state(EngineState.LOADING)
        job.loaded.connect(self._on_loaded)
        job.failed.connect(self._on_load_failed)
        job.attach(self._post("/api/load", settings.to_dict(), stream=True))

    def _on_loaded(self, model: ServedModel) -> None:
        self._set_model(model)
        self._set_state(EngineState.READY)

    def _on_load_failed(self, error: ReplyError) -> None:
        if error.kind == "LoadCancelled":
            return
        self._wanted = None  # do not retry a load that failed on every restart
        if self.process.address is not None:
            self._set_state(EngineState.NO_MODEL)
        self.problem.emit(error)

    # -- requests ----------------------------------------------------------------------

    def chat(self, body: dict[str, Any]) -> ReplyStream:
        """Stream a chat completion; `body` is OpenAI's request (stream is forced on)."""
        stream = ReplyStream(self)
        if self._state != EngineState.READY:
            error = ReplyError("NoModelLoaded", "No model is loaded in the engine.")
            QtCore.QTimer.singleShot(0, stream, lambda: stream._end(error))
            return stream
        stream.attach(self._post("/v1/chat/completions", {**body, "stream": True}, stream=True))
        return stream

    def embed(self, texts: list[str]) -> EmbeddingsCall:
        """The served model's embeddings of `texts` (`POST /v1/embeddings`)."""
        call = EmbeddingsCall(self)
        if self._state != EngineState.READY or self._model is None:
            call.fail_soon(ReplyError("NoModelLoaded", "No model is loaded in the engine."))
            return call
        call.attach(self._post("/v1/embeddings", {"model": self._model.name, "input": texts}))
        return call

    def tokenize(self, text: str) -> JsonCall:
        """How many tokens `text` is for the served model (`POST /tokenize`, no BOS added):
        the call's `done` carries a `TokenCount`; `failed` when no model is ready."""
        call = JsonCall(parse_token_count, self)
        if self._state != EngineState.READY or self._model is None:
            call.fail_soon(ReplyError("NoModelLoaded", "No model is loaded in the engine."))
            return call
        call.attach(self._post("/tokenize", {"content": text, "model": self._model.name,
                                             "add_special": False}))
        return call

    def _request(self, path: str, stream: bool) -> QtNetwork.QNetworkRequest:
        address = self.process.address
        base = address.url if address else "http://127.0.0.1:9"
        request = _Req(QtCore.QUrl(base + path))
        request.setRawHeader(b"Content-Type", b"application/json")
        if address is not None and address.api_key:  # no key on loopback by default
            request.setRawHeader(b"Authorization", f"Bearer {address.api_key}".encode())
        request.setAttribute(_Req.Attribute.Http2AllowedAttribute, False)
        if stream:
            request.setRawHeader(b"Accept", b"text/event-stream")
            request.setAttribute(_Req.Attribute.CacheLoadControlAttribute,
                                 _Req.CacheLoadControl.AlwaysNetwork)
        return request

    def _post(self, path: str, body: dict[str, Any], stream: bool = False) -> QtNetwork.QNetworkReply:
        return self._nam.post(self._request(path, stream), json.dumps(body).encode())

    def _post_json(self, path: str, body: dict[str, Any]) -> None:
        reply = self._post(path, body)
        reply.finished.connect(reply.deleteLater)

    # -- metrics -----------------------------------------------------------------------

    def _open_metrics(self) -> None:
        if self.process.address is None or self._metrics is not None:
            return
        feed = MetricsFeed(self)
        feed.snapshot.connect(self.metrics_received)
        feed.ended.connect(self._on_metrics_ended)
        feed.attach(self._nam.get(self._request("/api/metrics/stream", stream=True)))
        self._metrics = feed

    def _on_metrics_ended(self) -> None:
        feed, self._metrics = self._metrics, None
        if feed is not None:
            feed.deleteLater()
        if self.process.address is not None:
            self._metrics_retry.start()

    def _close_metrics(self) -> None:
        self._metrics_retry.stop()
        feed, self._metrics = self._metrics, None
        if feed is not None:
            feed.ended.disconnect(self._on_metrics_ended)
            feed.cancel()
            feed.deleteLater()

    # -- process events ----------------------------------------------------------------

    def _on_ready(self, address: ServerAddress) -> None:
        self._set_state(EngineState.NO_MODEL)
        self._open_metrics()
        job, self._queued_job = self._queued_job, None
        if self._wanted is not None:
            self._send_load(self._wanted, job or LoadJob(self))

    def _on_exited(self, info: EngineExit) -> None:
        self.last_exit = info
        self._close_metrics()
        self._set_model(None)
        self._set_state(EngineState.STOPPED if info.expected else EngineState.CRASHED)
        self.engine_exited.emit(info)

    def _on_failed(self, reason: str) -> None:
        job, self._queued_job = self._queued_job, None
        error = ReplyError("EngineStartFailed", reason)
        if job is not None:
            job._end(error)
        self._set_state(EngineState.CRASHED)
        self.problem.emit(error)
