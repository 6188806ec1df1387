"""Other machines' devices, lent over llama.cpp's RPC protocol (`outrider worker`, rpc-server):
what each worker offers, asked before anything is loaded.

    probe_workers(("127.0.0.1:50052", "127.0.0.1:50053"))     # two running workers
    # [WorkerInfo(endpoint='127.0.0.1:50052', version=(7, 0, 0),
    #             devices=(Device(id='rpc:127.0.0.1:50052', name='worker 127.0.0.1:50052',
    #                             kind='rpc', total_bytes=..., free_bytes=...,
    #                             unified=False),)), ...]

llama.cpp's RPC client aborts its process on anything unexpected (a refused connection, a
server of another protocol version, a reply of the wrong size), so every worker is first
asked here, in Python, with a timeout: a bad one is a one-line `WorkerError` naming it, and
the engine never meets it. The probe speaks the protocol's first three commands
(ggml-rpc.cpp): every message is `cmd (1 byte) | size (u64) | payload`, every answer
`size (u64) | payload`, little-endian:

    HELLO (14)             24 bytes of transport caps (zeros: plain TCP)
                           → major, minor, patch, pad, 24 bytes of caps
    DEVICE_COUNT (15)      nothing → u32
    GET_DEVICE_MEMORY (11) u32 device → u64 free, u64 total

A worker serves one client at a time (llama.cpp's server accepts the next connection when
the current one closes), so a worker already lending its devices to another engine does not
answer: that is "busy", said as such. The probe closes its connection before the engine
opens its own.

This module is plain sockets (no llama.cpp), so the app may use it too.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.errors import WorkerError
from runtime.planner.devices import Device, list_devices

PROTOCOL_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION of the llama.cpp this binding carries
PROTOCOL_MINOR = 0
PROBE_TIMEOUT_S = 3.0

CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE
MAX_DEVICES = 16


@dataclass(frozen=True)
class WorkerInfo:
    """A worker as it answered: its protocol version and its devices' memory, now."""

    endpoint: str  # "host:port"
    version: tuple[int, int, int]
    devices: tuple[Device, ...]


def worker_device_id(endpoint: str, index: int = 0) -> str:
    """A remote device's id in plans and metrics: "rpc:host:port", "#i" after the first.

        >>> worker_device_id("10.0.0.2:50052", 1)
        'rpc:10.0.0.2:50052#1'
    """
    return f"rpc:{endpoint}" + (f"#{index}" if index else "")


def worker_named_in(message: str) -> str | None:
    """The worker a `WorkerLost` / `WorkerError` message names ("worker HOST:PORT ..."), so a
    reader of the error (the app) can offer to reload without it.

        >>> worker_named_in("worker 10.0.0.2:50052 stopped answering (connection refused)")
        '10.0.0.2:50052'
    """
    match = re.search(r"\bworker (\S+:\d+)", message)
    return match.group(1) if match else None


def probe_workers(endpoints: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S) -> list[WorkerInfo]:
    """Ask every worker what it offers, in order; the first that cannot serve raises
    `WorkerError`. Two names for one address ("localhost:50052" and "127.0.0.1:50052") are
    refused: llama.cpp would count the worker's memory twice."""
    seen: dict[tuple[str, int], str] = {}
    for endpoint in endpoints:
        address = _resolve(endpoint)
        if address in seen:
            raise WorkerError(f"worker {endpoint} is the same machine and port as "
                              f"{seen[address]}: name each worker once")
        seen[address] = endpoint
    return [probe_worker(endpoint, timeout_s) for endpoint in endpoints]


def devices_with_workers(endpoints: Sequence[str]) -> list[Device]:
    """The workers' devices and this machine's, in llama.cpp's order: remote devices first
    (llama.cpp puts RPC servers at the front of the device list), then this machine's GPUs,
    the CPU last."""
    remote = [device for info in probe_workers(endpoints) for device in info.devices]
    return [*remote, *list_devices()]


