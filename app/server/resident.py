"""The models the engine server holds at once (`GET /api/status`'s `resident`), as the Server
page lists them. Pure Python, no Qt.

The server's router keeps several models resident, each in its own engine process; the
default one is what `/api/load` loaded (the chat's model), the others were loaded just in time
for a request that named them and go after `ttl_s` idle seconds:

    >>> status = {"state": "ready", "resident": [
    ...     {"name": "tiny", "path": "/m/tiny.gguf", "state": "ready", "default": True,
    ...      "pid": 41, "ttl_s": None, "idle_s": 187.0, "active_sequences": 0,
    ...      "planned_bytes": 96_576_768, "rss_bytes": 180 << 20},
    ...     {"name": "qwen", "path": "/m/qwen.gguf", "state": "loading", "default": False,
    ...      "pid": None, "ttl_s": 300.0, "idle_s": 0.0, "active_sequences": 2,
    ...      "planned_bytes": None, "rss_bytes": None}]}
    >>> tiny, qwen = parse_resident(status)
    >>> tiny.planned_text, tiny.rss_text, tiny.idle_text, tiny.ttl_text
    ('92.1 MiB', '180 MiB', '3 min 07 s', 'never')
    >>> qwen.planned_text, qwen.idle_text, qwen.ttl_text
    ('–', 'busy: 2 requests', 'after 5 min 00 s idle')

A server that predates the router sends no `resident`: no models to list, no error.

    >>> parse_resident({"state": "ready", "model": {"name": "tiny"}})
    ()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.units import fmt_bytes, fmt_duration

NONE = "–"


@dataclass(frozen=True)
class ResidentModel:
    """One resident model as the server describes it (contract: docs/api.md, /api/status)."""

    name: str
    path: str = ""
    state: str = "ready"  # "loading" or "ready"
    default: bool = False
    pid: int | None = None
    ttl_s: float | None = None  # None: never unloaded for being idle
    idle_s: float = 0.0
    active_sequences: int = 0
    planned_bytes: int | None = None
    rss_bytes: int | None = None

    @property
    def planned_text(self) -> str:
        return fmt_bytes(self.planned_bytes) if self.planned_bytes is not None else NONE

    @property
    def rss_text(self) -> str:
        return fmt_bytes(self.rss_bytes) if self.rss_bytes is not None else NONE

    @property
    def idle_text(self) -> str:
        if self.active_sequences:
            n = self.active_sequences
            return f"busy: {n} request{'s' if n != 1 else ''}"
        return fmt_duration(self.idle_s)

    @property
    def ttl_text(self) -> str:
        return "never" if self.ttl_s is None else f"after {fmt_duration(self.ttl_s)} idle"


def parse_resident(status: Any) -> tuple[ResidentModel, ...]:
    """The resident models of a `/api/status` answer; () when it lists none (or predates the
    field). An entry without a name is left out: it could not be unloaded anyway."""
    entries = status.get("resident") if isinstance(status, dict) else None
    if not isinstance(entries, list):
        return ()
    return tuple(model for entry in entries if (model := _entry(entry)) is not None)


def _entry(entry: Any) -> ResidentModel | None:
    if not isinstance(entry, dict) or not entry.get("name"):
        return None
    return ResidentModel(
        name=str(entry["name"]), path=str(entry.get("path") or ""),
        state=str(entry.get("state") or "ready"), default=bool(entry.get("default")),
        pid=_int(entry.get("pid")), ttl_s=_float(entry.get("ttl_s")),
        idle_s=_float(entry.get("idle_s")) or 0.0,
        active_sequences=_int(entry.get("active_sequences")) or 0,
        planned_bytes=_int(entry.get("planned_bytes")), rss_bytes=_int(entry.get("rss_bytes")))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
