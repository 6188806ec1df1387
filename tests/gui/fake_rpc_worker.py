"""A stand-in for a machine lending its devices (`outrider worker`, llama.cpp's rpc-server):
it answers the first three commands of llama.cpp's RPC protocol, which is all the app's
probe asks (runtime/planner/workers.py), on one thread that the test stops.

    with FakeRpcWorker(free=6 << 30, total=8 << 30) as worker:
        worker.endpoint                 # "127.0.0.1:PORT"
        worker.connections              # how many times it was asked
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

from runtime.planner.workers import CAPS_SIZE, CMD_DEVICE_COUNT, CMD_GET_DEVICE_MEMORY, CMD_HELLO

GIB = 1 << 30


def refused_endpoint() -> str:
    """A loopback address where nothing listens (a port just freed): connection refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


class FakeRpcWorker:
    def __init__(self, free: int = 6 * GIB, total: int = 8 * GIB,
                 version: tuple[int, int, int] = (7, 0, 0)) -> None:
        self.free, self.total, self.version = free, total, version
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-rpc-worker", daemon=True)
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> FakeRpcWorker:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:  # one client at a time, as llama.cpp's server
                conn.settimeout(5)
                with contextlib.suppress(OSError):  # the client hung up: the next one
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        while True:
            head = _recv(conn, 9)
            if len(head) < 9:
                return
            cmd, size = head[0], struct.unpack("<Q", head[1:])[0]
            payload = _recv(conn, size)
            if cmd == CMD_HELLO and len(payload) == CAPS_SIZE:
                _reply(conn, bytes([*self.version, 0]) + bytes(CAPS_SIZE))
            elif cmd == CMD_DEVICE_COUNT:
                _reply(conn, struct.pack("<I", 1))
            elif cmd == CMD_GET_DEVICE_MEMORY:
                _reply(conn, struct.pack("<QQ", self.free, self.total))
            else:
                return


def _recv(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _reply(conn: socket.socket, payload: bytes) -> None:
    conn.sendall(struct.pack("<Q", len(payload)) + payload)