def probe_worker(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> WorkerInfo:
    """One worker's version and devices (`WorkerError` if it cannot serve)."""
    host, port = _split(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except TimeoutError:
        raise WorkerError(f"worker {endpoint} did not answer within {timeout_s:g} s "
                          "(is the machine on, and the port open?)") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise WorkerError(f"worker {endpoint} cannot be reached ({reason.lower()}): start "
                          "`outrider worker` there, or check the address") from None
    with sock:
        try:
            version = _hello(sock, endpoint)
            count = _device_count(sock, endpoint)
            devices = tuple(_device(sock, endpoint, i) for i in range(count))
        except TimeoutError:
            raise WorkerError(f"worker {endpoint} accepted the connection but did not answer "
                              f"within {timeout_s:g} s: it is busy serving another engine, or "
                              "it is not an Outrider worker / llama.cpp rpc-server") from None
        except OSError as exc:
            raise WorkerError(f"worker {endpoint} closed the connection during the handshake "
                              f"({(exc.strerror or type(exc).__name__).lower()}): it is not an "
                              "Outrider worker / llama.cpp rpc-server") from None
    return WorkerInfo(endpoint, version, devices)


def _hello(sock: socket.socket, endpoint: str) -> tuple[int, int, int]:
    _send(sock, CMD_HELLO, bytes(CAPS_SIZE))
    reply = _answer(sock, endpoint, 4 + CAPS_SIZE, "the handshake")
    major, minor, patch = reply[0], reply[1], reply[2]
    if major != PROTOCOL_MAJOR or minor > PROTOCOL_MINOR:
        raise WorkerError(f"worker {endpoint} speaks RPC protocol {major}.{minor}.{patch}; this "
                          f"Outrider speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}: run the same "
                          "Outrider (or llama.cpp) version on both machines")
    return major, minor, patch


def _device_count(sock: socket.socket, endpoint: str) -> int:
    _send(sock, CMD_DEVICE_COUNT, b"")
    (count,) = struct.unpack("<I", _answer(sock, endpoint, 4, "the device count"))
    if not 1 <= count <= MAX_DEVICES:
        raise WorkerError(f"worker {endpoint} offers {count} devices: not a usable worker")
    return int(count)


def _device(sock: socket.socket, endpoint: str, index: int) -> Device:
    _send(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", index))
    free, total = struct.unpack("<QQ", _answer(sock, endpoint, 16, "its memory"))
    suffix = f" #{index}" if index else ""
    return Device(worker_device_id(endpoint, index), f"worker {endpoint}{suffix}", "rpc",
                  int(total), int(min(free, total)))


def _send(sock: socket.socket, cmd: int, payload: bytes) -> None:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)


def _answer(sock: socket.socket, endpoint: str, size: int, what: str) -> bytes:
    header = recv_exactly(sock, 8)
    (got,) = struct.unpack("<Q", header) if len(header) == 8 else (None,)
    if got != size:
        raise WorkerError(f"worker {endpoint} answered {what} with something that is not "
                          "llama.cpp's RPC protocol: it is not an Outrider worker / llama.cpp "
                          "rpc-server")
    body = recv_exactly(sock, size)
    if len(body) != size:
        raise WorkerError(f"worker {endpoint} closed the connection during {what}")
    return body


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """`size` bytes from `sock`, or fewer where the peer closed the connection first."""
    out = b""
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def _resolve(endpoint: str) -> tuple[str, int]:
    host, port = _split(endpoint)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise WorkerError(f"worker {endpoint}: no machine named {host!r} is known here") from None
    return str(infos[0][4][0]), port


def exposure_warning(host: str, port: int) -> str | None:
    """The warning for listening beyond loopback (None on loopback).

        >>> exposure_warning("127.0.0.1", 50052) is None
        True
    """
    if host == "localhost" or _is_loopback(host):
        return None
    return (f"warning: listening on {host}:{port}: llama.cpp's RPC protocol has no "
            "authentication or encryption, so anyone who can reach this port can use this "
            "machine's memory and run code on its devices. Use it only on a private network, "
            f"or keep --host 127.0.0.1 and tunnel: ssh -N -L {port}:127.0.0.1:{port} THIS_HOST")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
