"""Tests never leave this machine: a connection to anything but loopback fails at once.

Installed by tests/conftest.py for the whole run. A test that reaches for the real Hub (or any
other host) gets `OSError: tests never leave this machine: ...` instead of whatever the
network where it runs happens to do — refuse at once here, stall for seconds or minutes on
another machine. Host names other than localhost are refused before any DNS lookup.

    >>> install()
    >>> socket.create_connection(("huggingface.co", 443))
    Traceback (most recent call last):
    OSError: [Errno 101] tests never leave this machine: huggingface.co
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Any

_LOCAL_NAMES = {None, "", "localhost", "localhost.localdomain"}
_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _refuse(what: object) -> OSError:
    return OSError(errno.ENETUNREACH, f"tests never leave this machine: {what}")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _check_host(host: Any) -> None:
    if isinstance(host, bytes):
        host = host.decode()
    if host in _LOCAL_NAMES or host == "0.0.0.0" or host == "::":  # binds and wildcards
        return
    if not _is_loopback(str(host)):
        raise _refuse(host)


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    _check_host(host)
    return _real_getaddrinfo(host, *args, **kwargs)


def _check_address(sock: socket.socket, address: Any) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(str(address[0])):
        raise _refuse(address[0])


def _connect(self: socket.socket, address: Any) -> None:
    _check_address(self, address)
    _real_connect(self, address)


def _connect_ex(self: socket.socket, address: Any) -> int:
    _check_address(self, address)
    return _real_connect_ex(self, address)


def install() -> None:
    socket.getaddrinfo = _getaddrinfo  # type: ignore[assignment]
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]
