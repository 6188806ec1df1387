"""The metrics snapshot of `/api/metrics`: devices, engine RSS, the engine's rolling rates.

Devices come from `runtime.planner.devices` and the plan from `runtime.planner.gpu_layers`;
the workers' devices (kind "rpc", `remote`) come first, from the plan.
The snapshot degrades (the CPU alone, no plan) where listing devices or planning fails,
because a metrics panel going blank is better than a 500.

    snapshot = metrics_snapshot(engine, plan=None)
    sorted(snapshot)[:4]   → ['acceptance_rate', 'active_sequences', 'decode_tokens_per_s', 'devices']
"""

from __future__ import annotations

import logging
import time
from typing import Any

from runtime.engine.api import EngineAPI
from runtime.planner.devices import Device, cpu_device, engine_rss_bytes, list_devices
from runtime.server.jsonable import to_jsonable

log = logging.getLogger(__name__)


def _planned(plan: Any, device_id: str) -> dict[str, int] | None:
    """This device's share of the plan (`runtime.planner.plan.MemoryPlan.to_dict()` shape)."""
    entries = plan.get("devices") if isinstance(plan, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == device_id:
            return {key: int(entry.get(key) or 0)
                    for key in ("weights", "kv", "compute", "overhead", "draft")}
    return None


def device_snapshot(plan: Any = None) -> list[dict[str, Any]]:
    """Every compute device with total and free memory now, and its planned share."""
    try:
        devices = list_devices()
    except Exception:  # NVML or ggml hiccups must not break the metrics stream
        log.exception("listing devices failed")
        devices = [cpu_device()]
    return [*_remote_entries(plan), *(_device_entry(device, plan) for device in devices)]


def _remote_entries(plan: Any) -> list[dict[str, Any]]:
    """The workers' devices of the loaded model's plan. A worker serves one client at a time
    and its client is the engine, so it cannot be asked again while the model is loaded:
    its memory is as it answered before the load (`"as_of": "load"`)."""
    entries = plan.get("devices") if isinstance(plan, dict) else None
    out = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("kind") == "rpc":
            device = Device(str(entry.get("id")), str(entry.get("name")), "rpc",
                            int(entry.get("total_bytes") or 0), int(entry.get("free_bytes") or 0))
            out.append({**_device_entry(device, plan), "remote": True, "as_of": "load"})
    return out


def _device_entry(device: Device, plan: Any) -> dict[str, Any]:
    return {"id": device.id, "name": device.name, "kind": device.kind,
            "total_bytes": device.total_bytes, "free_bytes": device.free_bytes,
            "planned": _planned(plan, device.id)}


def metrics_snapshot(engine: EngineAPI, plan: Any = None) -> dict[str, Any]:
    """One `/api/metrics` answer (shape in docs/api.md)."""
    rates = to_jsonable(engine.metrics())
    snapshot: dict[str, Any] = {"time": time.time(), "devices": device_snapshot(plan),
                                "engine_rss_bytes": engine_rss_bytes(getattr(engine, "pid", None))}
    snapshot.update(rates)
    return snapshot
