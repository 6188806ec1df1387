"""No network: a Hub call fails within seconds, as `HubUnreachable`, whether the endpoint's
name does not resolve (a monkeypatched resolver) or its port refuses (a closed 127.0.0.1 port)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from runtime.errors import HubUnreachable
from runtime.hub.client import Hub, check_reachable


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unresolvable(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every name lookup fail as it does without a network; returns the names asked."""
    asked: list[str] = []

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


@pytest.mark.parametrize("call", ["search", "repo_details", "file_metadata"])
def test_a_name_that_does_not_resolve_fails_before_any_request(
        monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    asked = unresolvable(monkeypatch)
    hub = Hub(endpoint="https://hub.example")
    args = {"search": ("qwen",), "repo_details": ("org/repo",),
            "file_metadata": ("org/repo", "m.gguf")}[call]
    with pytest.raises(HubUnreachable, match=r"the name hub\.example does not resolve"):
        getattr(hub, call)(*args)
    assert asked == ["hub.example"]  # one lookup, no retries through huggingface_hub


def test_a_lookup_that_hangs_gives_up_after_the_resolve_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: release.wait(60))
    try:
        with pytest.raises(HubUnreachable, match=r"did not resolve within 0\.2 s"):
            Hub(endpoint="https://hub.example", resolve_timeout=0.2).search("qwen")
    finally:
        release.set()  # the lookup is still blocked: the answer came without it


def test_an_ip_endpoint_needs_no_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        asked = unresolvable(monkeypatch)
        check_reachable(f"http://127.0.0.1:{server.getsockname()[1]}")
    assert asked == []


@pytest.mark.parametrize("call", ["search", "repo_details"])
def test_a_refused_port_fails_without_huggingface_hubs_retries(
        monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    from huggingface_hub import hf_api
    from huggingface_hub.utils import _http

    tries: list[object] = []
    real = _http.get_session
    for module in (_http, hf_api):  # hf_api imported the name: patch its copy too
        monkeypatch.setattr(module, "get_session", lambda: tries.append(1) or real())
    hub = Hub(endpoint=f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(HubUnreachable, match="Connection refused"):
        getattr(hub, call)("qwen" if call == "search" else "org/repo")
    assert tries == []  # refused before huggingface_hub's first request (and its backoff)
