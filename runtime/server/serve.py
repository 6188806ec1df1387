"""Run the server: bind, optionally load a model, serve with uvicorn until told to stop.

As the desktop app's engine process it is started as

    outrider serve --host 127.0.0.1 --port 0 --api-key KEY --parent-pid PID

and prints exactly one line to stdout, after the socket is bound and listening:

    OUTRIDER_SERVER_READY {"url": "http://127.0.0.1:40123", "pid": 4242}

(with `"ollama_url"` too when `--ollama-port` gave a second port for Ollama's clients).
Each model runs in an engine process of its own, a child of this one (`IsolatedEngine`,
`runtime.server.models.router`). Everything else (logs, load progress) goes to stderr. With `--parent-pid` it exits when that
process dies, so a crashed app leaves no engine behind.
"""

from __future__ import annotations

import copy
import errno
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import uvicorn
import uvicorn.config

from runtime.engine.api import EngineAPI
from runtime.engine.build import build_engine
from runtime.engine.isolated import IsolatedEngine
from runtime.engine.kv_store import KvStoreOptions
from runtime.errors import PortInUse, SettingsError
from runtime.library.projectors import with_projector
from runtime.server.app import create_app
from runtime.server.models.router import RouterOptions, plan_for
from runtime.server.state import ServerLimits
from runtime.settings.load import LoadSettings
from runtime.settings.user import SettingsStore

READY_PREFIX = "OUTRIDER_SERVER_READY"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeOptions:
    models_dir: Path
    host: str = "127.0.0.1"
    port: int = 1234
    api_key: str | None = None
    parent_pid: int | None = None
    model: LoadSettings | None = None  # loaded before the server answers
    cors_origins: tuple[str, ...] = ()
    allow_any_path: bool = False
    limits: ServerLimits = field(default_factory=ServerLimits)
    log_level: str = "info"
    saved_kv: KvStoreOptions | None = None  # idle conversations' KV caches on disk
    router: RouterOptions = field(default_factory=RouterOptions)  # models loaded on demand
    ollama_port: int | None = None  # also listen on this port (Ollama's is 11434)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise SettingsError(f"binding {host} exposes the server to the network: "
                            "give --api-key KEY (or OUTRIDER_API_KEY), or use --host 127.0.0.1")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; `PortInUse` if another process holds the port."""
    if not 0 <= port <= 65535:
        raise SettingsError(f"port must be 0..65535, not {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise SettingsError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        if os.name != "nt":  # on Windows SO_REUSEADDR would let us steal a port in use
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)):
            raise PortInUse(f"port {port} on {host} is already in use: choose another with "
                            "--port, or --port 0 for any free one") from None
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def server_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):  # reachable locally through loopback
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class _ReadyServer(uvicorn.Server):
    """Prints the READY line once uvicorn serves the socket."""

    def __init__(self, config: uvicorn.Config, ready_line: str) -> None:
        super().__init__(config)
        self._ready_line = ready_line

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            sys.stdout.write(self._ready_line + "\n")
            sys.stdout.flush()


def watch_parent(pid: int, on_death: Callable[[], None],
                 interval_s: float = 0.5) -> threading.Event:
    """Call `on_death` once process `pid` has died (a zombie counts as dead). Returns an
    event that stops the watch when set."""
    try:
        parent = psutil.Process(pid)
    except (psutil.NoSuchProcess, ValueError):
        raise SettingsError(f"parent process {pid} does not exist") from None
    was_real_parent = os.getppid() == pid
    stop = threading.Event()

    def alive() -> bool:
        if was_real_parent and os.getppid() != pid:  # re-parented: ours has gone
            return False
        try:
            return parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def run() -> None:
        while not stop.wait(interval_s):
            if not alive():
                log.warning("parent process %d is gone; shutting down", pid)
                on_death()
                return

    threading.Thread(target=run, name="parent-watch", daemon=True).start()
    return stop


def _log_config(level: str) -> dict[str, Any]:
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"  # stdout has one line only
    config["loggers"]["runtime"] = {"handlers": ["default"], "level": level.upper(),
                                    "propagate": False}
    return config


def remembered_settings(path: Path) -> LoadSettings:
    """How a model loaded just in time is loaded: the settings the app remembers for the
    file, else the default context and KV types (`AppSettings.model_prefs`), with a vision
    model's projector beside it (`runtime.library.projectors.with_projector`)."""
    settings, _problem = SettingsStore().load_or_reset()
    return with_projector(settings.model_prefs(path).load)


def serve(options: ServeOptions,
          engine_factory: Callable[[], EngineAPI] | None = None) -> int:
    """Bind, load the start-up model if any, serve until stopped. Returns the exit code.
    Every model runs in an engine process of its own (`IsolatedEngine`, one per resident
    model: `runtime.server.models.router`); `engine_factory` is for tests (fake engines)."""
    check_exposure(options.host, options.api_key)
    sock = bind_socket(options.host, options.port)
    sockets = [sock]
    if options.ollama_port is not None:
        try:
            sockets.append(bind_socket(options.host, options.ollama_port))
        except BaseException:
            sock.close()
            raise
    make_engine = engine_factory or partial(IsolatedEngine, partial(build_engine,
                                                                     options.saved_kv))
    engine = make_engine()
    router = None
    try:
        engine.start()
        plan = None
        allowed: list[Path] = []
        if options.model is not None:
            settings = options.model
            print(f"loading {settings.model_path} ...", file=sys.stderr, flush=True)
            plan = plan_for(settings)
            loaded = engine.load(settings)
            print(f"loaded {loaded.name} ({loaded.quant}, context {loaded.n_ctx})",
                  file=sys.stderr, flush=True)
            allowed.append(settings.model_path)
            if settings.draft.model_path is not None:
                allowed.append(settings.draft.model_path)
        app = create_app(engine, api_key=options.api_key, models_dir=options.models_dir,
                         cors_origins=options.cors_origins, limits=options.limits,
                         allowed_models=allowed, allow_any_path=options.allow_any_path,
                         local_only=is_loopback(options.host), make_engine=make_engine,
                         settings_for=remembered_settings, router_options=options.router)
        app.state.outrider.plan = plan
        router = app.state.outrider.router
        config = uvicorn.Config(app, log_config=_log_config(options.log_level),
                                log_level=options.log_level,
                                access_log=options.log_level in ("debug", "trace"),
                                timeout_graceful_shutdown=3, lifespan="off")
        ready_info: dict[str, Any] = {"url": server_url(sock), "pid": os.getpid()}
        if len(sockets) > 1:
            ready_info["ollama_url"] = server_url(sockets[1])
        ready = f"{READY_PREFIX} {json.dumps(ready_info)}"
        server = _ReadyServer(config, ready)
        stop_watch = None
        if options.parent_pid is not None:
            stop_watch = watch_parent(options.parent_pid,
                                      lambda: setattr(server, "should_exit", True))
        try:
            server.run(sockets=sockets)
        finally:
            if stop_watch is not None:
                stop_watch.set()
        return 0
    finally:
        for each in sockets:
            each.close()
        if router is not None:
            router.close()  # the engines it started for other models
        (engine if router is None else router.primary).stop()
