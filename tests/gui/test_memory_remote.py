"""The Live dock's Memory panel with a model split across a worker: the worker's device
(`remote`, kind "rpc", first in `/api/metrics`) stands beside this machine's with its planned
stack, no "used" bar and no curve, and a "free as of load" note; the network the split costs
per token comes from the loaded model's plan (`links`). Offscreen."""

from __future__ import annotations

from app.engine.wire import ServedModel, parse_metrics
from app.panels.dock import LivePanels
from app.panels.memory import MemoryPanel
from app.services.memory_terms import AS_OF_LOAD_TIP
from app.theme import LIGHT
from runtime.units import MIB, fmt_bytes

GIB = 1 << 30
WORKER = "127.0.0.1:50052"


def metrics(time: float, remote: bool = True) -> dict:
    """A snapshot as the server sends it (runtime/server/outrider/metrics.py): the worker's entry
    first, as of the load, then this machine's CPU."""
    cpu = {"id": "cpu", "name": "Test CPU", "kind": "cpu", "total_bytes": 64 * GIB,
           "free_bytes": 40 * GIB,
           "planned": {"weights": 30 * MIB, "kv": 8 * MIB, "compute": 4 * MIB, "overhead": 0}}
    worker = {"id": f"rpc:{WORKER}", "name": f"worker {WORKER}", "kind": "rpc",
              "total_bytes": 8 * GIB, "free_bytes": 6 * GIB, "remote": True, "as_of": "load",
              "planned": {"weights": 60 * MIB, "kv": 16 * MIB, "compute": 2 * MIB,
                          "overhead": 0}}
    return {"time": time, "devices": [worker, cpu] if remote else [cpu],
            "engine_rss_bytes": 300 * MIB}


def tick_labels(panel: MemoryPanel) -> list[str]:
    """The bars' names on the axis, as the panel gave them (pyqtgraph keeps `setTicks`'s)."""
    return [label for _x, label in panel.chart.getAxis("bottom")._tickLevels[0]]


def bar(panel: MemoryPanel, key: str) -> list[float]:
    return [float(h) for h in panel.bars[key].opts["height"]]


def test_the_workers_device_stands_first_planned_not_used(qtbot) -> None:
    panel = MemoryPanel(LIGHT)
    qtbot.addWidget(panel)
    snapshot = parse_metrics(metrics(1000.0))
    worker, cpu = snapshot.devices
    assert worker.remote and worker.as_of == "load" and not cpu.remote
    panel.update_metrics(snapshot)

    assert tick_labels(panel) == [WORKER, "Test CPU"]
    assert bar(panel, "weights") == [60.0, 30.0]
    assert bar(panel, "kv") == [16.0, 8.0]
    assert bar(panel, "used") == [0.0, 300.0]  # a worker's memory is not measured live
    assert panel.values["free"].text() == f"rpc:{WORKER} 6.00 GiB at load · cpu 40.0 GiB"
    assert panel.values["planned"].text() == fmt_bytes((60 + 16 + 2 + 30 + 8 + 4) * MIB)
    assert not panel.remote_note.isHidden()
    assert panel.remote_note.text() == f"worker {WORKER}: 6.00 GiB free as of load"
    assert panel.remote_note.toolTip() == AS_OF_LOAD_TIP
    tip = panel.chart.getPlotItem().toolTip().splitlines()
    assert tip[0] == f"worker {WORKER}: planned {fmt_bytes(78 * MIB)}, 6.00 GiB free as of load"
    panel.update_metrics(parse_metrics(metrics(1001.0)))
    assert set(panel.curves) == {"rss"}  # no curve for the worker: nothing live to draw


def test_the_network_per_token_comes_from_the_loaded_plan(qtbot) -> None:
    dock = LivePanels(LIGHT)
    qtbot.addWidget(dock)
    links = [{"device": f"rpc:{WORKER}", "bytes_per_token": 203_008}]
    dock.on_model(ServedModel("tiny", plan={"links": links, "summary": "Split: …"}))
    dock.on_metrics(parse_metrics(metrics(1000.0)))
    assert dock.memory.remote_note.text().splitlines() == [
        "network 198 KiB per token", f"worker {WORKER}: 6.00 GiB free as of load"]

    # Unloaded, then a model on this machine alone: nothing about workers is left.
    dock.on_model(None)
    dock.on_metrics(parse_metrics(metrics(1001.0, remote=False)))
    assert dock.memory.remote_note.isHidden() and dock.memory.remote_note.text() == ""
    assert tick_labels(dock.memory) == ["Test CPU"]
