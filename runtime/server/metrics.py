"""The metrics snapshot of `/api/metrics`: devices, engine RSS, the engine's rolling rates.

Devices come from `runtime.planner.devices` and the plan from `runtime.planner.plan`; both are imported
when first needed, and the snapshot degrades (CPU memory from psutil, no plan) where they are
missing or fail, because a metrics panel going blank is better than a 500.

    >>> snapshot = metrics_snapshot(engine, plan=None)
    >>> sorted(snapshot)[:4]
    ['acceptance_rate', 'active_sequences', 'decode_tokens_per_s', 'devices']
"""

from __future__ import annotations

import importlib
import logging
import os
import platform
import time
from types import ModuleType
from typing import Any

import psutil

from runtime.engine.api import EngineAPI
from runtime.errors import OutriderError
from runtime.server.jsonable import to_jsonable
from runtime.settings.load import LoadSettings

log = logging.getLogger(__name__)


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def _cpu_only() -> list[dict[str, Any]]:
    memory = psutil.virtual_memory()
    return [{"id": "cpu", "name": platform.processor() or platform.machine() or "CPU",
             "kind": "cpu", "total_bytes": int(memory.total), "free_bytes": int(memory.available)}]


def _field(data: dict[str, Any], *names: str) -> Any:
    for name in names:
        if data.get(name) is not None:
            return data[name]
    return None


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
    devices_module = _optional_module("runtime.planner.devices")
    found: list[dict[str, Any]] = []
    if devices_module is not None:
        try:
            for device in devices_module.list_devices():
                data = to_jsonable(device)
                if not isinstance(data, dict):
                    continue
                found.append({
                    "id": str(_field(data, "id", "device_id", "name") or "?"),
                    "name": str(_field(data, "name", "description") or ""),
                    "kind": str(_field(data, "kind", "type", "backend") or "cpu"),
                    "total_bytes": int(_field(data, "total_bytes", "total") or 0),
                    "free_bytes": int(_field(data, "free_bytes", "free") or 0)})
        except Exception:  # NVML hiccups must not break the metrics stream
            log.exception("listing devices failed")
            found = []
    if not found:
        found = _cpu_only()
    for device in found:
        device["planned"] = _planned(plan, device["id"])
    return found


def engine_rss_bytes() -> int:
    devices_module = _optional_module("runtime.planner.devices")
    measure = getattr(devices_module, "engine_rss_bytes", None)
    if callable(measure):
        try:
            return int(measure())
        except Exception:
            log.exception("engine_rss_bytes failed")
    return int(psutil.Process(os.getpid()).memory_info().rss)


def metrics_snapshot(engine: EngineAPI, plan: Any = None) -> dict[str, Any]:
    """One `/api/metrics` answer (shape in docs/api.md)."""
    rates = to_jsonable(engine.metrics())
    snapshot: dict[str, Any] = {"time": time.time(), "devices": device_snapshot(plan),
                                "engine_rss_bytes": engine_rss_bytes()}
    snapshot.update(rates)
    return snapshot


def plan_for(settings: LoadSettings) -> Any:
    """The memory plan for `settings` (`MemoryPlan.to_dict()`), or None if none can be made:
    the plan is information, so a model the planner cannot read still loads."""
    planner = _optional_module("runtime.planner.plan")
    info_module = _optional_module("runtime.gguf.info")
    if planner is None or info_module is None:
        return None
    try:
        info = info_module.read_model_info(settings.model_path)
        draft = None
        if settings.draft.kind == "model" and settings.draft.model_path is not None:
            draft = info_module.read_model_info(settings.draft.model_path)
        return to_jsonable(planner.plan_memory(info, settings, draft=draft))
    except (OutriderError, OSError, ValueError) as exc:
        log.info("no memory plan for %s: %s", settings.model_path, exc)
        return None


def planned_gpu_layers(settings: LoadSettings) -> int | None:
    """The GPU layers the planner picks for settings.gpu_layers = auto (the engine's
    `plan_gpu_layers` collaborator); None when there is no plan."""
    plan = plan_for(settings)
    return int(plan["gpu_layers"]) if isinstance(plan, dict) and "gpu_layers" in plan else None
