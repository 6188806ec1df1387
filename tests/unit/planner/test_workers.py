"""The worker probe against fake RPC servers on loopback: what a worker offers, and a one-line
`WorkerError` for each way a worker cannot serve — before llama.cpp's RPC client (which
aborts its process on any of them) ever meets it."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from runtime.errors import SettingsError, WorkerError
from runtime.planner.workers import (
    exposure_warning,
    probe_worker,
    probe_workers,
    worker_device_id,
    worker_named_in,
)
from runtime.settings.load import LoadSettings, worker_endpoint
from tests.fixtures.fake_rpc_worker import GIB, FakeRpcWorker


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """serve(handler) → "127.0.0.1:PORT" of a listener that hands each connection to it."""
    sockets: list[socket.socket] = []

    def start(handler: Callable[[socket.socket], None] | None) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        sockets.append(listener)

        def loop() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                sockets.append(conn)
                if handler is not None:
                    with conn, contextlib.suppress(OSError):
                        handler(conn)

        threading.Thread(target=loop, daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for sock in sockets:
        sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_worker_reports_its_version_and_each_device() -> None:
    with FakeRpcWorker(devices=((6 * GIB, 8 * GIB), (1 * GIB, 24 * GIB))) as worker:
        endpoint = worker.endpoint
        info = probe_worker(endpoint)
    assert info.version == (7, 0, 0)
    assert [(d.id, d.name, d.kind, d.free_bytes, d.total_bytes) for d in info.devices] == [
        (f"rpc:{endpoint}", f"worker {endpoint}", "rpc", 6 * GIB, 8 * GIB),
        (f"rpc:{endpoint}#1", f"worker {endpoint} #1", "rpc", 1 * GIB, 24 * GIB)]
    assert all(d.is_gpu for d in info.devices)  # llama.cpp offloads to them like to a GPU


def test_workers_are_probed_in_order() -> None:
    with FakeRpcWorker(1 * GIB, 2 * GIB) as a, FakeRpcWorker(3 * GIB, 4 * GIB) as b:
        infos = probe_workers((a.endpoint, b.endpoint))
    assert [i.devices[0].free_bytes for i in infos] == [1 * GIB, 3 * GIB]


def test_a_port_nobody_listens_on_is_unreachable() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(WorkerError, match=rf"^worker {endpoint} cannot be reached \(connection "
                                          r"refused\): start `outrider worker` there"):
        probe_worker(endpoint)


def test_a_server_of_another_protocol_is_refused(serve: Callable[..., str]) -> None:
    endpoint = serve(lambda c: c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    with pytest.raises(WorkerError, match=re.escape("is not an Outrider worker / llama.cpp rpc-server")):
        probe_worker(endpoint)


def test_a_server_that_hangs_up_is_not_a_worker(serve: Callable[..., str]) -> None:
    endpoint = serve(lambda c: None)  # accepts and closes at once
    with pytest.raises(WorkerError, match="not an Outrider worker"):
        probe_worker(endpoint)


def test_an_older_protocol_version_names_both_versions() -> None:
    with FakeRpcWorker(version=(6, 1, 0)) as worker, \
            pytest.raises(WorkerError, match=r"speaks RPC protocol 6\.1\.0; this Outrider speaks "
                                             r"7\.0: run the same Outrider"):
        probe_worker(worker.endpoint)


def test_a_newer_minor_version_is_refused_too() -> None:
    with FakeRpcWorker(version=(7, 3, 0)) as worker, pytest.raises(WorkerError, match=r"7\.3\.0"):
        probe_worker(worker.endpoint)


def test_a_worker_that_never_answers_is_busy_or_not_a_worker(serve: Callable[..., str]) -> None:
    held = threading.Event()
    endpoint = serve(lambda c: held.wait(5))  # accepted, never answered: serving another client
    try:
        with pytest.raises(WorkerError, match=re.escape("did not answer within 0.3 s: it is busy "
                                                        "serving another engine")):
            probe_worker(endpoint, timeout_s=0.3)
    finally:
        held.set()


def test_one_worker_under_two_names_is_refused_before_any_connection() -> None:
    port = free_port()  # nothing listens: the duplicate is found first
    with pytest.raises(WorkerError, match=f"worker localhost:{port} is the same machine and port "
                                          f"as 127.0.0.1:{port}"):
        probe_workers((f"127.0.0.1:{port}", f"localhost:{port}"))


def test_an_unknown_host_name_is_said_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_host(*_: object, **__: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(WorkerError, match=re.escape("no machine named 'nowhere.invalid' is known")):
        probe_workers(("nowhere.invalid:50052",))


def test_a_worker_error_is_a_settings_error() -> None:
    assert issubclass(WorkerError, SettingsError)  # a 400 before loading, like other bad settings


def test_the_worker_is_found_in_its_messages() -> None:
    assert worker_named_in("worker 10.0.0.2:50052 stopped answering (connection refused), "
                           "and the model x was unloaded") == "10.0.0.2:50052"
    assert worker_named_in("the engine process of x stopped (signal 9, SIGKILL)") is None
    assert worker_device_id("box:1", 0) == "rpc:box:1"


@pytest.mark.parametrize(("text", "endpoint"), [
    ("10.0.0.2:7000", "10.0.0.2:7000"),
    (" Box.Local ", "box.local:50052"),
    ("gpu-box:50052", "gpu-box:50052"),
])
def test_worker_addresses_are_normalised(text: str, endpoint: str) -> None:
    assert worker_endpoint(text) == endpoint


@pytest.mark.parametrize(("text", "message"), [
    ("", "a worker is host:port"),
    ("10.0.0.2:", "the port must be a number 1 to 65535"),
    ("10.0.0.2:0", "the port must be a number 1 to 65535"),
    ("10.0.0.2:99999", "the port must be a number 1 to 65535"),
    ("[::1]:50052", "a worker is host:port"),
    ("::1", "a worker is host:port"),
    ("http://box:50052", "a worker is host:port"),
    (50052, "a worker is host:port"),
])
def test_bad_worker_addresses_are_one_line_errors(text: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        worker_endpoint(text)


def test_load_settings_normalise_and_refuse_a_worker_named_twice(tmp_path: object) -> None:
    settings = LoadSettings.from_dict({"model_path": "m.gguf", "workers": ["Box:7000", "b"]})
    assert settings.workers == ("box:7000", "b:50052")
    assert LoadSettings.from_dict(settings.to_dict()).workers == settings.workers
    with pytest.raises(SettingsError, match="worker box:50052 is named twice"):
        LoadSettings.from_dict({"model_path": "m.gguf", "workers": ["box", "BOX:50052"]})
    with pytest.raises(SettingsError, match="workers must be a list"):
        LoadSettings.from_dict({"model_path": "m.gguf", "workers": "box:1"})


def test_listening_beyond_loopback_is_warned_about() -> None:
    assert exposure_warning("127.0.0.1", 50052) is None
    assert exposure_warning("localhost", 50052) is None
    warning = exposure_warning("0.0.0.0", 50052)
    assert warning is not None
    assert "no authentication or encryption" in warning
    assert "ssh -N -L 50052:127.0.0.1:50052" in warning
